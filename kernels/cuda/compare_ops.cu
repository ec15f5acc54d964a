// eq, ne, lt, le, gt, ge, logical_and/or/xor and where on CUDA (tensor/ops/pointwise.toml).
//  - comparisons: x, y broadcastable to out -> bool out, compared in result_type(x, y) (inputs
//    cast to it on the device; float16/bfloat16 compared in float), as kernels/cpu/binary.cpp;
//  - logical ops: x, y read as bool (nonzero, nan included, is true) -> bool out;
//  - where(condition, x, y): out = condition ? x : y in out's dtype. It only moves bits, so its
//    kernel is keyed by element size (4 instantiations), not by dtype.
// A CPU 0-dim operand is a kernel argument everywhere.
#include <cstring>

#include "kiln/dispatcher.h"
#include "kiln/generated/ops/pointwise.h"
#include "loops.cuh"

namespace kiln::cuda {
namespace {

// One functor for all six comparisons (a uniform switch) keeps the instantiations at one set.
enum class Cmp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };

struct CompareOp {
  Cmp cmp;
  template <typename C>
  KILN_HD bool operator()(C a, C b) const {
    switch (cmp) {
      case Cmp::Eq: return a == b;
      case Cmp::Ne: return a != b;
      case Cmp::Lt: return a < b;
      case Cmp::Le: return a <= b;
      case Cmp::Gt: return a > b;
      default: return a >= b;
    }
  }
};

void compare_cuda(const char* name, Cmp cmp, const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op_in<TypeSet::All, bool>(name, result_type({self, other}), out, self, other, CompareOp{cmp});
}

#define KILN_CUDA_COMPARE(NAME, CMP)                                                  \
  void NAME##_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {     \
    compare_cuda(#NAME, Cmp::CMP, out, self, other);                                 \
  }
KILN_CUDA_COMPARE(eq, Eq)
KILN_CUDA_COMPARE(ne, Ne)
KILN_CUDA_COMPARE(lt, Lt)
KILN_CUDA_COMPARE(le, Le)
KILN_CUDA_COMPARE(gt, Gt)
KILN_CUDA_COMPARE(ge, Ge)
#undef KILN_CUDA_COMPARE

enum class Logic : uint8_t { And, Or, Xor };

struct LogicalOp {
  Logic op;
  KILN_HD bool operator()(bool a, bool b) const {
    return op == Logic::And ? (a && b) : (op == Logic::Or ? (a || b) : (a != b));
  }
};

void logical_and_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op_in<TypeSet::Bool, bool>("logical_and", kBool, out, self, other, LogicalOp{Logic::And});
}
void logical_or_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op_in<TypeSet::Bool, bool>("logical_or", kBool, out, self, other, LogicalOp{Logic::Or});
}
void logical_xor_cuda(const Tensor& out, const Tensor& self, const Tensor& other) {
  binary_op_in<TypeSet::Bool, bool>("logical_xor", kBool, out, self, other, LogicalOp{Logic::Xor});
}

// ---- where

// An input of where: a device pointer (byte offsets from the offset calc), or, when p is
// null, the value v (a CPU scalar) for every element.
template <typename E>
struct WhereInput {
  const char* p;
  E v;
  KILN_HD E at(int64_t off) const { return p ? *reinterpret_cast<const E*>(p + off) : v; }
};

// out[i] = cond[i] ? a[i] : b[i] over n elements; kContiguous: every operand that is a tensor is
// contiguous with n elements (offsets i * size), else offsets come from calc (operands: out,
// cond, a, b).
template <bool kContiguous, typename E>
__global__ void where_kernel(int64_t n, OffsetCalc<4> calc, char* out, WhereInput<bool> cond,
                             WhereInput<E> a, WhereInput<E> b) {
  int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    int64_t o0, o1, o2, o3;
    if constexpr (kContiguous) {
      o0 = o2 = o3 = i * static_cast<int64_t>(sizeof(E));
      o1 = i;
    } else {
      Array<int64_t, 4> off = calc.get(i);
      o0 = off[0], o1 = off[1], o2 = off[2], o3 = off[3];
    }
    *reinterpret_cast<E*>(out + o0) = cond.at(o1) ? a.at(o2) : b.at(o3);
  }
}

