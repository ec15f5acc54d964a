#include "kiln/dispatcher.h"

#include <sstream>
#include <string>
#include <unordered_map>

#include "kiln/profiler.h"
#include "op_support.h"

namespace kiln {

Dispatcher& Dispatcher::get() {
  static Dispatcher d;
  return d;
}

const std::vector<OperatorHandle*>& Dispatcher::ops() const {
  static const std::vector<OperatorHandle*> all = detail::all_op_handles();
  return all;
}

OperatorHandle* Dispatcher::find(std::string_view name) const {
  static const auto by_name = [this] {
    std::unordered_map<std::string, OperatorHandle*> m;
    for (OperatorHandle* op : ops()) m.emplace(op->name(), op);
    return m;
  }();
  auto it = by_name.find(std::string(name));
  return it == by_name.end() ? nullptr : it->second;
}

OperatorHandle& Dispatcher::find_or_throw(std::string_view name) const {
  OperatorHandle* op = find(name);
  KILN_CHECK(op != nullptr, Value, "unknown op '", name, "' (not in the op table)");
  return *op;
}

void Dispatcher::register_kernel(OperatorHandle& op, DispatchKey k, void* unboxed,
                                 BoxedKernel boxed) {
  op.kernels_[static_cast<int>(k)] = KernelFunction{unboxed, boxed, false};
  refresh(op);
}

void Dispatcher::register_fallback(DispatchKey k, BoxedKernel fallback) {
  fallbacks_[static_cast<int>(k)] = fallback;
  for (OperatorHandle* op : ops()) refresh(*op);
}

void Dispatcher::refresh(OperatorHandle& op) {
  uint32_t mask = 0;
  for (int k = 0; k < kNumDispatchKeys; ++k) {
    KernelFunction& kf = op.kernels_[k];
    if (kf.is_fallback || (!kf.unboxed && !kf.boxed)) {
      kf = fallbacks_[k] ? KernelFunction{nullptr, fallbacks_[k], true} : KernelFunction{};
    }
    if (kf.unboxed || kf.boxed) mask |= 1u << k;
  }
  op.mask_ = DispatchKeySet(mask);
}

void OperatorHandle::no_kernel(DispatchKeySet ks) const {
  std::ostringstream have;
  bool any = false;
  for (int k = 0; k < kNumDispatchKeys; ++k) {
    if (!mask_.has(static_cast<DispatchKey>(k))) continue;
    have << (any ? ", " : "") << dispatch_key_name(static_cast<DispatchKey>(k));
    any = true;
  }
  KILN_FAIL(NotImplemented, name(), ": no kernel for dispatch keys ", ks, " (this op has kernels for ",
            any ? have.str() : std::string("nothing"), ")");
}

static DispatchKeySet boxed_key_set(const OperatorHandle& op, const Stack& stack) {
  const OpInfo& info = op.info();
  KILN_CHECK(stack.size() >= static_cast<size_t>(info.num_args), Value, op.name(), ": expected ",
             info.num_args, " arguments, got ", stack.size());
  DispatchKeySet ks;
  std::optional<Device> device;
  for (int i = 0; i < info.num_args; ++i) {
    const IValue& v = stack[stack.size() - info.num_args + i];
    if (v.is_tensor()) {
      ks = ks | detail::key_of(v.to_tensor(), op.name(), info.args[i].name);
    } else if (v.is_tensor_list()) {
      ks = ks | detail::key_of_list(v.to_tensor_list());
    } else if (v.is<Device>()) {
      device = v.get<Device>();
    }
  }
  if (ks.empty()) ks = detail::device_key(device);
  const LocalDispatchKeySet& tls = tls_local_dispatch_key_set();
  return (ks | tls.included) - tls.excluded;
}

// call_boxed while the profiler records: `run` runs the op on `stack`, whose last num_args
// entries are its arguments (See Note [Profiler hook] in kiln/profiler.h).
template <typename F>
[[gnu::noinline, gnu::cold]] static void call_boxed_profiled(const OperatorHandle& op, Stack& stack,
                                                             F&& run) {
  const int n = op.info().num_args;
  Stack args(stack.end() - n, stack.end());
  size_t base = stack.size() - n;
  profiler::detail::OpScope scope(op);
  run();
  if (!scope.begin_commit()) return;
  for (const IValue& v : args) {
    if (v.is_tensor())
      scope.input(v.to_tensor());
    else if (v.is_tensor_list())
      scope.input(v.to_tensor_list());
    else if (v.is_none())
      scope.input(std::optional<Tensor>());
    else
      scope.input(v);
  }
  for (size_t i = base; i < stack.size(); ++i) {
    if (stack[i].is_tensor())
      scope.output(stack[i].to_tensor());
    else if (stack[i].is_tensor_list())
      scope.output(stack[i].to_tensor_list());
  }
  scope.end_commit();
}

void OperatorHandle::call_boxed(Stack& stack) const {
  DispatchKeySet ks = boxed_key_set(*this, stack);
  if (__builtin_expect(profiler::detail::recording_ops(), 0))
    return call_boxed_profiled(*this, stack, [&] { boxed_entry_(*this, ks, stack); });
  boxed_entry_(*this, ks, stack);
}

void OperatorHandle::call_boxed(DispatchKeySet ks, Stack& stack) const {
  if (__builtin_expect(profiler::detail::recording_ops(), 0))
    return call_boxed_profiled(*this, stack, [&] { redispatch_boxed(ks, stack); });
  redispatch_boxed(ks, stack);
}

void OperatorHandle::redispatch_boxed(DispatchKeySet ks, Stack& stack) const {
  const KernelFunction& kf = kernel(select(ks));
  if (kf.boxed) {
    kf.boxed(*this, ks, stack);
  } else {
    unbox_and_call_(kf.unboxed, stack);
  }
}

Library& Library::boxed(std::string_view op_name, BoxedKernel fn) {
  Dispatcher::get().register_kernel(Dispatcher::get().find_or_throw(op_name), key_, nullptr, fn);
  return *this;
}

}  // namespace kiln
