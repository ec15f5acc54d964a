// Meta functions of pointwise ops: broadcasting, type promotion, device agreement.
#include "kiln/generated/meta_decls.h"
#include "kiln/meta.h"

namespace kiln::meta {

static TensorSpec broadcast_spec(const char* op, const Tensor& a, const Tensor& b, ScalarType dtype) {
  Device d = common_device(op, {a, b});
  return contiguous_spec(broadcast_shapes(op, a.sizes(), b.sizes()), dtype, d);
}

TensorSpec binary_alpha(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  ScalarType t = result_type({self, other});
  KILN_CHECK(is_floating(t) || !alpha.is_floating(), Type,
             "add/sub: for integral input tensors, argument alpha must not be a floating point number");
  KILN_CHECK(t != kBool || alpha.is_bool() || alpha.to_int() == 1, Type,
             "add/sub: boolean alpha only supported for boolean results");
  return broadcast_spec("add", self, other, t);
}

}  // namespace kiln::meta
