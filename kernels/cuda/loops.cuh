// kernels/cuda/loops.cuh: elementwise kernel launches over contiguous or strided/broadcast
// operands, and helpers that make a new unary or binary CUDA op a few lines.
//
//   struct MulOp { template <typename C> KILN_HD C operator()(C a, C b) const { return a * b; } };
//   void mul_cuda(const Tensor& out, const Tensor& a, const Tensor& b) {
//     binary_op<TypeSet::All>("mul", out, a, b, MulOp{});      // casts, broadcasts, CPU scalars
//   }
//   binary_op_in<TypeSet::All, bool>("lt", result_type({a, b}), out, a, b, LtOp{});  // bool out
//   unary_op<TypeSet::Float>("exp", out, x, [] __device__(auto v) { return ::exp(v); });
//
// Note [CUDA loops]: operands are described as in kernels/cpu/loops.h (StridedIter): the
// output's shape, and per operand the byte strides over it (0 where an input broadcasts), with
// size-1 dims dropped and chaining dims merged. When every operand is contiguous and unbroadcast
// the kernel takes the vectorized path: a grid-stride loop loading 16 bytes per operand per step
// (when all pointers are aligned to that), then a scalar tail. Otherwise each thread turns its
// linear index into per-operand byte offsets over at most kMaxDims (8) coalesced dims. The
// functor sees values in op math type (float for float16/bfloat16, the type itself otherwise)
// and its result is cast to the output type. Everything runs on the current stream of the
// output's device (Note [Current stream] in kiln/cuda/stream.h).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <type_traits>
#include <utility>

#include "kiln/cuda/device.h"
#include "kiln/cuda/stream.h"
#include "kiln/generated/dtype_sets.h"
#include "kiln/generated/ops.h"
#include "kiln/scalar_math.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

constexpr int kMaxDims = 8;

// `#pragma unroll` for device code only (host compilers warn about it).
#if defined(__CUDA_ARCH__)
#define KILN_UNROLL _Pragma("unroll")
#else
#define KILN_UNROLL
#endif
constexpr int kBlockSize = 256;

// ---- Types -------------------------------------------------------------------------------

template <typename T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T>
using opmath_t = std::conditional_t<is_reduced_float_v<T>, float, T>;

// Value conversion, the same on every backend: kiln::convert (See Note [Float to integer casts]).
template <typename To, typename From>
KILN_HD inline To cast(From v) {
  return convert<To>(v);
}

// Which dtypes an op accepts; dispatch() raises unsupported_dtype for the others. Each set
// instantiates the functor for its types only (Bool: bool alone, for logical ops). The sets are
// rules.toml's named dtype sets (kiln/generated/dtype_sets.h), so a kernel and the row it
// implements name the same set.
namespace TypeSet {
inline constexpr DTypeSet All = dtype_sets::all;
inline constexpr DTypeSet Numeric = dtype_sets::numeric;
inline constexpr DTypeSet Float = dtype_sets::floating;
inline constexpr DTypeSet Bool = dtype_sets::bool_;
}  // namespace TypeSet

// Calls f.template operator()<T>() with T the C++ type of `t`: f is `[&]<typename T>() {...}`.
template <DTypeSet S, typename F>
void dispatch(ScalarType t, const char* name, F&& f) {
#define KILN_CUDA_CASE(st, T) \
  case st:                    \
    if constexpr (S.has(st)) return f.template operator()<T>(); \
    break;
  switch (t) {
    KILN_CUDA_CASE(kFloat32, float)
    KILN_CUDA_CASE(kFloat64, double)
    KILN_CUDA_CASE(kFloat16, Half)
    KILN_CUDA_CASE(kBFloat16, BFloat16)
    KILN_CUDA_CASE(kUInt8, uint8_t)
    KILN_CUDA_CASE(kInt8, int8_t)
    KILN_CUDA_CASE(kInt16, int16_t)
    KILN_CUDA_CASE(kInt32, int32_t)
    KILN_CUDA_CASE(kInt64, int64_t)
    KILN_CUDA_CASE(kBool, bool)
  }
#undef KILN_CUDA_CASE
  unsupported_dtype(name, t);
}

// ---- Geometry ----------------------------------------------------------------------------

// A fixed-size array passable to kernels (N may be 0).
template <typename T, int N>
struct Array {
  T v[N > 0 ? N : 1];
  KILN_HD T& operator[](int i) { return v[i]; }
  KILN_HD const T& operator[](int i) const { return v[i]; }
};

