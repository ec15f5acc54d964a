// Meta functions for the random ops (tensor/ops/random.toml). They validate everything that
// does not need data; bernoulli's probability range is checked by the kernels.
#include "kiln/generated/meta/random.h"

#include <cmath>
#include <limits>

#include "kiln/default_device.h"
#include "kiln/generated/meta/creation.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

DimVector checked_size(const char* op, IntArrayRef size) {
  for (int64_t s : size)
    KILN_CHECK(s >= 0, Value, op, ": negative dimension ", s, " in size ", size);
  return DimVector(size);
}

void check_floating(const char* op, ScalarType t) {
  KILN_CHECK(is_floating(t), Type, op, ": expected a floating dtype, got ", t);
}

// Largest integer `t` holds exactly, and the lowest value it holds (integers only).
int64_t exact_max(ScalarType t) {
  switch (t) {
    case kUInt8: return std::numeric_limits<uint8_t>::max();
    case kInt8: return std::numeric_limits<int8_t>::max();
    case kInt16: return std::numeric_limits<int16_t>::max();
    case kInt32: return std::numeric_limits<int32_t>::max();
    case kInt64: return std::numeric_limits<int64_t>::max();
    case kFloat16: return int64_t{1} << 11;
    case kBFloat16: return int64_t{1} << 8;
    case kFloat32: return int64_t{1} << 24;
    case kFloat64: return int64_t{1} << 53;
    default: return 1;
  }
}

int64_t lowest(ScalarType t) {
  switch (t) {
    case kUInt8: return 0;
    case kInt8: return std::numeric_limits<int8_t>::min();
    case kInt16: return std::numeric_limits<int16_t>::min();
    case kInt32: return std::numeric_limits<int32_t>::min();
    case kInt64: return std::numeric_limits<int64_t>::min();
    case kBool: return 0;
    default: return -exact_max(t);
  }
}

}  // namespace

TensorSpec rand(IntArrayRef size, std::optional<Generator>, std::optional<ScalarType> dtype,
                std::optional<Device> device) {
  ScalarType t = dtype.value_or(kFloat32);
  check_floating("rand", t);
  return contiguous_spec(checked_size("rand", size), t, device ? *device : default_device());
}

TensorSpec randn(IntArrayRef size, std::optional<Generator>, std::optional<ScalarType> dtype,
                 std::optional<Device> device) {
  ScalarType t = dtype.value_or(kFloat32);
  check_floating("randn", t);
  return contiguous_spec(checked_size("randn", size), t, device ? *device : default_device());
}

TensorSpec randint(int64_t low, int64_t high, IntArrayRef size, std::optional<Generator>,
                   std::optional<ScalarType> dtype, std::optional<Device> device) {
  ScalarType t = dtype.value_or(kInt64);
  KILN_CHECK(t != kBool, Type, "randint: bool is not a supported dtype");
  KILN_CHECK(low < high, Value, "randint: expected low < high, but got low=", low, ", high=", high);
  // Every value of [low, high - 1] must be representable (exactly, for floating dtypes).
  KILN_CHECK(low >= lowest(t) && high - 1 <= exact_max(t), Value, "randint: range [", low, ", ",
             high, ") does not fit in dtype ", t);
  return contiguous_spec(checked_size("randint", size), t, device ? *device : default_device());
}

TensorSpec normal_(const Tensor& self, double mean, double stddev, std::optional<Generator>) {
  check_floating("normal_", self.dtype());
  KILN_CHECK(stddev >= 0.0, Value, "normal_: expected std >= 0.0, but found std ", stddev);
  KILN_CHECK(std::isfinite(mean) && std::isfinite(stddev), Value,
             "normal_: expected finite mean and std, got mean=", mean, ", std=", stddev);
  return same_inplace(self);
}

TensorSpec uniform_(const Tensor& self, double from, double to, std::optional<Generator>) {
  check_floating("uniform_", self.dtype());
  KILN_CHECK(from <= to, Value, "uniform_: expected a [from, to) range, but found from=", from,
             " > to=", to);
  KILN_CHECK(std::isfinite(to - from), Value, "uniform_: range [", from, ", ", to,
             ") is not finite");
  return same_inplace(self);
}

TensorSpec bernoulli(const Tensor& self, std::optional<Generator>) {
  check_floating("bernoulli", self.dtype());
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec randperm(int64_t n, std::optional<Generator>, std::optional<ScalarType> dtype,
                    std::optional<Device> device) {
  ScalarType t = dtype.value_or(kInt64);
  KILN_CHECK(t != kBool, Type, "randperm: bool is not a supported dtype");
  KILN_CHECK(n >= 0, Value, "randperm: n must be non-negative, got ", n);
  KILN_CHECK(n == 0 || n - 1 <= exact_max(t), Value, "randperm: n=", n,
             " is too large for dtype ", t);
  return contiguous_spec({n}, t, device ? *device : default_device());
}

}  // namespace kiln::meta
