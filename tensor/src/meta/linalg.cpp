// Meta functions of the matrix products (tensor/ops/linalg.toml). Shape errors name both shapes,
// PyTorch-style: "mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)".
#include <sstream>
#include <string>

#include "kiln/generated/meta/linalg.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

std::string by_x(IntArrayRef s) {  // [2, 3] -> "2x3"
  std::ostringstream os;
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "x" : "") << s[i];
  return os.str();
}

// True when `from` broadcasts to exactly `to` (expand semantics).
bool expands_to(IntArrayRef from, IntArrayRef to) {
  if (from.size() > to.size()) return false;
  size_t off = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i)
    if (from[i] != 1 && from[i] != to[off + i]) return false;
  return true;
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.dtype() == b.dtype(), Type, op,
             ": expected both operands to have the same dtype, but got ", a.dtype(),
             " != ", b.dtype());
  KILN_CHECK(is_floating(a.dtype()), Type, op, ": expected floating-point operands, got ",
             a.dtype());
}

// (n, k) @ (k, m) -> (n, m), checked as `op` ("mm", "addmm").
DimVector mm_shape(const char* op, const Tensor& mat1, const Tensor& mat2) {
  KILN_CHECK(mat1.dim() == 2, Value, op, ": mat1 must be a matrix, got shape ", mat1.sizes());
  KILN_CHECK(mat2.dim() == 2, Value, op, ": mat2 must be a matrix, got shape ", mat2.sizes());
  check_same_dtype(op, mat1, mat2);
  KILN_CHECK(mat1.size(1) == mat2.size(0), Value, op,
             ": mat1 and mat2 shapes cannot be multiplied (", by_x(mat1.sizes()), " and ",
             by_x(mat2.sizes()), ")");
  return {mat1.size(0), mat2.size(1)};
}

}  // namespace

TensorSpec mm(const Tensor& self, const Tensor& mat2) {
  DimVector s = mm_shape("mm", self, mat2);
  return contiguous_spec(s, self.dtype(), common_device("mm", self, mat2));
}

TensorSpec bmm(const Tensor& self, const Tensor& mat2) {
  KILN_CHECK(self.dim() == 3, Value, "bmm: batch1 must be a 3-D tensor, got shape ", self.sizes());
  KILN_CHECK(mat2.dim() == 3, Value, "bmm: batch2 must be a 3-D tensor, got shape ", mat2.sizes());
  check_same_dtype("bmm", self, mat2);
  KILN_CHECK(self.size(0) == mat2.size(0), Value,
             "bmm: batch1 and batch2 must have the same batch size (", by_x(self.sizes()), " and ",
             by_x(mat2.sizes()), ")");
  KILN_CHECK(self.size(2) == mat2.size(1), Value,
             "bmm: batch1 and batch2 shapes cannot be multiplied (", by_x(self.sizes()), " and ",
             by_x(mat2.sizes()), ")");
  return contiguous_spec({self.size(0), self.size(1), mat2.size(2)}, self.dtype(),
                         common_device("bmm", self, mat2));
}

TensorSpec addmm(const Tensor& self, const Tensor& mat1, const Tensor& mat2, const Scalar&,
                 const Scalar&) {
  DimVector s = mm_shape("addmm", mat1, mat2);
  check_same_dtype("addmm", self, mat1);
  KILN_CHECK(expands_to(self.sizes(), s), Value, "addmm: self of shape ", self.sizes(),
             " cannot be broadcast to the result shape ", s.ref());
  return contiguous_spec(s, self.dtype(), common_device("addmm", self, mat1, mat2));
}

// PyTorch's matmul rules: 1-D operands get a dim of size 1 prepended (self) or appended (other)
// that is removed again from the result; the dims before the last two broadcast.
TensorSpec matmul(const Tensor& self, const Tensor& other) {
  int64_t d1 = self.dim(), d2 = other.dim();
  KILN_CHECK(d1 >= 1 && d2 >= 1, Value,
             "matmul: both arguments need to be at least 1-D, but they are ", d1, "-D and ", d2,
             "-D");
  check_same_dtype("matmul", self, other);
  int64_t k1 = self.size(-1), k2 = d2 == 1 ? other.size(0) : other.size(-2);
  KILN_CHECK(k1 == k2, Value, "matmul: shapes ", self.sizes(), " and ", other.sizes(),
             " cannot be multiplied (", k1, " != ", k2, ")");
  IntArrayRef b1(self.sizes().data(), d1 > 2 ? d1 - 2 : 0);
  IntArrayRef b2(other.sizes().data(), d2 > 2 ? d2 - 2 : 0);
  DimVector out = broadcast_shapes("matmul", b1, b2);
  if (d1 > 1) out.push_back(self.size(-2));
  if (d2 > 1) out.push_back(other.size(-1));
  return contiguous_spec(out, self.dtype(), common_device("matmul", self, other));
}

TensorSpec linear(const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias) {
  KILN_CHECK(weight.dim() == 2, Value,
             "linear: weight must be a matrix (out_features, in_features), got shape ",
             weight.sizes());
  KILN_CHECK(input.dim() >= 1, Value, "linear: input must have at least 1 dimension");
  check_same_dtype("linear", input, weight);
  KILN_CHECK(input.size(-1) == weight.size(1), Value, "linear: input of shape ", input.sizes(),
             " and weight of shape ", weight.sizes(), " cannot be multiplied (in_features ",
             input.size(-1), " != ", weight.size(1), ")");
  DimVector out(input.sizes());
  out.back() = weight.size(0);
  if (bias && bias->defined()) {
    check_same_dtype("linear", input, *bias);
    KILN_CHECK(expands_to(bias->sizes(), out), Value, "linear: bias of shape ", bias->sizes(),
               " cannot be broadcast to the result shape ", out.ref());
    return contiguous_spec(out, input.dtype(), common_device("linear", input, weight, *bias));
  }
  return contiguous_spec(out, input.dtype(), common_device("linear", input, weight));
}

}  // namespace kiln::meta