// Per-operand byte offsets of linear element i over the coalesced shape, innermost dim first.
template <int N>
struct OffsetCalc {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims][N > 0 ? N : 1];

  KILN_HD Array<int64_t, N> get(int64_t i) const {
    Array<int64_t, N> off;
KILN_UNROLL
    for (int k = 0; k < N; ++k) off[k] = 0;
KILN_UNROLL
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == ndim) break;
      int64_t idx = i % sizes[d];
      i /= sizes[d];
KILN_UNROLL
      for (int k = 0; k < N; ++k) off[k] += idx * strides[d][k];
    }
    return off;
  }
};

// Builds the coalesced geometry of N operands (operand 0 fixes the shape; the others broadcast
// to it). Raises NotImplemented beyond kMaxDims coalesced dims.
template <int N>
OffsetCalc<N> make_offset_calc(const std::array<const Tensor*, N>& ts) {
  const Tensor& out = *ts[0];
  int64_t nd = out.dim();
  KILN_CHECK(nd <= 64, NotImplemented, "CUDA elementwise kernels: too many dims (", nd, ")");
  // Innermost first, dropping size-1 dims and merging dims whose strides chain.
  OffsetCalc<N> c;
  int64_t sizes[64];
  int64_t strides[64][N > 0 ? N : 1];
  int n = 0;
  for (int64_t d = nd - 1; d >= 0; --d) {
    int64_t size = out.size(d);
    if (size == 1) continue;
    int64_t st[N > 0 ? N : 1];
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *ts[k];
      int64_t td = d - (nd - t.dim());
      st[k] = (td >= 0 && t.size(td) != 1) ? t.stride(td) * static_cast<int64_t>(t.element_size()) : 0;
    }
    bool merge = n > 0;
    for (int k = 0; k < N && merge; ++k) merge = st[k] == strides[n - 1][k] * sizes[n - 1];
    if (merge) {
      sizes[n - 1] *= size;
      continue;
    }
    sizes[n] = size;
    for (int k = 0; k < N; ++k) strides[n][k] = st[k];
    ++n;
  }
  KILN_CHECK(n <= kMaxDims, NotImplemented, "CUDA elementwise kernels support at most ", kMaxDims,
             " dims after coalescing, got ", n, " (shape ", out.sizes(), ")");
  c.ndim = n;
  for (int d = 0; d < n; ++d) {
    c.sizes[d] = sizes[d];
    for (int k = 0; k < N; ++k) c.strides[d][k] = strides[d][k];
  }
  return c;
}

// Grid for a grid-stride loop over `work` items on `device`.
inline unsigned grid_for(int64_t work, int device) {
  int64_t blocks = (work + kBlockSize - 1) / kBlockSize;
  int64_t cap = static_cast<int64_t>(sm_count(device)) * 16;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

// ---- Kernels -----------------------------------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) AlignedVector {
  T val[V];
};

template <typename OutT, typename InT, int NIN, typename F, size_t... I>
__device__ inline OutT apply(const F& f, const InT (&x)[NIN > 0 ? NIN : 1], std::index_sequence<I...>) {
  return cast<OutT>(f(static_cast<opmath_t<InT>>(x[I])...));
}

// out[i] = f(in[0][i], ...); every operand contiguous with n elements. V elements per step.
template <int V, int NIN, typename OutT, typename InT, typename F>
__global__ void contiguous_kernel(int64_t n, OutT* out, Array<const InT*, NIN> in, F f) {
  int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t nvec = n / V;
  for (int64_t v = tid; v < nvec; v += step) {
    AlignedVector<InT, V> x[NIN > 0 ? NIN : 1];
KILN_UNROLL
    for (int k = 0; k < NIN; ++k) x[k] = reinterpret_cast<const AlignedVector<InT, V>*>(in[k])[v];
    AlignedVector<OutT, V> r;
KILN_UNROLL
    for (int j = 0; j < V; ++j) {
      InT xs[NIN > 0 ? NIN : 1];
KILN_UNROLL
      for (int k = 0; k < NIN; ++k) xs[k] = x[k].val[j];
      r.val[j] = apply<OutT, InT, NIN>(f, xs, std::make_index_sequence<NIN>());
    }
    reinterpret_cast<AlignedVector<OutT, V>*>(out)[v] = r;
  }
  for (int64_t i = nvec * V + tid; i < n; i += step) {
    InT xs[NIN > 0 ? NIN : 1];
KILN_UNROLL
    for (int k = 0; k < NIN; ++k) xs[k] = in[k][i];
    out[i] = apply<OutT, InT, NIN>(f, xs, std::make_index_sequence<NIN>());
  }
}

