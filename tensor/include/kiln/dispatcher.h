// kiln/dispatcher.h: one kernel slot per dispatch key for every op of the op table.
//
//   // in a kernel library (static registration, see KILN_LIBRARY):
//   KILN_LIBRARY(CPU, m) { m.impl<kiln::ops::mm>(mm_cpu); m.structured<kiln::ops::add>(add_cpu); }
//   KILN_LIBRARY(Meta, m) { m.fallback(&meta_fallback); }     // a boxed fallback for every op
//   kiln::OperatorHandle* op = kiln::Dispatcher::get().find("add");   // boxed callers
//   kiln::Stack s{a, b, kiln::Scalar(1)};  op->call_boxed(s);
//
// Note [Dispatch]: a call computes the key set of its tensor arguments, adds the thread-local
// included keys, removes the excluded ones, masks it with the keys this op has a kernel or a
// fallback for, and runs the kernel of the highest key. The mask makes fallthrough free: keys
// with nothing registered (most of them today) are simply absent from it. A kernel that wants
// the layer below calls `ops::X::redispatch(ks & DispatchKeySet::below(MyKey), ...)`.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/dispatch_key.h"
#include "kiln/generated/op_enums.h"
#include "kiln/ivalue.h"

namespace kiln {

class OperatorHandle;
using BoxedKernel = void (*)(const OperatorHandle& op, DispatchKeySet ks, Stack& stack);

// Output geometry computed by a meta function (Note [Meta functions] in meta.h).
struct TensorSpec {
  DimVector sizes;
  DimVector strides;
  int64_t offset = 0;
  ScalarType dtype = kFloat32;
  Device device = kCPU;
  int alias_of = -1;  // index of the argument this output aliases (views, in-place, out=)
  bool wrapped_number = false;  // a Python number as a 0-d tensor: it takes no part in promotion
};
using MetaFn = std::vector<TensorSpec> (*)(const Stack& args);

// An argument's schema type (tensor/ops/optable.py's CPP_TYPES lists them).
enum class ArgType : uint8_t {
  Tensor, OptionalTensor, TensorList, Scalar, OptionalScalar, Int, OptionalInt, IntList,
  OptionalIntList, Float, OptionalFloat, Bool, ScalarType, OptionalScalarType, OptionalDevice,
  Str, OptionalStr, OptionalGenerator
};

// What an argument means to generic code, from its name and type (Note [Argument roles] in
// tensor/ops/optable.py), so that vmap's rules and autocast never compare argument names.
enum class ArgRole : uint8_t {
  None,
  Dim,      // int, int?, int[], int[]? named dim, dim0, dim1, dim2, start_dim, end_dim
  Size,     // int[] size / shape: a whole shape
  Dims,     // int[] dims: a permutation
  Sizes,    // int[] sizes / split_sizes: sizes along one dim
  InputSize,  // int[] self_size / input_size: the shape of a backward row's forward input
  Keepdim,  // bool keepdim
  Dtype,    // ScalarType(?) dtype: the output dtype
  Weight,   // Tensor(?) weight, bias: parameters shared by every row of the data
  Bias,
  Mask,     // Tensor condition / mask: takes no part in type promotion
};

constexpr bool is_tensor_type(ArgType t) {
  return t == ArgType::Tensor || t == ArgType::OptionalTensor || t == ArgType::TensorList;
}

struct ArgInfo {
  const char* name;
  const char* type;     // schema type: "Tensor", "int[]?", ... (for messages)
  const char* default_value;  // nullptr when required
  bool kwarg_only;
  ArgType arg_type;
  ArgRole role;
  bool is_mutable;      // Tensor(a!): written by the op (in-place self, out=, optimizer lists)
};

// One row of the op table as the runtime sees it (generated). The typed fields come from
// rules.toml (kiln/generated/op_enums.h); the strings are for messages and autograd/.
struct OpInfo {
  const char* name;       // "add", "add_", "add.out"
  const char* schema;     // full schema string
  OpKind kind;
  OpTags tags;
  const char* derivative; // as written in the table (consumed by autograd/)
  const char* jvp;
  BatchingRule batching;
  AutocastPolicy autocast;
  ShardingRule sharding;
  const char* decomposition;
  OpDTypes dtypes;        // the input dtypes the row claims, per backend
  const ArgInfo* args;
  int num_args;
  int num_returns;
  bool returns_list;
  bool is_random;
  bool is_inplace;  // mutates its first argument
  bool is_out;      // writes into its `out` argument
  bool is_view;
  // The inplace and out= variants of a structured row: the row's functional op (vmap runs an
  // out= variant as it, then copies); nullptr for every other op.
  const OperatorHandle* functional;
};

struct KernelFunction {
  void* unboxed = nullptr;     // the op's typed function pointer (ops::X::Fn*)
  BoxedKernel boxed = nullptr;
  bool is_fallback = false;
};

class OperatorHandle {
 public:
  constexpr OperatorHandle(const OpInfo* info, void (*unbox_and_call)(void*, Stack&),
                           void (*boxed_entry)(const OperatorHandle&, DispatchKeySet, Stack&),
                           MetaFn meta)
      : info_(info), unbox_and_call_(unbox_and_call), boxed_entry_(boxed_entry), meta_(meta) {}

