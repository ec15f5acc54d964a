// Private support for the generated ops_<table>.cpp: key-set computation, boxing helpers, and the
// pieces of structured, view and composite kernels that do not depend on the op.
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "kiln/dispatcher.h"
#include "kiln/generator.h"
#include "kiln/profiler.h"
#include "kiln/tensor.h"
#include "profiler_flags.h"

namespace kiln::detail {

inline DispatchKeySet key_of(const Tensor& t, const char* op, const char* arg) {
  if (__builtin_expect(!t.defined(), 0))
    KILN_FAIL(Value, op, ": argument '", arg, "' is an undefined tensor");
  return t.key_set();
}
inline DispatchKeySet key_of_opt(const std::optional<Tensor>& t) {
  return (t && t->defined()) ? t->key_set() : DispatchKeySet();
}
DispatchKeySet key_of_list(TensorList ts);
DispatchKeySet device_key(const std::optional<Device>& d);

template <int I, typename F>
decltype(auto) unbox_arg(const Stack& s, size_t n, F f) {
  return f(s[s.size() - n + I]);
}
template <typename T>
std::optional<T> unbox_opt(const IValue& v) {
  if (v.is_none()) return std::nullopt;
  if constexpr (std::is_same_v<T, Scalar>) return v.to_scalar();
  else if constexpr (std::is_same_v<T, int64_t>) return v.to_int();
  else if constexpr (std::is_same_v<T, double>) return v.to_double();
  else return v.get<T>();
}
inline std::optional<Tensor> unbox_opt_tensor(const IValue& v) {
  if (v.is_none()) return std::nullopt;
  return v.to_tensor();
}
inline OptionalIntArrayRef unbox_opt_intlist(const IValue& v) {
  if (v.is_none()) return std::nullopt;
  return IntArrayRef(v.get<std::vector<int64_t>>("int[]"));
}
inline std::optional<std::string_view> unbox_opt_str(const IValue& v) {
  if (v.is_none()) return std::nullopt;
  return std::string_view(v.get<std::string>("str"));
}
inline void drop_args(Stack& s, size_t n) { s.erase(s.end() - n, s.end()); }

template <typename T>
T pop_result(Stack& s, const char* op);
template <>
inline Tensor pop_result<Tensor>(Stack& s, const char* op) {
  KILN_ASSERT(!s.empty(), op, ": boxed kernel returned nothing");
  Tensor t = s.back().to_tensor();
  s.pop_back();
  return t;
}
template <>
inline std::vector<Tensor> pop_result<std::vector<Tensor>>(Stack& s, const char* op) {
  KILN_ASSERT(!s.empty(), op, ": boxed kernel returned nothing");
  std::vector<Tensor> t = s.back().to_tensor_list();
  s.pop_back();
  return t;
}
template <>
inline std::tuple<Tensor, Tensor> pop_result<std::tuple<Tensor, Tensor>>(Stack& s, const char* op) {
  KILN_ASSERT(s.size() >= 2, op, ": boxed kernel returned too few values");
  std::tuple<Tensor, Tensor> r{s[s.size() - 2].to_tensor(), s.back().to_tensor()};
  s.resize(s.size() - 2);
  return r;
}
template <>
inline std::tuple<Tensor, Tensor, Tensor> pop_result<std::tuple<Tensor, Tensor, Tensor>>(
    Stack& s, const char* op) {
  KILN_ASSERT(s.size() >= 3, op, ": boxed kernel returned too few values");
  std::tuple<Tensor, Tensor, Tensor> r{s[s.size() - 3].to_tensor(), s[s.size() - 2].to_tensor(),
                                       s.back().to_tensor()};
  s.resize(s.size() - 3);
  return r;
}
template <>
inline void pop_result<void>(Stack&, const char*) {}

inline std::vector<TensorSpec> as_spec_list(TensorSpec s) { return {std::move(s)}; }
inline std::vector<TensorSpec> as_spec_list(std::vector<TensorSpec> s) { return s; }

// In-place: the result must have self's shape and be castable to self's dtype.
TensorSpec inplace_spec(const char* op, const Tensor& self, const TensorSpec& spec);
// out=: checks device and dtype castability, resizes `out` to the spec's shape if needed.
void prepare_out(const char* op, const Tensor& out, const TensorSpec& spec);
// The tensor a structured kernel writes into: `dst` itself when its dtype and layout fit the
// spec, else a fresh temporary that finish_out copies back.
Tensor out_target(const Tensor& dst, const TensorSpec& spec);
void finish_out(const Tensor& dst, const Tensor& tmp);

// A view of `base` with the geometry of `spec` (shares storage and version counter).
Tensor make_view(const Tensor& base, const TensorSpec& spec);
std::vector<Tensor> make_views(const Tensor& base, const std::vector<TensorSpec>& specs);

// The results of a profiled call (See Note [Profiler hook] in kiln/profiler.h).
inline void profile_outputs(profiler::detail::OpScope& s, const Tensor& t) { s.output(t); }
inline void profile_outputs(profiler::detail::OpScope& s, const std::vector<Tensor>& ts) {
  s.output(ts);
}
template <typename... T>
void profile_outputs(profiler::detail::OpScope& s, const std::tuple<T...>& ts) {
  std::apply([&](const auto&... t) { (profile_outputs(s, t), ...); }, ts);
}

// ops::X::call's path while the profiler records (See Note [Profiler hook] in kiln/profiler.h):
// out of line and cold, so the call's hot path keeps only the recording_ops() test.
template <typename R, typename F, typename... A>
[[gnu::noinline, gnu::cold]] R profiled_call(const OperatorHandle& op, F&& f, const A&... args) {
  profiler::detail::OpScope scope(op);
  if constexpr (std::is_void_v<R>) {
    f();
    if (!scope.begin_commit()) return;
    (scope.input(args), ...);
    scope.end_commit();
  } else {
    R r = f();
    if (!scope.begin_commit()) return r;
    (scope.input(args), ...);
    profile_outputs(scope, r);
    scope.end_commit();
    return r;
  }
}

int register_view_kernel(OperatorHandle& op, void* fn);
int register_composite(OperatorHandle& op, void* fn);
std::vector<OperatorHandle*> all_op_handles();

}  // namespace kiln::detail