// The same over arbitrary byte strides (operand 0 of calc is the output).
template <int NIN, typename OutT, typename InT, typename F>
__global__ void strided_kernel(int64_t n, OffsetCalc<NIN + 1> calc, char* out,
                               Array<const char*, NIN> in, F f) {
  int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    Array<int64_t, NIN + 1> off = calc.get(i);
    InT xs[NIN > 0 ? NIN : 1];
KILN_UNROLL
    for (int k = 0; k < NIN; ++k) xs[k] = *reinterpret_cast<const InT*>(in[k] + off[k + 1]);
    *reinterpret_cast<OutT*>(out + off[0]) = apply<OutT, InT, NIN>(f, xs, std::make_index_sequence<NIN>());
  }
}

// out[i] = f(i) over a contiguous output (creation ops).
template <typename OutT, typename F>
__global__ void index_kernel(int64_t n, OutT* out, F f) {
  int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    out[i] = f(i);
}

// ---- Launchers ---------------------------------------------------------------------------

template <typename T>
inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <typename OutT, typename InT>
constexpr int vector_width() {
  constexpr size_t big = sizeof(OutT) > sizeof(InT) ? sizeof(OutT) : sizeof(InT);
  constexpr size_t v = 16 / big;
  return v > 8 ? 8 : (v < 1 ? 1 : static_cast<int>(v));
}

// Contiguous path only: every operand holds n contiguous elements.
template <typename OutT, typename InT, int NIN, typename F>
void launch_contiguous(int64_t n, int device, OutT* out, const std::array<const InT*, NIN>& ins, F f) {
  if (n == 0) return;
  constexpr int V = vector_width<OutT, InT>();
  Array<const InT*, NIN> in{};
  bool aligned = aligned_to<OutT>(out, sizeof(OutT) * V);
  for (int k = 0; k < NIN; ++k) {
    in[k] = ins[k];
    aligned = aligned && aligned_to<InT>(ins[k], sizeof(InT) * V);
  }
  cudaStream_t s = getCurrentStream(device).stream();
  if (aligned && V > 1) {
    contiguous_kernel<V, NIN, OutT, InT><<<grid_for(n / V + 1, device), kBlockSize, 0, s>>>(n, out, in, f);
  } else {
    contiguous_kernel<1, NIN, OutT, InT><<<grid_for(n, device), kBlockSize, 0, s>>>(n, out, in, f);
  }
  KILN_CUDA_CHECK_LAUNCH();
}

// out = f(ins...) elementwise; `out` has dtype OutT, every input dtype InT, all on out's device;
// inputs broadcast to out's shape.
template <typename OutT, typename InT, int NIN, typename F>
void launch_elementwise(const Tensor& out, const std::array<const Tensor*, NIN>& ins, F f) {
  int64_t n = out.numel();
  if (n == 0) return;
  int device = out.device().index();
  DeviceGuard g(device);
  bool contiguous = out.is_contiguous();
  for (const Tensor* t : ins) contiguous = contiguous && t->is_contiguous() && t->numel() == n;
  if (contiguous) {
    std::array<const InT*, NIN> ptrs;
    for (int k = 0; k < NIN; ++k) ptrs[k] = static_cast<const InT*>(ins[k]->impl()->raw_data());
    launch_contiguous<OutT, InT, NIN>(n, device, static_cast<OutT*>(out.impl()->raw_data()), ptrs, f);
    return;
  }
  std::array<const Tensor*, NIN + 1> all;
  all[0] = &out;
  Array<const char*, NIN> in{};
  for (int k = 0; k < NIN; ++k) {
    all[k + 1] = ins[k];
    in[k] = static_cast<const char*>(ins[k]->impl()->raw_data());
  }
  OffsetCalc<NIN + 1> calc = make_offset_calc<NIN + 1>(all);
  cudaStream_t s = getCurrentStream(device).stream();
  strided_kernel<NIN, OutT, InT><<<grid_for(n, device), kBlockSize, 0, s>>>(
      n, calc, static_cast<char*>(out.impl()->raw_data()), in, f);
  KILN_CUDA_CHECK_LAUNCH();
}

// out[i] = f(i) for a contiguous CUDA output.
template <typename OutT, typename F>
void launch_index(const Tensor& out, F f) {
  int64_t n = out.numel();
  if (n == 0) return;
  int device = out.device().index();
  DeviceGuard g(device);
  index_kernel<OutT><<<grid_for(n, device), kBlockSize, 0, getCurrentStream(device).stream()>>>(
      n, static_cast<OutT*>(out.impl()->raw_data()), f);
  KILN_CUDA_CHECK_LAUNCH();
}

