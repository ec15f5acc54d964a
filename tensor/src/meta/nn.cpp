// Meta functions of the normalization layers, dropout, embedding (tensor/ops/nn.toml) and the
// softmax backward rows (reduction.toml): shapes, dtypes and the user-facing errors.
#include "kiln/generated/meta/copy.h"
#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/nn.h"
#include "kiln/generated/meta/reduction.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

void check_floating(const char* op, const Tensor& input) {
  KILN_CHECK(is_floating(input.dtype()), Type, op, ": expected a floating point input, got ",
             input.dtype());
}

// A parameter (weight, bias, running stats) of shape `want` and input's dtype.
void check_param(const char* op, const char* name, const Tensor& p, IntArrayRef want,
                 const Tensor& input) {
  KILN_CHECK(p.sizes() == want, Value, op, ": expected ", name, " of shape ", want, ", got ",
             p.sizes(), " (input of shape ", input.sizes(), ")");
  KILN_CHECK(p.dtype() == input.dtype(), Type, op, ": expected ", name, " to have dtype ",
             input.dtype(), " like the input, got ", p.dtype());
}

// input's trailing dims must equal normalized_shape.
void check_normalized_shape(const char* op, const Tensor& input, IntArrayRef shape) {
  check_floating(op, input);
  const int64_t k = static_cast<int64_t>(shape.size());
  KILN_CHECK(k >= 1, Value, op, ": expected normalized_shape to be at least 1-dimensional, got ",
             shape);
  bool ok = input.dim() >= k;
  for (int64_t i = 0; ok && i < k; ++i) ok = input.size(input.dim() - k + i) == shape[i];
  KILN_CHECK(ok, Value, op, ": normalized_shape ", shape,
             " must match the trailing dimensions of the input, got input of shape ", input.sizes());
}

void check_grad(const char* op, const Tensor& grad, const Tensor& input) {
  KILN_CHECK(grad.sizes() == input.sizes(), Value, op, ": expected grad of shape ", input.sizes(),
             " like the input, got ", grad.sizes());
  KILN_CHECK(grad.dtype() == input.dtype(), Type, op, ": expected grad to have dtype ",
             input.dtype(), ", got ", grad.dtype());
}

// (N, C, *) with C divisible by num_groups.
int64_t check_channels(const char* op, const Tensor& input) {
  check_floating(op, input);
  KILN_CHECK(input.dim() >= 2, Value, op,
             ": expected an input of at least 2 dimensions (N, C, *), got shape ", input.sizes());
  return input.size(1);
}

void check_groups(const char* op, const Tensor& input, int64_t num_groups) {
  const int64_t C = check_channels(op, input);
  KILN_CHECK(num_groups > 0 && C % num_groups == 0, Value, op,
             ": expected the number of channels (", C, ") to be divisible by num_groups, got ",
             num_groups, " (input of shape ", input.sizes(), ")");
}

void check_batch(const char* op, const Tensor& input) {
  check_channels(op, input);
  KILN_CHECK(input.numel() == 0 || input.numel() / input.size(1) > 1, Value, op,
             ": expected more than 1 value per channel when training, got input of shape ",
             input.sizes());
}

TensorSpec like(const Tensor& t, Device device) {
  return contiguous_spec(t.sizes(), t.dtype(), device);
}

}  // namespace

// ---- layer_norm -------------------------------------------------------------------------------

TensorSpec layer_norm(const Tensor& input, IntArrayRef normalized_shape,
                      const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                      double) {
  check_normalized_shape("layer_norm", input, normalized_shape);
  if (weight) check_param("layer_norm", "weight", *weight, normalized_shape, input);
  if (bias) check_param("layer_norm", "bias", *bias, normalized_shape, input);
  return like(input, input.device());
}

TensorSpec layer_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                      const Tensor& bias, double) {
  check_normalized_shape("layer_norm", input, normalized_shape);
  check_param("layer_norm", "weight", weight, normalized_shape, input);
  check_param("layer_norm", "bias", bias, normalized_shape, input);
  return like(input, common_device("layer_norm", input, weight, bias));
}