  const OpInfo& info() const { return *info_; }
  const char* name() const { return info_->name; }
  DispatchKeySet mask() const { return mask_; }
  const KernelFunction& kernel(DispatchKey k) const { return kernels_[static_cast<int>(k)]; }
  bool has_kernel(DispatchKey k) const { return kernel(k).unboxed || kernel(k).boxed; }

  // Boxed call from the top: computes the key set from the Tensor arguments on the stack.
  void call_boxed(Stack& stack) const;
  // Boxed call with an explicit key set (boxed kernels redispatching below themselves).
  void redispatch_boxed(DispatchKeySet ks, Stack& stack) const;
  // A call from the top whose key set the caller computed once (a compiled program's replay):
  // as redispatch_boxed, but an event of its own for the profiler, as call_boxed is.
  void call_boxed(DispatchKeySet ks, Stack& stack) const;
  // Runs the meta function over boxed arguments: output specs, no data touched.
  std::vector<TensorSpec> run_meta(const Stack& args) const { return meta_(args); }

  // The key to run for `ks`, or a NotImplemented error naming the op and the keys.
  DispatchKey select(DispatchKeySet ks) const {
    DispatchKeySet eff = ks & mask_;
    if (__builtin_expect(eff.empty(), 0)) no_kernel(ks);
    return eff.highest();
  }
  [[noreturn]] void no_kernel(DispatchKeySet ks) const;

 private:
  friend class Dispatcher;
  const OpInfo* info_;
  void (*unbox_and_call_)(void*, Stack&);
  void (*boxed_entry_)(const OperatorHandle&, DispatchKeySet, Stack&);
  MetaFn meta_;
  KernelFunction kernels_[kNumDispatchKeys] = {};
  DispatchKeySet mask_;
};

class Dispatcher {
 public:
  static Dispatcher& get();
  // Every op of the table (generated list).
  const std::vector<OperatorHandle*>& ops() const;
  OperatorHandle* find(std::string_view name) const;  // nullptr if absent
  OperatorHandle& find_or_throw(std::string_view name) const;

  void register_kernel(OperatorHandle& op, DispatchKey k, void* unboxed, BoxedKernel boxed);
  // A boxed kernel used for every op that has no kernel of its own at `k`.
  void register_fallback(DispatchKey k, BoxedKernel fallback);
  BoxedKernel fallback(DispatchKey k) const { return fallbacks_[static_cast<int>(k)]; }

 private:
  Dispatcher() = default;
  void refresh(OperatorHandle& op);
  BoxedKernel fallbacks_[kNumDispatchKeys] = {};
};

// Static registration into one dispatch key. See KILN_LIBRARY.
class Library {
 public:
  explicit Library(DispatchKey key) : key_(key) {}
  template <typename Op>
  Library& impl(typename Op::Fn* fn) {
    Dispatcher::get().register_kernel(Op::handle(), key_, reinterpret_cast<void*>(fn), nullptr);
    return *this;
  }
  // Registers the functional, in-place and out= variants of a structured op from one kernel
  // that writes into an already-allocated output.
  template <typename Op>
  Library& structured(typename Op::StructuredFn* fn) {
    Op::register_structured(key_, fn);
    return *this;
  }
  template <typename Op>
  Library& boxed(BoxedKernel fn) {
    Dispatcher::get().register_kernel(Op::handle(), key_, nullptr, fn);
    return *this;
  }
  Library& boxed(std::string_view op_name, BoxedKernel fn);
  Library& fallback(BoxedKernel fn) {
    Dispatcher::get().register_fallback(key_, fn);
    return *this;
  }
  DispatchKey key() const { return key_; }

 private:
  DispatchKey key_;
};

#define KILN_CONCAT_(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_(a, b)
// KILN_LIBRARY(CPU, m) { m.impl<ops::mm>(mm_cpu); }  — runs at load time of the library.
#define KILN_LIBRARY(KEY, m) KILN_LIBRARY_(KEY, m, KILN_CONCAT(kiln_library_, __COUNTER__))
#define KILN_LIBRARY_(KEY, m, uid)                                                      \
  static void KILN_CONCAT(uid, _init)(::kiln::Library&);                                \
  static const int KILN_CONCAT(uid, _reg) = [] {                                        \
    ::kiln::Library lib(::kiln::DispatchKey::KEY);                                      \
    KILN_CONCAT(uid, _init)(lib);                                                       \
    return 0;                                                                           \
  }();                                                                                  \
  static void KILN_CONCAT(uid, _init)(::kiln::Library & m)

}  // namespace kiln
