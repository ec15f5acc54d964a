// Meta functions of the attention rows (tensor/ops/attention.toml). query (..., L, E), key
// (..., S, E) and value (..., S, Ev) share their leading (batch, head) dims and dtype; the output
// is (..., L, Ev) and the logsumexp (..., L), in float32 (float64 for float64 inputs).
#include "kiln/generated/meta/attention.h"

#include "kiln/default_device.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

ScalarType logsumexp_dtype(ScalarType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

void check_dropout(const char* op, double p) {
  KILN_CHECK(p >= 0 && p <= 1, Value, op,
             ": dropout probability has to be between 0 and 1, but got ", p);
}

// Validates query/key/value; returns (..., L, Ev).
DimVector attention_shape(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  KILN_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, Value, op,
             ": expected query, key and value of at least 2 dims (..., L, E), got shapes ",
             q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  KILN_CHECK(q.dim() == k.dim() && q.dim() == v.dim(), Value, op,
             ": expected query, key and value with the same number of dims, got shapes ", q.sizes(),
             ", ", k.sizes(), " and ", v.sizes());
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), Type, op,
             ": expected query, key and value of the same dtype, got ", q.dtype(), ", ", k.dtype(),
             " and ", v.dtype());
  KILN_CHECK(is_floating(q.dtype()), Type, op, ": expected floating-point inputs, got ", q.dtype());
  const int64_t n = q.dim();
  for (int64_t d = 0; d < n - 2; ++d)
    KILN_CHECK(q.size(d) == k.size(d) && q.size(d) == v.size(d), Value, op,
               ": query, key and value must have the same batch dims, got shapes ", q.sizes(), ", ",
               k.sizes(), " and ", v.sizes());
  KILN_CHECK(q.size(-1) == k.size(-1), Value, op,
             ": query and key must have the same embedding size (last dim), got shapes ", q.sizes(),
             " and ", k.sizes());
  KILN_CHECK(k.size(-2) == v.size(-2), Value, op,
             ": key and value must have the same sequence length (dim -2), got shapes ", k.sizes(),
             " and ", v.sizes());
  DimVector out(q.sizes());
  out[n - 1] = v.size(-1);
  return out;
}

DimVector drop_last(IntArrayRef s) { return DimVector(IntArrayRef(s.data(), s.size() - 1)); }

// Validates a packed (jagged) query (T, H, E), key (T, H, E), value (T, H, Ev) and offsets
// (B + 1) int64; returns (T, H, Ev). The offsets' values are the kernel's to check (a meta
// tensor has none).
DimVector jagged_shape(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                       const Tensor& offsets) {
  KILN_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, Value, op,
             ": expected packed query, key and value of 3 dims (total length, heads, E), got "
             "shapes ",
             q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  KILN_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), Type, op,
             ": expected query, key and value of the same dtype, got ", q.dtype(), ", ", k.dtype(),
             " and ", v.dtype());
  KILN_CHECK(is_floating(q.dtype()), Type, op, ": expected floating-point inputs, got ", q.dtype());
  KILN_CHECK(q.size(0) == k.size(0) && q.size(0) == v.size(0), Value, op,
             ": query, key and value must have the same total length (dim 0), got shapes ",
             q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  KILN_CHECK(q.size(1) == k.size(1) && q.size(1) == v.size(1), Value, op,
             ": query, key and value must have the same number of heads (dim 1), got shapes ",
             q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  KILN_CHECK(q.size(2) == k.size(2), Value, op,
             ": query and key must have the same embedding size (last dim), got shapes ", q.sizes(),
             " and ", k.sizes());
  KILN_CHECK(offsets.dtype() == kInt64, Type, op, ": expected int64 offsets, got ",
             offsets.dtype());
  KILN_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1, Value, op,
             ": expected offsets of shape (B + 1), got ", offsets.sizes());
  return DimVector{q.size(0), q.size(1), v.size(2)};
}

}  // namespace

TensorSpec scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                        double dropout_p, bool, std::optional<double>,
                                        std::optional<Generator>) {
  const char* op = "scaled_dot_product_attention";
  check_dropout(op, dropout_p);
  DimVector out = attention_shape(op, query, key, value);
  return contiguous_spec(out, query.dtype(), common_device(op, query, key, value));
}