// The fused row-norm backwards: grad_input (the input's shape), then `num_params` gradients
// of normalized_shape (weight, and bias for layer_norm).
std::vector<TensorSpec> row_norm_backward(const char* op, const Tensor& grad, const Tensor& input,
                                          const Tensor& weight, IntArrayRef normalized_shape,
                                          int num_params) {
  check_normalized_shape(op, input, normalized_shape);
  check_grad(op, grad, input);
  check_param(op, "weight", weight, normalized_shape, input);
  const Device device = common_device(op, grad, input, weight);
  std::vector<TensorSpec> out{like(input, device)};
  out.resize(1 + num_params, contiguous_spec(normalized_shape, input.dtype(), device));
  return out;
}

// (grad_input, grad_weight, grad_bias).
std::vector<TensorSpec> layer_norm_backward(const Tensor& grad, const Tensor& input,
                                            const Tensor& weight, IntArrayRef normalized_shape,
                                            double) {
  return row_norm_backward("_layer_norm_backward", grad, input, weight, normalized_shape, 2);
}

// ---- rms_norm ---------------------------------------------------------------------------------

TensorSpec rms_norm(const Tensor& input, IntArrayRef normalized_shape,
                    const std::optional<Tensor>& weight, std::optional<double>) {
  check_normalized_shape("rms_norm", input, normalized_shape);
  if (weight) check_param("rms_norm", "weight", *weight, normalized_shape, input);
  return like(input, input.device());
}

TensorSpec rms_norm(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                    double) {
  check_normalized_shape("rms_norm", input, normalized_shape);
  check_param("rms_norm", "weight", weight, normalized_shape, input);
  return like(input, common_device("rms_norm", input, weight));
}

// (grad_input, grad_weight).
std::vector<TensorSpec> rms_norm_backward(const Tensor& grad, const Tensor& input,
                                          const Tensor& weight, IntArrayRef normalized_shape,
                                          double) {
  return row_norm_backward("_rms_norm_backward", grad, input, weight, normalized_shape, 1);
}

// ---- group_norm -------------------------------------------------------------------------------

TensorSpec group_norm(const Tensor& input, int64_t num_groups, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, double) {
  check_groups("group_norm", input, num_groups);
  if (weight) check_param("group_norm", "weight", *weight, {input.size(1)}, input);
  if (bias) check_param("group_norm", "bias", *bias, {input.size(1)}, input);
  return like(input, input.device());
}

TensorSpec group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight,
                      const Tensor& bias, double) {
  check_groups("group_norm", input, num_groups);
  check_param("group_norm", "weight", weight, {input.size(1)}, input);
  check_param("group_norm", "bias", bias, {input.size(1)}, input);
  return like(input, common_device("group_norm", input, weight, bias));
}

// (grad_input, grad_weight, grad_bias): the input's shape, then (C,) twice.
std::vector<TensorSpec> group_norm_backward(const Tensor& grad, const Tensor& input,
                                            const Tensor& weight, int64_t num_groups, double) {
  const char* op = "_group_norm_backward";
  check_groups(op, input, num_groups);
  check_grad(op, grad, input);
  check_param(op, "weight", weight, {input.size(1)}, input);
  const Device device = common_device(op, grad, input, weight);
  const TensorSpec param = contiguous_spec({input.size(1)}, input.dtype(), device);
  return {like(input, device), param, param};
}

// ---- batch_norm -------------------------------------------------------------------------------

TensorSpec batch_norm(const Tensor& input, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& bias, const std::optional<Tensor>& running_mean,
                      const std::optional<Tensor>& running_var, bool training, double momentum,
                      double) {
  const int64_t C = check_channels("batch_norm", input);
  if (weight) check_param("batch_norm", "weight", *weight, {C}, input);
  if (bias) check_param("batch_norm", "bias", *bias, {C}, input);
  if (running_mean) check_param("batch_norm", "running_mean", *running_mean, {C}, input);
  if (running_var) check_param("batch_norm", "running_var", *running_var, {C}, input);
  KILN_CHECK(running_mean.has_value() == running_var.has_value(), Value,
             "batch_norm: running_mean and running_var must be given together");
  if (training) {
    check_batch("batch_norm", input);
    KILN_CHECK(momentum >= 0 && momentum <= 1, Value,
               "batch_norm: expected momentum in [0, 1], got ", momentum);
  } else {
    KILN_CHECK(running_mean.has_value(), Value,
               "batch_norm: evaluation (training=False) needs running_mean and running_var");
  }
  return like(input, input.device());
}

