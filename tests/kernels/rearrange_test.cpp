// flip, roll, repeat, repeat_interleave, constant_pad_nd and pad against naive references
// (tensor/ops/shape.toml).
#include <gtest/gtest.h>

#include "autograd/gradgradcheck.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Ints = std::vector<int64_t>;

// out[i] = x[map(i)] over out_sizes, map giving the source multi-index (or empty for `fill`).
Tensor ref_map(const Tensor& x, IntArrayRef out_sizes,
               const std::function<std::vector<int64_t>(const std::vector<int64_t>&)>& map,
               double fill = 0) {
  auto xv = to_doubles(x);
  std::vector<double> out;
  for_each_index(out_sizes, [&](const std::vector<int64_t>& i) {
    std::vector<int64_t> s = map(i);
    out.push_back(s.empty() ? fill : xv[flat(x.sizes(), s)]);
  });
  if (out.empty()) return zeros(out_sizes, kFloat64);
  return from_vector<double>(out, out_sizes);
}

TEST(Flip, EveryDtypeAndDims) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 4, 2}, dt, -9, 9);
    for (const Ints& dims : {Ints{0}, Ints{-1}, Ints{0, 2}, Ints{}, Ints{1, 0, 2}}) {
      std::vector<bool> f(3, false);
      for (int64_t d : dims) f[(d + 3) % 3] = true;
      expect_close(non_contiguous(x).flip(dims), ref_map(x, x.sizes(), [&](std::vector<int64_t> i) {
                     for (int64_t d = 0; d < 3; ++d)
                       if (f[d]) i[d] = x.size(d) - 1 - i[d];
                     return i;
                   }), 0, 0);
    }
  }
  expect_error(ErrorKind::Value, "appears multiple times", [] { random({2, 2}).flip({0, -2}); });
  expect_error(ErrorKind::Index, "dimension out of range", [] { random({2, 2}).flip({2}); });
}

TEST(Roll, DimsFlattenedAndNegative) {
  Tensor x = random({3, 4}, kInt64, -9, 9);
  for (int64_t s : {1, -1, 6, 0, -7}) {
    expect_close(x.roll({s}, {1}), ref_map(x, x.sizes(), [&](std::vector<int64_t> i) {
                   i[1] = (((i[1] - s) % 4) + 4) % 4;
                   return i;
                 }), 0, 0);
  }
  // Flattened: positions move through the row-major order.
  expect_close(x.roll({5}), ref_map(x, x.sizes(), [&](const std::vector<int64_t>& i) {
                 int64_t p = ((i[0] * 4 + i[1] - 5) % 12 + 12) % 12;
                 return std::vector<int64_t>{p / 4, p % 4};
               }), 0, 0);
  expect_close(non_contiguous(x).roll({1, -2}, {0, 1}), x.roll({1}, {0}).roll({-2}, {1}), 0, 0);
  expect_error(ErrorKind::Value, "shifts and dims must have the same length",
               [&] { x.roll({1, 2}, {0}); });
  expect_error(ErrorKind::Value, "one shift", [&] { x.roll({1, 2}); });
  EXPECT_EQ(zeros({0, 3}).roll({2}, {1}).sizes(), IntArrayRef({0, 3}));
}

TEST(Repeat, AgainstReference) {
  for (ScalarType dt : {kFloat32, kBool, kInt8, kBFloat16}) {
    Tensor x = random({2, 3}, dt, -9, 9);
    Tensor r = non_contiguous(x).repeat({2, 3, 2});
    ASSERT_EQ(r.sizes(), IntArrayRef({2, 6, 6}));
    expect_close(r, ref_map(x, r.sizes(), [&](const std::vector<int64_t>& i) {
                   return std::vector<int64_t>{i[1] % 2, i[2] % 3};
                 }), 0, 0);
  }
  EXPECT_EQ(random({2}).repeat({0, 2}).sizes(), IntArrayRef({0, 4}));
  expect_error(ErrorKind::Value, "can not be smaller than the number of dimensions",
               [] { random({2, 2}).repeat({2}); });
}