std::vector<TensorSpec> fused_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                        double dropout_p, bool, std::optional<double>, int64_t,
                                        int64_t) {
  const char* op = "_fused_attention";
  check_dropout(op, dropout_p);
  DimVector out = attention_shape(op, query, key, value);
  Device dev = common_device(op, query, key, value);
  return {contiguous_spec(out, query.dtype(), dev),
          contiguous_spec(drop_last(query.sizes()), logsumexp_dtype(query.dtype()), dev)};
}

// An attention backward's incoming gradients and saved values checked against the forward's
// output shape `out` (grad_out, output) and its rows (grad_logsumexp, logsumexp); the specs of
// the query, key and value gradients.
static std::vector<TensorSpec> backward_specs(const char* op, const DimVector& out,
                                              const Tensor& grad_out, const Tensor& grad_logsumexp,
                                              const Tensor& query, const Tensor& key,
                                              const Tensor& value, const Tensor& output,
                                              const Tensor& logsumexp, Device dev) {
  DimVector rows = drop_last(query.sizes());
  KILN_CHECK(grad_out.sizes() == out.ref() && output.sizes() == out.ref(), Value, op,
             ": expected grad_out and output of shape ", out.ref(), ", got ", grad_out.sizes(),
             " and ", output.sizes());
  KILN_CHECK(grad_logsumexp.sizes() == rows.ref() && logsumexp.sizes() == rows.ref(), Value, op,
             ": expected grad_logsumexp and logsumexp of shape ", rows.ref(), ", got ",
             grad_logsumexp.sizes(), " and ", logsumexp.sizes());
  for (const Tensor* t : {&grad_out, &grad_logsumexp, &output, &logsumexp})
    KILN_CHECK(is_floating(t->dtype()), Type, op,
               ": expected floating-point gradients and saved values, got ", t->dtype());
  return {contiguous_spec(query.sizes(), query.dtype(), dev),
          contiguous_spec(key.sizes(), key.dtype(), dev),
          contiguous_spec(value.sizes(), value.dtype(), dev)};
}

std::vector<TensorSpec> fused_attention_backward(const Tensor& grad_out,
                                                 const Tensor& grad_logsumexp, const Tensor& query,
                                                 const Tensor& key, const Tensor& value,
                                                 const Tensor& output, const Tensor& logsumexp,
                                                 double dropout_p, bool, std::optional<double>,
                                                 int64_t, int64_t) {
  const char* op = "_fused_attention_backward";
  check_dropout(op, dropout_p);
  DimVector out = attention_shape(op, query, key, value);
  return backward_specs(op, out, grad_out, grad_logsumexp, query, key, value, output, logsumexp,
                        common_device(op, query, key, value));
}

std::vector<TensorSpec> jagged_attention(const Tensor& query, const Tensor& key,
                                         const Tensor& value, const Tensor& offsets, bool,
                                         std::optional<double>) {
  const char* op = "_jagged_attention";
  DimVector out = jagged_shape(op, query, key, value, offsets);
  Device dev = common_device(op, query, key, value, offsets);
  return {contiguous_spec(out, query.dtype(), dev),
          contiguous_spec(drop_last(query.sizes()), logsumexp_dtype(query.dtype()), dev)};
}

std::vector<TensorSpec> jagged_attention_backward(const Tensor& grad_out,
                                                  const Tensor& grad_logsumexp, const Tensor& query,
                                                  const Tensor& key, const Tensor& value,
                                                  const Tensor& offsets, const Tensor& output,
                                                  const Tensor& logsumexp, bool,
                                                  std::optional<double>) {
  const char* op = "_jagged_attention_backward";
  DimVector out = jagged_shape(op, query, key, value, offsets);
  return backward_specs(op, out, grad_out, grad_logsumexp, query, key, value, output, logsumexp,
                        common_device(op, query, key, value, offsets));
}

TensorSpec fused_attention_dropout_mask(IntArrayRef size, double dropout_p, int64_t, int64_t,
                                        std::optional<ScalarType> dtype,
                                        std::optional<Device> device) {
  const char* op = "_fused_attention_dropout_mask";
  check_dropout(op, dropout_p);
  for (int64_t s : size) KILN_CHECK(s >= 0, Value, op, ": sizes must be non-negative, got ", size);
  ScalarType t = dtype.value_or(kFloat32);
  KILN_CHECK(is_floating(t), Type, op, ": expected a floating dtype, got ", t);
  return contiguous_spec(size, t, device ? *device : default_device());
}

}  // namespace kiln::meta
