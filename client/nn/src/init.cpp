// nn::init (kiln/nn/init.h).
#include "kiln/nn/init.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/autograd/grad_mode.h"

namespace kiln::nn::init {

double calculate_gain(const std::string& nl, std::optional<double> param) {
  if (nl == "linear" || nl == "sigmoid" || nl.rfind("conv", 0) == 0) return 1;
  if (nl == "tanh") return 5.0 / 3;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "selu") return 0.75;
  if (nl == "leaky_relu") {
    double slope = param.value_or(0.01);
    return std::sqrt(2.0 / (1 + slope * slope));
  }
  KILN_FAIL(Value, "calculate_gain: unsupported nonlinearity \"", nl, "\"");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  KILN_CHECK(t.dim() >= 2, Value,
             "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions, "
             "got shape ", t.sizes());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor uniform_(const Tensor& t, double a, double b, std::optional<Generator> gen) {
  autograd::NoGradGuard g;
  return kiln::uniform_(t, a, b, gen);
}

Tensor normal_(const Tensor& t, double mean, double std, std::optional<Generator> gen) {
  autograd::NoGradGuard g;
  return kiln::normal_(t, mean, std, gen);
}

// erf^-1 on (-1, 1): Giles' single-precision approximation, then two Newton steps on erf.
static double erfinv(double y) {
  double w = -std::log((1 - y) * (1 + y)), x;
  if (w < 5) {
    w -= 2.5;
    x = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                     -0.00125372503, -0.00417768164, 0.246640727, 1.50140941})
      x = c + x * w;
  } else {
    w = std::sqrt(w) - 3;
    x = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                     -0.0076224613, 0.00943887047, 1.00167406, 2.83297682})
      x = c + x * w;
  }
  x *= y;
  for (int i = 0; i < 2; ++i) x -= (std::erf(x) - y) / (2 / std::sqrt(M_PI) * std::exp(-x * x));
  return x;
}

Tensor trunc_normal_(const Tensor& t, double mean, double std, double a, double b,
                     std::optional<Generator> gen) {
  KILN_CHECK(a < b && std > 0, Value, "trunc_normal_: need a < b and std > 0, got a=", a,
             ", b=", b, ", std=", std);
  autograd::NoGradGuard g;
  auto cdf = [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); };
  const double lo = 2 * cdf((a - mean) / std) - 1, hi = 2 * cdf((b - mean) / std) - 1;
  Tensor u = kiln::uniform_(kiln::empty(t.sizes(), kFloat64), lo, hi, gen);
  double* p = u.data_ptr<double>();
  for (int64_t i = 0; i < u.numel(); ++i)
    p[i] = std::clamp(mean + std * std::sqrt(2.0) * erfinv(p[i]), a, b);
  return t.copy_(u);
}

Tensor constant_(const Tensor& t, double value) {
  autograd::NoGradGuard g;
  return t.fill_(value);
}
Tensor zeros_(const Tensor& t) { return constant_(t, 0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1); }

Tensor xavier_uniform_(const Tensor& t, double gain, std::optional<Generator> gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return init::uniform_(t, -std::sqrt(3.0) * std, std::sqrt(3.0) * std, gen);
}

Tensor xavier_normal_(const Tensor& t, double gain, std::optional<Generator> gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return init::normal_(t, 0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

static double kaiming_std(const Tensor& t, double a, FanMode mode, const std::string& nl) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  int64_t fan = mode == FanMode::kFanIn ? fan_in : fan_out;
  KILN_CHECK(fan > 0, Value, "kaiming init of a zero-element tensor of shape ", t.sizes());
  return calculate_gain(nl, a) / std::sqrt(static_cast<double>(fan));
}

Tensor kaiming_uniform_(const Tensor& t, double a, FanMode mode, const std::string& nl,
                        std::optional<Generator> gen) {
  double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nl);
  return init::uniform_(t, -bound, bound, gen);
}

Tensor kaiming_normal_(const Tensor& t, double a, FanMode mode, const std::string& nl,
                       std::optional<Generator> gen) {
  return init::normal_(t, 0, kaiming_std(t, a, mode, nl), gen);
}

// q: (rows, cols) row-major, rows >= cols: orthonormalises the columns in place (modified
// Gram-Schmidt in float64). Gram-Schmidt's R has a positive diagonal, so this Q is the
// Q·diag(sign(diag R)) that PyTorch's orthogonal_ takes from a Householder QR.
static void orthonormal_columns(std::vector<double>& q, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t k = 0; k < j; ++k) {
      double dot = 0;
      for (int64_t i = 0; i < rows; ++i) dot += q[i * cols + k] * q[i * cols + j];
      for (int64_t i = 0; i < rows; ++i) q[i * cols + j] -= dot * q[i * cols + k];
    }
    double norm = 0;
    for (int64_t i = 0; i < rows; ++i) norm += q[i * cols + j] * q[i * cols + j];
    norm = std::sqrt(norm);
    KILN_CHECK(norm > 0, Runtime, "orthogonal_: degenerate random draw");
    for (int64_t i = 0; i < rows; ++i) q[i * cols + j] /= norm;
  }
}

Tensor orthogonal_(const Tensor& t, double gain, std::optional<Generator> gen) {
  KILN_CHECK(t.dim() >= 2, Value, "orthogonal_: only tensors with 2 or more dimensions are "
             "supported, got shape ", t.sizes());
  if (t.numel() == 0) return t;
  autograd::NoGradGuard g;
  const int64_t rows = t.size(0), cols = t.numel() / rows;
  const bool wide = rows < cols;  // orthonormalise the transpose
  const int64_t r = wide ? cols : rows, c = wide ? rows : cols;
  Tensor draw = kiln::normal_(kiln::empty({r, c}, kFloat64), 0, 1, gen);
  std::vector<double> q(draw.data_ptr<double>(), draw.data_ptr<double>() + r * c);
  orthonormal_columns(q, r, c);
  Tensor out = kiln::empty({rows, cols}, kFloat64);
  double* o = out.data_ptr<double>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) o[i * cols + j] = gain * (wide ? q[j * c + i] : q[i * c + j]);
  return t.copy_(out.reshape(t.sizes()));
}

}  // namespace kiln::nn::init
