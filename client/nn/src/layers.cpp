// The standard layers (kiln/nn/layers.h).
#include "kiln/nn/layers.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "kiln/autograd/grad_mode.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"

namespace kiln::nn {

std::string py_float(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".een") == std::string::npos) s += ".0";  // 1 -> 1.0 (not 1e-05, inf, nan)
  return s;
}

std::string py_tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

static const char* py_bool(bool b) { return b ? "True" : "False"; }

// An int given as a one-element list prints as the int (PyTorch prints what the user passed).
static std::string py_int_or_tuple(const std::vector<int64_t>& v) {
  return v.size() == 1 ? std::to_string(v[0]) : py_tuple(v);
}

// A one-element list repeated to `n` dims; otherwise exactly `n` entries.
static std::vector<int64_t> expand_arg(const char* layer, const char* what,
                                       const std::vector<int64_t>& v, int64_t n) {
  if (v.size() == 1) return std::vector<int64_t>(n, v[0]);
  KILN_CHECK(static_cast<int64_t>(v.size()) == n, Value, layer, ": ", what, " must have 1 or ", n,
             " values, got ", v.size());
  return v;
}

// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for a bias (zero bound when fan_in is 0), as PyTorch.
static void init_bias(const Tensor& bias, int64_t fan_in) {
  if (!bias.defined()) return;
  double bound = fan_in > 0 ? 1 / std::sqrt(static_cast<double>(fan_in)) : 0;
  init::uniform_(bias, -bound, bound);
}

// ---- Linear, Bilinear ---------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, bool has_bias)
    : Module("Linear"), in_features(in), out_features(out) {
  KILN_CHECK(in >= 0 && out >= 0, Value, "Linear: feature counts must be >= 0, got in=", in,
             ", out=", out);
  register_parameter("weight", kiln::empty({out, in}), &weight);
  register_parameter("bias", has_bias ? kiln::empty({out}) : Tensor(), &bias);
  reset_parameters();
}

void Linear::reset_parameters() {
  if (weight.numel() > 0) init::kaiming_uniform_(weight, std::sqrt(5.0));
  init_bias(bias, in_features);
}

Tensor Linear::forward(const Tensor& input) {
  return kiln::linear(input, weight, bias.defined() ? std::optional<Tensor>(bias) : std::nullopt);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(in_features) + ", out_features=" +
         std::to_string(out_features) + ", bias=" + py_bool(bias.defined());
}

Bilinear::Bilinear(int64_t in1, int64_t in2, int64_t out, bool has_bias)
    : Module("Bilinear"), in1_features(in1), in2_features(in2), out_features(out) {
  register_parameter("weight", kiln::empty({out, in1, in2}), &weight);
  register_parameter("bias", has_bias ? kiln::empty({out}) : Tensor(), &bias);
  reset_parameters();
}

void Bilinear::reset_parameters() {
  double bound = in1_features > 0 ? 1 / std::sqrt(static_cast<double>(in1_features)) : 0;
  init::uniform_(weight, -bound, bound);
  if (bias.defined()) init::uniform_(bias, -bound, bound);
}

Tensor Bilinear::forward(const Tensor& input1, const Tensor& input2) {
  return functional::bilinear(input1, input2, weight,
                              bias.defined() ? std::optional<Tensor>(bias) : std::nullopt);
}

std::string Bilinear::extra_repr() const {
  return "in1_features=" + std::to_string(in1_features) + ", in2_features=" +
         std::to_string(in2_features) + ", out_features=" + std::to_string(out_features) +
         ", bias=" + py_bool(bias.defined());
}

// ---- convolution --------------------------------------------------------------------------------

