// Note [Dimension cap] and geometry overflow: 64 dimensions work everywhere, 65 are refused
// with a ValueError wherever a shape enters, and sizes or strides whose products overflow int64
// are refused instead of wrapping past the bounds check.
#include <gtest/gtest.h>

#include <limits>

#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_error;

DimVector ones_shape(int64_t n) { return DimVector(static_cast<size_t>(n), 1); }

TEST(Dims, SixtyFourDimensionsWork) {
  DimVector s = ones_shape(kMaxDims);
  s[0] = 2;
  s[kMaxDims - 1] = 3;
  Tensor a = ones(s);
  EXPECT_EQ(a.dim(), 64);
  EXPECT_EQ(a.numel(), 6);
  EXPECT_EQ(a.sum().item<float>(), 6.0f);
  Tensor b = a.transpose(0, 63).contiguous();
  EXPECT_EQ(b.size(0), 3);
  EXPECT_EQ(testing::to_doubles(b.view({6})), std::vector<double>(6, 1.0));
  EXPECT_EQ((a + a).dim(), 64);
  EXPECT_EQ(a.squeeze(std::nullopt).dim(), 2);
  EXPECT_EQ(empty_on(s, kFloat32, Device(DeviceType::Meta)).dim(), 64);
}

TEST(Dims, SixtyFiveAreRefusedWhereShapesEnter) {
  const char* msg = "has 65 dimensions; Kiln supports at most 64";
  DimVector s = ones_shape(65);
  expect_error(ErrorKind::Value, msg, [&] { ones(s); });
  expect_error(ErrorKind::Value, msg, [&] { empty_on(s, kFloat32, kCPU); });
  expect_error(ErrorKind::Value, msg, [&] { empty_on(s, kFloat32, Device(DeviceType::Meta)); });
  expect_error(ErrorKind::Value, msg, [&] { empty_strided_on(s, ones_shape(65), kInt8, kCPU); });
  Tensor a = ones(ones_shape(64));
  expect_error(ErrorKind::Value, msg, [&] { a.unsqueeze(0); });
  expect_error(ErrorKind::Value, msg, [&] { a.view(s); });
  expect_error(ErrorKind::Value, msg, [&] { a.reshape(s); });
  expect_error(ErrorKind::Value, msg, [&] { a.expand(s); });
  expect_error(ErrorKind::Value, msg, [&] { a.as_strided(s, ones_shape(65)); });
  expect_error(ErrorKind::Value, "has 1000 dimensions", [&] { ones({1}).view(ones_shape(1000)); });
}

TEST(Dims, OverflowingGeometryIsRefused) {
  Tensor one = ones({1});
  constexpr int64_t big = int64_t{1} << 40;
  // 2^80 elements: refused, not wrapped to a small numel.
  expect_error(ErrorKind::Value, "more than 2^63 elements", [&] { one.expand({big, big}); });
  expect_error(ErrorKind::Value, "more than 2^63 elements", [&] { numel_of({big, big}); });
  EXPECT_EQ(numel_of({big, big, 0}), 0);
  // (4 - 1) * 2^62 wraps to a small span in 64 bits; the bounds check must not be fooled.
  Tensor st = ones({8});
  expect_error(ErrorKind::Index, "beyond 2^63", [&] { st.as_strided({4}, {int64_t{1} << 62}); });
  expect_error(ErrorKind::Index, "beyond 2^63", [&] {
    st.as_strided({3, 2}, {std::numeric_limits<int64_t>::max(), 1});
  });
  expect_error(ErrorKind::Index, "outside a storage", [&] { st.as_strided({2}, {8}); });
  EXPECT_EQ(st.as_strided({2, 0}, {int64_t{1} << 62, 1}).numel(), 0);  // empty: nothing reached
}

}  // namespace
}  // namespace kiln
