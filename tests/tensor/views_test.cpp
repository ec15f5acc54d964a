// Views share storage and the version counter; geometry is bounds-checked.
#include <gtest/gtest.h>

#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_error;
using testing::to_doubles;

Tensor iota(IntArrayRef sizes) {
  return arange(0, numel_of(sizes)).to(kFloat32).view(sizes);
}

TEST(Views, ShareStorageAndVersion) {
  Tensor a = iota({3, 4});
  Tensor views[] = {a.view({4, 3}), a.t(), a.transpose(0, 1), a.permute({1, 0}), a.select(0, 1),
                    a.slice(1, 1, 3), a.narrow(0, 1, 2), a.unsqueeze(0), a.flatten(),
                    a.diagonal(), a.as_strided({2}, {5}, 1), a.expand({2, 3, 4}), a.alias(),
                    a.unsqueeze(1).squeeze(std::nullopt), a.unflatten(1, {2, 2}), a.reshape({12})};
  uint32_t v0 = a.version();
  for (const Tensor& v : views) {
    EXPECT_TRUE(v.is_alias_of(a));
    EXPECT_EQ(v.version(), v0);
  }
  views[4].fill_(7);  // writes row 1 through a view
  for (const Tensor& v : views) EXPECT_GT(v.version(), v0);
  EXPECT_EQ(to_doubles(a.select(0, 1)), std::vector<double>(4, 7.0));
}