ConvNd::ConvNd(std::string type_name, int64_t spatial, bool transposed_, int64_t in,
               int64_t out, std::vector<int64_t> kernel, const ConvArgs& args)
    : Module(type_name), in_channels(in), out_channels(out), groups(args.groups),
      transposed(transposed_) {
  const char* name = type_name.c_str();
  kernel_size = expand_arg(name, "kernel_size", kernel, spatial);
  stride = expand_arg(name, "stride", args.stride, spatial);
  padding = expand_arg(name, "padding", args.padding, spatial);
  dilation = expand_arg(name, "dilation", args.dilation, spatial);
  output_padding = expand_arg(name, "output_padding", args.output_padding, spatial);
  KILN_CHECK(groups > 0 && in % groups == 0 && out % groups == 0, Value, name,
             ": in_channels (", in, ") and out_channels (", out,
             ") must be divisible by groups (", groups, ")");
  std::vector<int64_t> wshape = transposed ? std::vector<int64_t>{in, out / groups}
                                           : std::vector<int64_t>{out, in / groups};
  wshape.insert(wshape.end(), kernel_size.begin(), kernel_size.end());
  register_parameter("weight", kiln::empty(wshape), &weight);
  register_parameter("bias", args.bias ? kiln::empty({out}) : Tensor(), &bias);
  reset_parameters();
}

void ConvNd::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  init_bias(bias, init::calculate_fan_in_and_fan_out(weight).first);
}

std::optional<Tensor> ConvNd::bias_arg() const {
  return bias.defined() ? std::optional<Tensor>(bias) : std::nullopt;
}

std::string ConvNd::extra_repr() const {
  auto all = [](const std::vector<int64_t>& v, int64_t x) {
    for (int64_t e : v)
      if (e != x) return false;
    return true;
  };
  std::string s = std::to_string(in_channels) + ", " + std::to_string(out_channels) +
                  ", kernel_size=" + py_tuple(kernel_size) + ", stride=" + py_tuple(stride);
  if (!all(padding, 0)) s += ", padding=" + py_tuple(padding);
  if (!all(dilation, 1)) s += ", dilation=" + py_tuple(dilation);
  if (!all(output_padding, 0)) s += ", output_padding=" + py_tuple(output_padding);
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias.defined()) s += ", bias=False";
  return s;
}

Conv1d::Conv1d(int64_t in, int64_t out, std::vector<int64_t> kernel, const ConvArgs& args)
    : ConvNd("Conv1d", 1, false, in, out, std::move(kernel), args) {}

Tensor Conv1d::forward(const Tensor& input) {
  return kiln::conv1d(input, weight, bias_arg(), stride, padding, dilation, groups);
}

Conv2d::Conv2d(int64_t in, int64_t out, std::vector<int64_t> kernel, const ConvArgs& args)
    : ConvNd("Conv2d", 2, false, in, out, std::move(kernel), args) {}

Tensor Conv2d::forward(const Tensor& input) {
  return kiln::conv2d(input, weight, bias_arg(), stride, padding, dilation, groups);
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, std::vector<int64_t> kernel,
                                 const ConvArgs& args)
    : ConvNd("ConvTranspose2d", 2, true, in, out, std::move(kernel), args) {}

Tensor ConvTranspose2d::forward(const Tensor& input) {
  return kiln::conv_transpose2d(input, weight, bias_arg(), stride, padding, output_padding,
                                groups, dilation);
}

// ---- pooling ------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p,
                     std::vector<int64_t> d, bool ceil)
    : Module("MaxPool2d"), kernel_size(std::move(k)), stride(s.empty() ? kernel_size : std::move(s)),
      padding(std::move(p)), dilation(std::move(d)), ceil_mode(ceil) {}

Tensor MaxPool2d::forward(const Tensor& input) {
  return kiln::max_pool2d(input, expand_arg("MaxPool2d", "kernel_size", kernel_size, 2),
                          expand_arg("MaxPool2d", "stride", stride, 2),
                          expand_arg("MaxPool2d", "padding", padding, 2),
                          expand_arg("MaxPool2d", "dilation", dilation, 2), ceil_mode);
}

std::string MaxPool2d::extra_repr() const {
  return "kernel_size=" + py_int_or_tuple(kernel_size) + ", stride=" + py_int_or_tuple(stride) +
         ", padding=" + py_int_or_tuple(padding) + ", dilation=" + py_int_or_tuple(dilation) +
         ", ceil_mode=" + py_bool(ceil_mode);
}