TensorSpec batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, double) {
  check_batch("batch_norm", input);
  check_param("batch_norm", "weight", weight, {input.size(1)}, input);
  check_param("batch_norm", "bias", bias, {input.size(1)}, input);
  return like(input, common_device("batch_norm", input, weight, bias));
}

TensorSpec batch_norm_backward(const Tensor& grad, const Tensor& input, const Tensor& weight,
                               double) {
  check_batch("batch_norm_backward", input);
  check_grad("batch_norm_backward", grad, input);
  check_param("batch_norm_backward", "weight", weight, {input.size(1)}, input);
  return like(input, common_device("batch_norm_backward", grad, input, weight));
}

TensorSpec batch_norm_backward_weight(const Tensor& grad, const Tensor& input, double) {
  check_batch("batch_norm_backward_weight", input);
  check_grad("batch_norm_backward_weight", grad, input);
  return contiguous_spec({input.size(1)}, input.dtype(),
                         common_device("batch_norm_backward_weight", grad, input));
}

// ---- dropout ----------------------------------------------------------------------------------

TensorSpec dropout(const Tensor& input, double p, bool, std::optional<Generator>) {
  check_floating("dropout", input);
  KILN_CHECK(p >= 0 && p <= 1, Value, "dropout: probability has to be between 0 and 1, but got ",
             p);
  return like(input, input.device());
}

TensorSpec dropout_seeded(const Tensor& input, double p, int64_t, int64_t) {
  return dropout(input, p, true, std::nullopt);
}

// ---- embedding --------------------------------------------------------------------------------

namespace {
void check_indices(const char* op, const Tensor& indices) {
  KILN_CHECK(indices.dtype() == kInt64 || indices.dtype() == kInt32, Type, op,
             ": expected indices of dtype int64 or int32, got ", indices.dtype());
}
}  // namespace

TensorSpec embedding(const Tensor& weight, const Tensor& indices, int64_t, bool, bool sparse) {
  check_indices("embedding", indices);
  check_floating("embedding", weight);
  KILN_CHECK(weight.dim() == 2, Value, "embedding: expected a 2-D weight (num_embeddings, dim), got ",
             weight.sizes());
  KILN_CHECK(!sparse, NotImplemented,
             "embedding: sparse=True (a sparse gradient) is not supported; use sparse=False");
  DimVector sizes(indices.sizes());
  sizes.push_back(weight.size(1));
  return contiguous_spec(sizes, weight.dtype(), common_device("embedding", weight, indices));
}

TensorSpec embedding_dense_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                                    int64_t, bool) {
  check_indices("embedding_dense_backward", indices);
  check_floating("embedding_dense_backward", grad);
  bool ok = grad.dim() == indices.dim() + 1;
  for (int64_t d = 0; ok && d < indices.dim(); ++d) ok = grad.size(d) == indices.size(d);
  KILN_CHECK(ok, Value, "embedding_dense_backward: expected grad of shape indices.shape + (dim,), "
             "got grad of shape ", grad.sizes(), " and indices of shape ", indices.sizes());
  KILN_CHECK(num_weights >= 0, Value, "embedding_dense_backward: num_weights must be >= 0, got ",
             num_weights);
  return contiguous_spec({num_weights, grad.size(-1)}, grad.dtype(),
                         common_device("embedding_dense_backward", grad, indices));
}

// ---- softmax backward -------------------------------------------------------------------------

namespace {
TensorSpec softmax_backward_spec(const char* op, const Tensor& grad, const Tensor& output,
                                 int64_t dim) {
  check_floating(op, output);
  check_grad(op, grad, output);
  wrap_dim(op, dim, output.dim());
  return like(output, common_device(op, grad, output));
}
}  // namespace

TensorSpec softmax_backward_data(const Tensor& grad, const Tensor& output, int64_t dim) {
  return softmax_backward_spec("softmax_backward_data", grad, output, dim);
}

TensorSpec log_softmax_backward_data(const Tensor& grad, const Tensor& output, int64_t dim) {
  return softmax_backward_spec("log_softmax_backward_data", grad, output, dim);
}

}  // namespace kiln::meta
