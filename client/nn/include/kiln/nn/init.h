// kiln/nn/init.h: in-place parameter initialisers (PyTorch's torch.nn.init). Each fills its
// tensor without recording autograd and returns it; the random ones take an optional Generator
// (default: kiln::default_generator()).
//
//   kiln::Tensor w = kiln::empty({64, 32});
//   kiln::nn::init::kaiming_uniform_(w, std::sqrt(5.0));            // Linear's default
//   kiln::nn::init::xavier_normal_(w, kiln::nn::init::calculate_gain("tanh"));
//   kiln::nn::init::orthogonal_(w);
//   kiln::nn::init::trunc_normal_(w, 0, 0.02, -0.04, 0.04);
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "kiln/kiln.h"

namespace kiln::nn::init {

enum class FanMode { kFanIn, kFanOut };

// The recommended gain of a nonlinearity: linear/conv*/sigmoid 1, tanh 5/3, relu sqrt(2),
// leaky_relu sqrt(2 / (1 + slope^2)) (slope = param, default 0.01), selu 3/4.
double calculate_gain(const std::string& nonlinearity, std::optional<double> param = std::nullopt);
// (fan_in, fan_out) of a weight with at least 2 dims: size(1) and size(0) times the receptive
// field (the product of the remaining sizes).
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

Tensor uniform_(const Tensor& t, double a = 0, double b = 1,
                std::optional<Generator> gen = std::nullopt);
Tensor normal_(const Tensor& t, double mean = 0, double std = 1,
               std::optional<Generator> gen = std::nullopt);
// Normal(mean, std) restricted to [a, b], by the inverse CDF of a uniform draw.
Tensor trunc_normal_(const Tensor& t, double mean = 0, double std = 1, double a = -2, double b = 2,
                     std::optional<Generator> gen = std::nullopt);
Tensor constant_(const Tensor& t, double value);
Tensor zeros_(const Tensor& t);
Tensor ones_(const Tensor& t);
Tensor xavier_uniform_(const Tensor& t, double gain = 1, std::optional<Generator> gen = std::nullopt);
Tensor xavier_normal_(const Tensor& t, double gain = 1, std::optional<Generator> gen = std::nullopt);
Tensor kaiming_uniform_(const Tensor& t, double a = 0, FanMode mode = FanMode::kFanIn,
                        const std::string& nonlinearity = "leaky_relu",
                        std::optional<Generator> gen = std::nullopt);
Tensor kaiming_normal_(const Tensor& t, double a = 0, FanMode mode = FanMode::kFanIn,
                       const std::string& nonlinearity = "leaky_relu",
                       std::optional<Generator> gen = std::nullopt);
// A (semi-)orthogonal matrix (over dims 1.. flattened) from the QR decomposition of a normal
// draw, with R's diagonal signs folded in, times gain.
Tensor orthogonal_(const Tensor& t, double gain = 1, std::optional<Generator> gen = std::nullopt);

}  // namespace kiln::nn::init
