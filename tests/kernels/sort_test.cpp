// sort, argsort, topk, cumsum and cumprod against naive references (tensor/ops/sort.toml,
// Note [Sort order] in kernels/cpu/sort.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/gradgradcheck.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// Values of the 2-D `x` row r (dim 1) or column r (dim 0).
std::vector<double> line(const Tensor& x, int64_t dim, int64_t r) {
  return to_doubles(x.select(1 - dim, r));
}

// The stable order of v (NaN largest).
std::vector<int64_t> ref_order(const std::vector<double>& v, bool descending) {
  std::vector<int64_t> p(v.size());
  std::iota(p.begin(), p.end(), 0);
  auto key = [&](int64_t i) { return std::isnan(v[i]) ? INFINITY : v[i]; };
  std::stable_sort(p.begin(), p.end(), [&](int64_t a, int64_t b) {
    const bool na = std::isnan(v[a]), nb = std::isnan(v[b]);
    if (descending) return (na && !nb) || (!na && !nb && key(a) > key(b));
    return (!na && nb) || (!na && !nb && key(a) < key(b));
  });
  return p;
}

TEST(Sort, EveryDtypeStableBothDims) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({5, 7}, dt, -3, 3);  // integer dtypes: many ties
    for (int64_t dim : {0, 1})
      for (bool desc : {false, true}) {
        auto [values, indices] = non_contiguous(x).sort(dim, desc);
        ASSERT_EQ(indices.dtype(), kInt64);
        for (int64_t r = 0; r < x.size(1 - dim); ++r) {
          std::vector<double> v = line(x, dim, r);
          std::vector<int64_t> want = ref_order(v, desc);
          std::vector<double> got_i = line(indices, dim, r), got_v = line(values, dim, r);
          for (size_t i = 0; i < v.size(); ++i) {
            EXPECT_EQ(got_i[i], static_cast<double>(want[i])) << "dim " << dim << " row " << r;
            EXPECT_EQ(got_v[i], v[want[i]]);
          }
        }
        expect_close(argsort(x, dim, desc), indices, 0, 0);
      }
  }
}

TEST(Sort, NanZeroSizeAndScalar) {
  Tensor x = from_vector<float>({2, NAN, -1, NAN, 0}, {5});
  auto [v, i] = x.sort();
  EXPECT_EQ(to_doubles(i), (std::vector<double>{2, 4, 0, 1, 3}));
  auto [vd, id] = x.sort(0, true);
  EXPECT_EQ(to_doubles(id), (std::vector<double>{1, 3, 0, 4, 2}));
  EXPECT_EQ(std::get<0>(zeros({0, 3}).sort(0)).sizes(), IntArrayRef({0, 3}));
  auto [sv, si] = scalar_tensor_of(4.0, kFloat32).sort();
  EXPECT_EQ(sv.dim(), 0);
  EXPECT_EQ(si.item<int64_t>(), 0);
  expect_error(ErrorKind::Index, "dimension out of range", [] { random({2, 3}).sort(2); });
}

TEST(Topk, LargestSmallestTiesAndErrors) {
  for (ScalarType dt : dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({4, 9}, dt, -4, 4);
    for (bool largest : {true, false}) {
      auto [values, indices] = x.topk(3, 1, largest);
      ASSERT_EQ(values.sizes(), IntArrayRef({4, 3}));
      for (int64_t r = 0; r < 4; ++r) {
        std::vector<int64_t> want = ref_order(line(x, 1, r), largest);
        std::vector<double> gi = line(indices, 1, r);
        for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(gi[k], static_cast<double>(want[k]));
      }
    }
    auto [v0, i0] = non_contiguous(x).topk(2, 0);  // along a strided dim
    EXPECT_EQ(to_doubles(v0), to_doubles(std::get<0>(x.sort(0, true)).narrow(0, 0, 2)));
  }
  EXPECT_EQ(std::get<0>(random({3, 2}).topk(0)).sizes(), IntArrayRef({3, 0}));
  expect_error(ErrorKind::Index, "k (4) is out of range for dimension 1 of size 3",
               [] { random({2, 3}).topk(4); });
}

TEST(Cumsum, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 4, 5}, dt, -3, 3);
    for (int64_t dim : {0, 1, 2}) {
      Tensor got = non_contiguous(x).cumsum(dim);
      EXPECT_EQ(got.dtype(), is_floating(dt) ? dt : kInt64);
      // Reference: sum of the narrowed prefix, computed in float64.
      Tensor xd = x.to(kFloat64);
      for (int64_t i = 0; i < x.size(dim); ++i) {
        Tensor want = xd.narrow(dim, 0, i + 1).sum({dim});
        const double tol = dt == kBFloat16 ? 0.06 : dt == kFloat16 ? 8e-3 : 1e-5;
        expect_close(got.select(dim, i).to(kFloat64), want, tol, tol);
      }
    }
  }
  Tensor x = random({6}, kFloat32);
  expect_close(x.cumsum(0, kFloat64), x.to(kFloat64).cumsum(0), 1e-12, 1e-12);
  EXPECT_EQ(zeros({0, 2}).cumsum(0).sizes(), IntArrayRef({0, 2}));
  EXPECT_EQ(scalar_tensor_of(2.0, kFloat32).cumsum(0).item<float>(), 2.0f);
  expect_error(ErrorKind::Index, "dimension out of range", [] { random({2}).cumsum(1); });
}

TEST(Cumprod, AgainstReferenceAndZeroGradients) {
  Tensor x = random({3, 5}, kFloat64, -1.5, 1.5);
  Tensor got = x.cumprod(1);
  auto xv = to_doubles(x), gv = to_doubles(got);
  for (int64_t r = 0; r < 3; ++r) {
    double p = 1;
    for (int64_t j = 0; j < 5; ++j) {
      p *= xv[r * 5 + j];
      EXPECT_NEAR(gv[r * 5 + j], p, 1e-12);
    }
  }
  EXPECT_EQ(random({2, 3}, kInt32, -3, 3).cumprod(0).dtype(), kInt64);
  // Gradients (and second derivatives) with zeros: one zero, two zeros, a zero first.
  using V = std::vector<Tensor>;
  Tensor z = from_vector<double>({1.5, 0, 2, -1, 0.5, 0, 3, 2, 0, -2, 0, 1.25}, {3, 4});
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{a[0].cumprod(1)}; }, {z}));
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{a[0].cumprod(0)}; }, {z}));
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{a[0].cumsum(1)}; }, {z}));
}

TEST(Sort, Gradients) {
  using V = std::vector<Tensor>;
  Tensor x = random({3, 5}, kFloat64, -1, 1, 9);
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{std::get<0>(a[0].sort(1, true))}; }, {x}));
  EXPECT_TRUE(gradgradcheck([](const V& a) { return V{std::get<0>(a[0].topk(2, 0))}; }, {x}));
}

}  // namespace
}  // namespace kiln::testing