TEST(RepeatInterleave, IntTensorAndDims) {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(to_doubles(x.repeat_interleave(2)),
            (std::vector<double>{1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6}));
  EXPECT_EQ(to_doubles(x.repeat_interleave(2, 0)),
            (std::vector<double>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6}));
  Tensor reps = from_vector<int64_t>({0, 2, 1}, {3});
  Tensor y = x.repeat_interleave(reps, 1);
  EXPECT_EQ(y.sizes(), IntArrayRef({2, 3}));
  EXPECT_EQ(to_doubles(y), (std::vector<double>{2, 2, 3, 5, 5, 6}));
  EXPECT_EQ(to_doubles(repeat_interleave(from_vector<int64_t>({2, 0, 3}, {3}))),
            (std::vector<double>{0, 0, 2, 2, 2}));
  EXPECT_EQ(to_doubles(x.repeat_interleave(from_vector<int64_t>({2}, {1}))).size(), 12u);
  expect_error(ErrorKind::Value, "repeats must be non-negative",
               [] { repeat_interleave(from_vector<int64_t>({1, -1}, {2})); });
  expect_error(ErrorKind::Value, "one element or as many as the repeated dimension (3)",
               [&] { x.repeat_interleave(from_vector<int64_t>({1, 2}, {2}), 1); });
  using V = std::vector<Tensor>;
  EXPECT_TRUE(gradgradcheck([&](const V& a) { return V{a[0].repeat_interleave(reps, 1)}; },
                            {random({2, 3}, kFloat64)}));
}

TEST(Pad, ConstantModesAndNegative) {
  Tensor x = random({2, 3, 4}, kFloat32);
  Tensor c = constant_pad_nd(x, {1, 2, -1, 1}, 0.5);
  ASSERT_EQ(c.sizes(), IntArrayRef({2, 3, 7}));
  expect_close(c, ref_map(x, c.sizes(), [&](const std::vector<int64_t>& i) {
                 int64_t h = i[1] + 1, w = i[2] - 1;
                 if (h >= 3 || w < 0 || w >= 4) return std::vector<int64_t>{};
                 return std::vector<int64_t>{i[0], h, w};
               }, 0.5), 0, 0);
  expect_close(pad(x, {1, 2, -1, 1}, "constant", 0.5), c, 0, 0);
  auto reflect = [](int64_t i, int64_t n) {
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
    return i;
  };
  auto replicate = [](int64_t i, int64_t n) { return std::clamp<int64_t>(i, 0, n - 1); };
  auto circular = [](int64_t i, int64_t n) { return ((i % n) + n) % n; };
  struct Mode {
    const char* name;
    std::function<int64_t(int64_t, int64_t)> map;
  };
  for (const Mode& m : {Mode{"reflect", reflect}, Mode{"replicate", replicate}, Mode{"circular", circular}}) {
    SCOPED_TRACE(m.name);
    Tensor p = pad(non_contiguous(x), {3, 1, 2, 0}, m.name);
    ASSERT_EQ(p.sizes(), IntArrayRef({2, 5, 8}));
    expect_close(p, ref_map(x, p.sizes(), [&](const std::vector<int64_t>& i) {
                   return std::vector<int64_t>{i[0], m.map(i[1] - 2, 3), m.map(i[2] - 3, 4)};
                 }), 0, 0);
    using V = std::vector<Tensor>;
    std::string mode = m.name;
    EXPECT_TRUE(gradgradcheck([&](const V& a) { return V{pad(a[0], {3, 1, 2, 0}, mode)}; },
                              {random({1, 3, 4}, kFloat64)}));
  }
  expect_error(ErrorKind::Value, "reflect padding 4 must be less than the size 4",
               [&] { pad(x, {4, 0}, "reflect"); });
  expect_error(ErrorKind::Value, "takes no value", [&] { pad(x, {1, 0}, "replicate", 1.0); });
  expect_error(ErrorKind::Value, "mode must be", [&] { pad(x, {1, 0}, "mirror"); });
  expect_error(ErrorKind::Value, "padding length must be even", [&] { pad(x, {1}); });
  expect_error(ErrorKind::Value, "makes dimension 2 of self of shape [2, 3, 4] negative",
               [&] { constant_pad_nd(x, {-3, -2}); });
  using V = std::vector<Tensor>;
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{constant_pad_nd(a[0], {2, -1}, 3)}; },
                            {random({2, 3}, kFloat64)}));
}

}  // namespace
}  // namespace kiln::testing