// ---- Op helpers --------------------------------------------------------------------------

// A CPU 0-dim tensor taking part in a CUDA op (a wrapped number or a CPU scalar tensor).
inline bool is_cpu_scalar(const Tensor& t) { return t.device().is_cpu() && t.dim() == 0; }

// `t` with `like`'s dtype on `like`'s device (a no-op when both already match).
inline Tensor cast_like(const Tensor& t, const Tensor& like) {
  return t.to(like.dtype(), like.device());
}

// The value of a CPU scalar tensor as T (any dtype).
template <typename T>
T cpu_scalar_value(const Tensor& t) {
  T v{};
  KILN_DISPATCH_ALL_TYPES(t.dtype(), "cpu_scalar_value", [&] {
    v = cast<T>(*static_cast<const scalar_t*>(t.impl()->raw_data()));
  });
  return v;
}

// A CPU scalar's value as the CPU kernels see it: first stored as T (cast_inputs), then read
// in op math. So float16 + 0.1 adds float(Half(0.1)), and uint8 == -1 compares with 255.
template <typename T>
opmath_t<T> cpu_scalar_opmath(const Tensor& t) {
  return static_cast<opmath_t<T>>(cpu_scalar_value<T>(t));
}

// f(x, s) or, when `first`, f(s, x): a binary functor with one operand a kernel argument. The
// flag is uniform over the launch, so both positions share one kernel instantiation.
template <typename F, typename C>
struct BindScalar {
  F f;
  C s;
  bool first;
  template <typename A>
  KILN_HD auto operator()(A x) const { return first ? f(static_cast<A>(s), x) : f(x, static_cast<A>(s)); }
};

// out = op(self, other) computed in dtype `compute` (one of S): the inputs are cast to it on the
// device first (a no-op when they already have it), float16/bfloat16 compute in float, and the
// result is stored as FixedOut (bool for comparisons) or, when FixedOut is void, as `compute`
// (which must then be out's dtype). A CPU 0-dim operand becomes a kernel argument.
template <DTypeSet S, typename FixedOut, typename Op>
void binary_op_in(const char* name, ScalarType compute, const Tensor& out, const Tensor& self,
                  const Tensor& other, const Op& op) {
  if (out.numel() == 0) return;
  dispatch<S>(compute, name, [&]<typename T>() {
    using OutT = std::conditional_t<std::is_void_v<FixedOut>, T, FixedOut>;
    using C = opmath_t<T>;
    bool scalar_other = is_cpu_scalar(other), scalar_self = !scalar_other && is_cpu_scalar(self);
    if (scalar_other || scalar_self) {
      const Tensor& s = scalar_other ? other : self;
      Tensor a = (scalar_other ? self : other).to(compute, out.device());
      launch_elementwise<OutT, T, 1>(out, {&a}, BindScalar<Op, C>{op, cpu_scalar_opmath<T>(s), scalar_self});
    } else {
      Tensor a = self.to(compute, out.device()), b = other.to(compute, out.device());
      launch_elementwise<OutT, T, 2>(out, {&a, &b}, op);
    }
  });
}

// out = op(self, other) over out's dtype (see binary_op_in).
template <DTypeSet S, typename Op>
void binary_op(const char* name, const Tensor& out, const Tensor& self, const Tensor& other, Op op) {
  binary_op_in<S, void>(name, out.dtype(), out, self, other, op);
}

// out = op(self) computed in `compute` (self cast to it), stored as FixedOut or `compute`.
template <DTypeSet S, typename FixedOut, typename Op>
void unary_op_in(const char* name, ScalarType compute, const Tensor& out, const Tensor& self, const Op& op) {
  if (out.numel() == 0) return;
  dispatch<S>(compute, name, [&]<typename T>() {
    using OutT = std::conditional_t<std::is_void_v<FixedOut>, T, FixedOut>;
    Tensor a = self.to(compute, out.device());
    launch_elementwise<OutT, T, 1>(out, {&a}, op);
  });
}

// out = op(self) over out's dtype (self cast to it).
template <DTypeSet S, typename Op>
void unary_op(const char* name, const Tensor& out, const Tensor& self, Op op) {
  unary_op_in<S, void>(name, out.dtype(), out, self, op);
}

}  // namespace kiln::cuda