TEST(Views, Geometry) {
  Tensor a = iota({2, 3, 4});
  Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), IntArrayRef({4, 2, 3}));
  EXPECT_EQ(p.strides(), IntArrayRef({1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());
  EXPECT_TRUE(p.contiguous().is_contiguous());
  EXPECT_EQ(to_doubles(a.select(1, 2).select(0, 1)), (std::vector<double>{20, 21, 22, 23}));
  EXPECT_EQ(to_doubles(a.slice(2, 1, std::nullopt, 2).select(0, 0).select(0, 0)), (std::vector<double>{1, 3}));
  EXPECT_EQ(to_doubles(iota({3, 3}).diagonal(1)), (std::vector<double>{1, 5}));
  EXPECT_EQ(to_doubles(iota({3, 3}).diagonal(-1)), (std::vector<double>{3, 7}));
  EXPECT_EQ(a.expand({5, 2, 3, 4}).stride(0), 0);
  EXPECT_EQ(a.view({-1}).numel(), 24);
  EXPECT_EQ(a.slice(0, -1, std::nullopt, 1).size(0), 1);
  EXPECT_EQ(a.slice(0, 5, 10, 1).size(0), 0);  // clamped like Python slicing
  EXPECT_EQ(zeros({}).unsqueeze(0).sizes(), IntArrayRef({1}));
  EXPECT_EQ(zeros({0, 3}).view({3, 0}).sizes(), IntArrayRef({3, 0}));
}

TEST(Views, ReshapeCopiesWhenItMust) {
  Tensor a = iota({3, 4});
  Tensor r = a.t().reshape({12});
  EXPECT_FALSE(r.is_alias_of(a));
  EXPECT_EQ(to_doubles(r)[1], 4.0);
  EXPECT_TRUE(a.reshape({4, 3}).is_alias_of(a));
  expect_error(ErrorKind::Value, "use reshape", [&] { a.t().view({12}); });
}

TEST(Views, BadInput) {
  Tensor a = iota({2, 3});
  expect_error(ErrorKind::Index, "dimension out of range", [&] { a.transpose(0, 2); });
  expect_error(ErrorKind::Index, "out of range", [&] { a.select(1, 3); });
  expect_error(ErrorKind::Value, "is invalid for input of size 6", [&] { a.view({4, -1}); });
  expect_error(ErrorKind::Value, "only one dimension can be inferred", [&] { a.view({-1, -1}); });
  expect_error(ErrorKind::Value, "must match the existing size", [&] { a.expand({3, 3}); });
  expect_error(ErrorKind::Value, "repeated dim", [&] { a.permute({0, 0}); });
  expect_error(ErrorKind::Value, "expects a tensor with <= 2", [&] { zeros({1, 2, 3}).t(); });
  expect_error(ErrorKind::Index, "outside a storage of 6 elements", [&] { a.as_strided({2, 3}, {3, 2}, 0); });
  expect_error(ErrorKind::Index, "outside a storage", [&] { a.as_strided({1}, {1}, 6); });
  expect_error(ErrorKind::Value, "negative stride", [&] { a.as_strided({2}, {-1}, 3); });
  expect_error(ErrorKind::Index, "exceeds dimension size", [&] { a.narrow(1, 2, 2); });
  expect_error(ErrorKind::Value, "step must be positive", [&] { a.slice(0, 0, 2, 0); });
}

TEST(Views, AsStridedBoundsOnSlices) {
  Tensor a = iota({4});
  Tensor tail = a.slice(0, 2, 4, 1);
  // as_strided addresses the whole storage, from the storage start, like PyTorch.
  EXPECT_EQ(to_doubles(tail.as_strided({4}, {1}, 0)), (std::vector<double>{0, 1, 2, 3}));
  testing::expect_error(ErrorKind::Index, "outside a storage", [&] { tail.as_strided({3}, {1}, 2); });
}

TEST(Copy, AllDtypePairsAndBroadcast) {
  const ScalarType all[] = {kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};
  Tensor src = testing::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  for (ScalarType from : all) {
    for (ScalarType to : all) {
      Tensor s = src.to(from);
      Tensor d = empty({3, 2}, to).t();  // non-contiguous destination
      d.copy_(s);
      auto got = to_doubles(d);
      for (int i = 0; i < 6; ++i) {
        double want = (from == kBool || to == kBool) ? (i != 0) : i;
        EXPECT_EQ(got[i], want) << from << " -> " << to;
      }
    }
  }
  Tensor row = testing::from_vector<double>({1, 2, 3}, {3});
  Tensor d = zeros({2, 3});
  d.copy_(row);
  EXPECT_EQ(to_doubles(d), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  testing::expect_error(ErrorKind::Value, "cannot be broadcast", [&] { row.copy_(d); });
}

TEST(Creation, Basics) {
  EXPECT_EQ(to_doubles(arange(0, 5, 2)), (std::vector<double>{0, 2, 4}));
  EXPECT_EQ(arange(0, 5).dtype(), kInt64);
  EXPECT_EQ(arange(0.0, 1.0, 0.25).dtype(), kFloat32);
  EXPECT_EQ(arange(0.0, 1.0, 0.25).numel(), 4);
  EXPECT_EQ(to_doubles(arange(5, 0, -2)), (std::vector<double>{5, 3, 1}));
  EXPECT_EQ(to_doubles(linspace(0, 1, 5)), (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(to_doubles(eye(2, 3)), (std::vector<double>{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(full({2}, 3).dtype(), kInt64);
  EXPECT_EQ(full({2}, 3.5).dtype(), kFloat32);
  EXPECT_EQ(full({2}, true).dtype(), kBool);
  EXPECT_EQ(to_doubles(ones_like(zeros({2}, kInt8))), (std::vector<double>{1, 1}));
  EXPECT_EQ(zeros({2, 0}).numel(), 0);
  expect_error(ErrorKind::Value, "negative dimension", [] { empty({-1}); });
  expect_error(ErrorKind::Value, "too large to allocate", [] { empty({int64_t{1} << 40, int64_t{1} << 40}); });
  expect_error(ErrorKind::Runtime, "out of memory", [] { empty({int64_t{1} << 50}, kInt8); });
  expect_error(ErrorKind::Value, "step must be nonzero", [] { arange(0, 1, 0); });
  expect_error(ErrorKind::Value, "inconsistent with step sign", [] { arange(0, 10, -1); });
  expect_error(ErrorKind::Value, "non-negative", [] { linspace(0, 1, -1); });
}

TEST(Printing, LooksLikePyTorch) {
  EXPECT_EQ(iota({2, 2}).repr(), "tensor([[0., 1.],\n        [2., 3.]])");
  EXPECT_EQ(arange(0, 3).repr(), "tensor([0, 1, 2])");
  EXPECT_EQ(testing::from_vector<float>({0.5f, -1.25f}, {2}).repr(), "tensor([ 0.5000, -1.2500])");
  EXPECT_EQ(zeros({2}, kFloat64).repr(), "tensor([0., 0.], dtype=kiln.float64)");
  EXPECT_EQ(full({2}, true).repr(), "tensor([True, True])");
  EXPECT_EQ(empty({2, 3}, std::nullopt, Device("meta")).repr(),
            "tensor(..., device='meta', size=(2, 3), dtype=kiln.float32)");
  std::string big = zeros({2000}).repr();
  EXPECT_NE(big.find("..."), std::string::npos);
  EXPECT_LT(big.size(), 200u);
}

TEST(Item, ScalarsAndErrors) {
  EXPECT_EQ(full({1, 1}, 2.5).item<float>(), 2.5f);
  EXPECT_EQ(arange(3, 4).item<int64_t>(), 3);
  expect_error(ErrorKind::Value, "a Tensor with 2 elements cannot be converted to Scalar",
               [] { zeros({2}).item(); });
  expect_error(ErrorKind::Runtime, "no local storage", [] { empty({2}, std::nullopt, Device("meta")).data_ptr(); });
  expect_error(ErrorKind::Type, "data_ptr<float64>", [] { zeros({2}).data_ptr<double>(); });
}

}  // namespace
}  // namespace kiln