AvgPool2d::AvgPool2d(std::vector<int64_t> k, std::vector<int64_t> s, std::vector<int64_t> p,
                     bool ceil, bool count_pad, std::optional<int64_t> divisor)
    : Module("AvgPool2d"), kernel_size(std::move(k)), stride(s.empty() ? kernel_size : std::move(s)),
      padding(std::move(p)), ceil_mode(ceil), count_include_pad(count_pad),
      divisor_override(divisor) {}

Tensor AvgPool2d::forward(const Tensor& input) {
  return kiln::avg_pool2d(input, expand_arg("AvgPool2d", "kernel_size", kernel_size, 2),
                          expand_arg("AvgPool2d", "stride", stride, 2),
                          expand_arg("AvgPool2d", "padding", padding, 2), ceil_mode,
                          count_include_pad, divisor_override);
}

std::string AvgPool2d::extra_repr() const {
  return "kernel_size=" + py_int_or_tuple(kernel_size) + ", stride=" + py_int_or_tuple(stride) +
         ", padding=" + py_int_or_tuple(padding);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::vector<int64_t> size)
    : Module("AdaptiveAvgPool2d"), output_size(std::move(size)) {}

Tensor AdaptiveAvgPool2d::forward(const Tensor& input) {
  return kiln::adaptive_avg_pool2d(input, expand_arg("AdaptiveAvgPool2d", "output_size",
                                                     output_size, 2));
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + py_int_or_tuple(output_size);
}

// ---- normalization ------------------------------------------------------------------------------

BatchNorm::BatchNorm(std::string type_name, int64_t n, double eps_, std::optional<double> mom,
                     bool affine_, bool track)
    : Module(std::move(type_name)), num_features(n), eps(eps_), momentum(mom), affine(affine_),
      track_running_stats(track) {
  if (affine) {
    register_parameter("weight", kiln::ones({n}), &weight);
    register_parameter("bias", kiln::zeros({n}), &bias);
  }
  if (track) {
    register_buffer("running_mean", kiln::zeros({n}), &running_mean);
    register_buffer("running_var", kiln::ones({n}), &running_var);
    register_buffer("num_batches_tracked", kiln::zeros({}, kInt64), &num_batches_tracked);
  }
}

void BatchNorm::reset_running_stats() {
  if (!track_running_stats) return;
  init::zeros_(running_mean);
  init::ones_(running_var);
  init::zeros_(num_batches_tracked);
}

Tensor BatchNorm::forward(const Tensor& input) {
  check_input_dim(input);
  KILN_CHECK(input.size(1) == num_features, Value, type_name(), ": expected ", num_features,
             " channels in dim 1, got input of shape ", input.sizes());
  double factor = momentum.value_or(0.0);
  if (is_training() && track_running_stats) {
    autograd::NoGradGuard g;
    num_batches_tracked.add_(scalar_to_tensor(1));
    if (!momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
  }
  const bool use_batch_stats = is_training() || !track_running_stats;
  auto opt = [](const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; };
  return kiln::batch_norm(input, opt(weight), opt(bias), opt(running_mean), opt(running_var),
                          use_batch_stats, factor, eps);
}

std::string BatchNorm::extra_repr() const {
  return std::to_string(num_features) + ", eps=" + py_float(eps) +
         ", momentum=" + (momentum ? py_float(*momentum) : "None") + ", affine=" +
         py_bool(affine) + ", track_running_stats=" + py_bool(track_running_stats);
}

void BatchNorm1d::check_input_dim(const Tensor& input) const {
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, Value, "BatchNorm1d: expected 2D or 3D input "
             "(got ", input.dim(), "D input of shape ", input.sizes(), ")");
}

void BatchNorm2d::check_input_dim(const Tensor& input) const {
  KILN_CHECK(input.dim() == 4, Value, "BatchNorm2d: expected 4D input (got ", input.dim(),
             "D input of shape ", input.sizes(), ")");
}

LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps_, bool affine, bool has_bias)
    : Module("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_),
      elementwise_affine(affine) {
  if (!affine) return;
  register_parameter("weight", kiln::ones(normalized_shape), &weight);
  register_parameter("bias", has_bias ? kiln::zeros(normalized_shape) : Tensor(), &bias);
}

Tensor LayerNorm::forward(const Tensor& input) {
  auto opt = [](const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; };
  return kiln::layer_norm(input, normalized_shape, opt(weight), opt(bias), eps);
}

std::string LayerNorm::extra_repr() const {
  return py_tuple(normalized_shape) + ", eps=" + py_float(eps) +
         ", elementwise_affine=" + py_bool(elementwise_affine);
}

RMSNorm::RMSNorm(std::vector<int64_t> shape, std::optional<double> eps_, bool affine)
    : Module("RMSNorm"), normalized_shape(std::move(shape)), eps(eps_), elementwise_affine(affine) {
  if (affine) register_parameter("weight", kiln::ones(normalized_shape), &weight);
}

Tensor RMSNorm::forward(const Tensor& input) {
  return kiln::rms_norm(input, normalized_shape,
                        weight.defined() ? std::optional<Tensor>(weight) : std::nullopt, eps);
}

std::string RMSNorm::extra_repr() const {
  return py_tuple(normalized_shape) + ", eps=" + (eps ? py_float(*eps) : "None") +
         ", elementwise_affine=" + py_bool(elementwise_affine);
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine_)
    : Module("GroupNorm"), num_groups(groups), num_channels(channels), eps(eps_), affine(affine_) {
  KILN_CHECK(groups > 0 && channels % groups == 0, Value, "GroupNorm: num_channels (", channels,
             ") must be divisible by num_groups (", groups, ")");
  if (!affine) return;
  register_parameter("weight", kiln::ones({channels}), &weight);
  register_parameter("bias", kiln::zeros({channels}), &bias);
}

Tensor GroupNorm::forward(const Tensor& input) {
  auto opt = [](const Tensor& t) { return t.defined() ? std::optional<Tensor>(t) : std::nullopt; };
  return kiln::group_norm(input, num_groups, opt(weight), opt(bias), eps);
}

std::string GroupNorm::extra_repr() const {
  return std::to_string(num_groups) + ", " + std::to_string(num_channels) + ", eps=" +
         py_float(eps) + ", affine=" + py_bool(affine);
}

// ---- Embedding, Dropout, Flatten ----------------------------------------------------------------

Embedding::Embedding(int64_t num, int64_t dim, std::optional<int64_t> pad)
    : Module("Embedding"), num_embeddings(num), embedding_dim(dim) {
  if (pad) {
    KILN_CHECK(*pad < num && *pad >= -num, Value, "Embedding: padding_idx ", *pad,
               " must be within num_embeddings (", num, ")");
    padding_idx = *pad < 0 ? *pad + num : *pad;
  }
  register_parameter("weight", kiln::empty({num, dim}), &weight);
  init::normal_(weight);
  if (padding_idx) {
    autograd::NoGradGuard g;
    weight.select(0, *padding_idx).fill_(0);
  }
}

Tensor Embedding::forward(const Tensor& indices) {
  return kiln::embedding(weight, indices, padding_idx.value_or(-1));
}

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
  if (padding_idx) s += ", padding_idx=" + std::to_string(*padding_idx);
  return s;
}

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  KILN_CHECK(p >= 0 && p <= 1, Value, "Dropout: probability has to be between 0 and 1, but got ",
             p);
}

Tensor Dropout::forward(const Tensor& input) { return kiln::dropout(input, p, is_training()); }

std::string Dropout::extra_repr() const { return "p=" + py_float(p) + ", inplace=False"; }

std::string Flatten::extra_repr() const {
  return "start_dim=" + std::to_string(start_dim) + ", end_dim=" + std::to_string(end_dim);
}

}  // namespace kiln::nn