// The raw bits of CPU scalar `t` stored as `dtype` (cast_inputs' conversion), as an E of the
// same size (the other dispatch branches never run).
template <typename E>
E scalar_bits(const Tensor& t, ScalarType dtype) {
  E bits{};
  KILN_DISPATCH_ALL_TYPES(dtype, "where", [&] {
    scalar_t v = cpu_scalar_value<scalar_t>(t);
    std::memcpy(&bits, &v, sizeof(scalar_t) < sizeof(E) ? sizeof(scalar_t) : sizeof(E));
  });
  return bits;
}

// condition: bool, x, y: broadcastable to out -> out = condition ? x : y (x, y cast to out's dtype)
void where_cuda(const Tensor& out, const Tensor& condition, const Tensor& self, const Tensor& other) {
  int64_t n = out.numel();
  if (n == 0) return;
  ScalarType dt = out.dtype();
  Device dev = out.device();
  // Device-side operands (CPU scalars stay on the host and become kernel arguments).
  Tensor c = is_cpu_scalar(condition) ? Tensor() : condition.to(kBool, dev);
  Tensor a = is_cpu_scalar(self) ? Tensor() : self.to(dt, dev);
  Tensor b = is_cpu_scalar(other) ? Tensor() : other.to(dt, dev);
  int device = dev.index();
  DeviceGuard g(device);
  cudaStream_t stream = getCurrentStream(device).stream();
  bool contiguous = out.is_contiguous();
  for (const Tensor* t : {&c, &a, &b})
    if (t->defined()) contiguous = contiguous && t->is_contiguous() && t->numel() == n;
  // Scalars take part in the offset calc as 0-dim tensors (stride 0); their pointers stay null.
  const Tensor& cs = c.defined() ? c : condition;
  const Tensor& as = a.defined() ? a : self;
  const Tensor& bs = b.defined() ? b : other;
  OffsetCalc<4> calc{};
  if (!contiguous) calc = make_offset_calc<4>({&out, &cs, &as, &bs});
  WhereInput<bool> wc{c.defined() ? static_cast<const char*>(c.impl()->raw_data()) : nullptr,
                      c.defined() ? false : cpu_scalar_value<bool>(condition)};
  auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<const char*>(t.impl()->raw_data()) : nullptr; };
  char* o = static_cast<char*>(out.impl()->raw_data());
  unsigned grid = grid_for(n, device);
  auto launch = [&]<typename E>() {
    WhereInput<E> wa{ptr(a), a.defined() ? E{} : scalar_bits<E>(self, dt)};
    WhereInput<E> wb{ptr(b), b.defined() ? E{} : scalar_bits<E>(other, dt)};
    if (contiguous) where_kernel<true, E><<<grid, kBlockSize, 0, stream>>>(n, calc, o, wc, wa, wb);
    else where_kernel<false, E><<<grid, kBlockSize, 0, stream>>>(n, calc, o, wc, wa, wb);
  };
  switch (out.element_size()) {
    case 1: launch.template operator()<uint8_t>(); break;
    case 2: launch.template operator()<uint16_t>(); break;
    case 4: launch.template operator()<uint32_t>(); break;
    default: launch.template operator()<uint64_t>(); break;
  }
  KILN_CUDA_CHECK_LAUNCH();
}

KILN_LIBRARY(CUDA, m) {
  m.structured<ops::eq>(eq_cuda);
  m.structured<ops::ne>(ne_cuda);
  m.structured<ops::lt>(lt_cuda);
  m.structured<ops::le>(le_cuda);
  m.structured<ops::gt>(gt_cuda);
  m.structured<ops::ge>(ge_cuda);
  m.structured<ops::logical_and>(logical_and_cuda);
  m.structured<ops::logical_or>(logical_or_cuda);
  m.structured<ops::logical_xor>(logical_xor_cuda);
  m.structured<ops::where>(where_cuda);
}

}  // namespace
}  // namespace kiln::cuda
