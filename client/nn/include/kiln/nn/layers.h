// kiln/nn/layers.h: the standard layers (torch.nn's), initialised as PyTorch initialises them
// and named as PyTorch names their parameters, so state dicts carry over key for key.
//
//   auto conv = std::make_shared<kiln::nn::Conv2d>(3, 16, std::vector<int64_t>{3},
//                                                  kiln::nn::ConvArgs{.padding = {1}});
//   auto bn = std::make_shared<kiln::nn::BatchNorm2d>(16);
//   kiln::Tensor y = kiln::relu(bn->forward(conv->forward(x)));
//   std::cout << *conv;   // Conv2d(3, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::nn {

// ---- linear -------------------------------------------------------------------------------------

// x: (*, in) -> (*, out). weight (out, in) and bias (out) ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in_features, out_features;
  Tensor weight, bias;
};

// x1: (*, in1), x2: (*, in2) -> (*, out). weight (out, in1, in2), bias (out) ~ U(±1/sqrt(in1)).
class Bilinear : public Module {
 public:
  Bilinear(int64_t in1_features, int64_t in2_features, int64_t out_features, bool bias = true);
  using Module::forward;
  Tensor forward(const Tensor& input1, const Tensor& input2);
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in1_features, in2_features, out_features;
  Tensor weight, bias;
};

// ---- convolution --------------------------------------------------------------------------------

// A one-element list stands for every spatial dim (PyTorch's int form).
struct ConvArgs {
  std::vector<int64_t> stride = {1};
  std::vector<int64_t> padding = {0};
  std::vector<int64_t> dilation = {1};
  int64_t groups = 1;
  bool bias = true;
  std::vector<int64_t> output_padding = {0};  // ConvTranspose2d only
};

// The shared part of Conv1d, Conv2d and ConvTranspose2d: weight (out, in/groups, *k) or, for
// the transposed form, (in, out/groups, *k); kaiming_uniform_(a=sqrt(5)) and a bias in
// U(±1/sqrt(fan_in)), as PyTorch's _ConvNd.reset_parameters.
class ConvNd : public Module {
 public:
  ConvNd(std::string type_name, int64_t spatial, bool transposed, int64_t in_channels,
         int64_t out_channels, std::vector<int64_t> kernel_size, const ConvArgs& args);
  std::string extra_repr() const override;
  void reset_parameters();
  int64_t in_channels, out_channels, groups;
  std::vector<int64_t> kernel_size, stride, padding, dilation, output_padding;
  bool transposed;
  Tensor weight, bias;

 protected:
  std::optional<Tensor> bias_arg() const;
};

// x: (N, C, L) or (C, L).
class Conv1d : public ConvNd {
 public:
  Conv1d(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_size,
         const ConvArgs& args = {});
  Tensor forward(const Tensor& input) override;
};

// x: (N, C, H, W) or (C, H, W).
class Conv2d : public ConvNd {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_size,
         const ConvArgs& args = {});
  Tensor forward(const Tensor& input) override;
};

class ConvTranspose2d : public ConvNd {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, std::vector<int64_t> kernel_size,
                  const ConvArgs& args = {});
  Tensor forward(const Tensor& input) override;
};

// ---- pooling ------------------------------------------------------------------------------------

class MaxPool2d : public Module {
 public:
  // stride {} means stride = kernel_size.
  MaxPool2d(std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
            std::vector<int64_t> padding = {0}, std::vector<int64_t> dilation = {1},
            bool ceil_mode = false);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::vector<int64_t> kernel_size, stride, padding, dilation;
  bool ceil_mode;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(std::vector<int64_t> kernel_size, std::vector<int64_t> stride = {},
            std::vector<int64_t> padding = {0}, bool ceil_mode = false,
            bool count_include_pad = true, std::optional<int64_t> divisor_override = std::nullopt);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::vector<int64_t> kernel_size, stride, padding;
  bool ceil_mode, count_include_pad;
  std::optional<int64_t> divisor_override;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(std::vector<int64_t> output_size);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::vector<int64_t> output_size;
};

// ---- normalization ------------------------------------------------------------------------------

// BatchNorm1d ((N, C) or (N, C, L)) and BatchNorm2d ((N, C, H, W)). Buffers running_mean,
// running_var and num_batches_tracked (int64) when track_running_stats; momentum nullopt is
// the cumulative average (1 / num_batches_tracked).
class BatchNorm : public Module {
 public:
  BatchNorm(std::string type_name, int64_t num_features, double eps, std::optional<double> momentum,
            bool affine, bool track_running_stats);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_running_stats();
  int64_t num_features;
  double eps;
  std::optional<double> momentum;
  bool affine, track_running_stats;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  virtual void check_input_dim(const Tensor& input) const = 0;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true)
      : BatchNorm("BatchNorm1d", num_features, eps, momentum, affine, track_running_stats) {}

 protected:
  void check_input_dim(const Tensor& input) const override;
};

class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5,
                       std::optional<double> momentum = 0.1, bool affine = true,
                       bool track_running_stats = true)
      : BatchNorm("BatchNorm2d", num_features, eps, momentum, affine, track_running_stats) {}

 protected:
  void check_input_dim(const Tensor& input) const override;
};

// Over the trailing normalized_shape dims; weight ones, bias zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::vector<int64_t> normalized_shape;
  double eps;
  bool elementwise_affine;
  Tensor weight, bias;
};

// eps nullopt: the dtype's machine epsilon (PyTorch's default).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(std::vector<int64_t> normalized_shape, std::optional<double> eps = std::nullopt,
                   bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  std::vector<int64_t> normalized_shape;
  std::optional<double> eps;
  bool elementwise_affine;
  Tensor weight;
};

class GroupNorm : public Module {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  int64_t num_groups, num_channels;
  double eps;
  bool affine;
  Tensor weight, bias;
};

// ---- embedding, dropout, shape ------------------------------------------------------------------

// indices: (*) int -> (*, embedding_dim). weight ~ N(0, 1), the padding_idx row zero (its
// gradient is zero too). A negative padding_idx counts from the end.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;
  int64_t num_embeddings, embedding_dim;
  std::optional<int64_t> padding_idx;
  Tensor weight;
};

// Zeroes elements with probability p while training and scales the rest by 1 / (1 - p).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  double p;
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& input) override { return input; }
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_dim, end_dim); }
  std::string extra_repr() const override;
  int64_t start_dim, end_dim;
};

// ---- activations --------------------------------------------------------------------------------

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& input) override { return kiln::relu(input); }
};

// approximate: "none" (erf) or "tanh".
class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none")
      : Module("GELU"), approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& input) override { return kiln::gelu(input, approximate); }
  std::string extra_repr() const override { return "approximate='" + approximate + "'"; }
  std::string approximate;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& input) override { return kiln::silu(input); }
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& input) override { return kiln::tanh(input); }
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& input) override { return kiln::sigmoid(input); }
};

class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim) : Module("Softmax"), dim(dim) {}
  Tensor forward(const Tensor& input) override { return kiln::softmax(input, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }
  int64_t dim;
};

class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim) : Module("LogSoftmax"), dim(dim) {}
  Tensor forward(const Tensor& input) override { return kiln::log_softmax(input, dim); }
  std::string extra_repr() const override { return "dim=" + std::to_string(dim); }
  int64_t dim;
};

// Python-style text of a number and a tuple, for extra_repr ("1e-05", "0.1", "(3, 3)", "(3,)").
std::string py_float(double v);
std::string py_tuple(const std::vector<int64_t>& v);

}  // namespace kiln::nn
