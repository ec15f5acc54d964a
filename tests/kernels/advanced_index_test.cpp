// index, index_put(_), masked_select and nonzero against naive references
// (tensor/ops/indexing.toml, Note [Advanced indexing] in tensor/src/meta/indexing.cpp).
#include <gtest/gtest.h>

#include "autograd/gradgradcheck.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Ints = std::vector<int64_t>;
Tensor idx(const Ints& v, IntArrayRef sizes) { return from_vector<int64_t>(v, sizes); }
Tensor mask_of(const std::vector<bool>& v, IntArrayRef sizes) {
  Tensor t = empty_on(sizes, kBool, kCPU);
  for (size_t i = 0; i < v.size(); ++i) static_cast<bool*>(t.data_ptr())[i] = v[i];
  return t;
}

// x[i0[b], i1[b], ...] for b over the broadcast of 1-D (or 0-D) integer indices of one shape.
Tensor ref_index(const Tensor& x, const std::vector<Ints>& ind, IntArrayRef batch) {
  auto xv = to_doubles(x);
  const size_t k = ind.size();
  DimVector rest;
  for (int64_t d = k; d < x.dim(); ++d) rest.push_back(x.size(d));
  DimVector out_sizes(batch);
  for (int64_t s : rest) out_sizes.push_back(s);
  std::vector<double> out;
  const int64_t nb = numel_of(batch);
  for (int64_t b = 0; b < nb; ++b)
    for_each_index(rest, [&](const std::vector<int64_t>& r) {
      std::vector<int64_t> full;
      for (size_t j = 0; j < k; ++j) {
        int64_t v = ind[j].size() == 1 ? ind[j][0] : ind[j][b];
        full.push_back(v < 0 ? v + x.size(j) : v);
      }
      full.insert(full.end(), r.begin(), r.end());
      out.push_back(xv[flat(x.sizes(), full)]);
    });
  if (out.empty()) return zeros(out_sizes, kFloat64);
  return from_vector<double>(out, out_sizes);
}

TEST(AdvancedIndex, IntegerIndicesEveryDtype) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({5, 4, 3}, dt, -9, 9);
    expect_close(x.index({idx({4, 0, -1, 2}, {4})}), ref_index(x, {{4, 0, -1, 2}}, {4}), 0, 0);
    expect_close(x.index({idx({1, 3}, {2}), idx({0, -4}, {2}).to(kInt32)}),
                 ref_index(x, {{1, 3}, {0, 0}}, {2}), 0, 0);
    // Non-contiguous self, broadcasting indices ((2, 1) with (3,) -> (2, 3)).
    Tensor nc = non_contiguous(x);
    Tensor got = nc.index({idx({1, 4}, {2, 1}), idx({0, 1, 3}, {3})});
    ASSERT_EQ(got.sizes(), IntArrayRef({2, 3, 3}));
    auto gv = to_doubles(got), xv = to_doubles(x);
    for (int64_t a = 0; a < 2; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 3; ++c)
          EXPECT_EQ(gv[(a * 3 + b) * 3 + c], xv[flat(x.sizes(), {a ? 4 : 1, Ints{0, 1, 3}[b], c})]);
  }
}

TEST(AdvancedIndex, BoolMasks) {
  Tensor x = random({2, 3, 4}, kFloat32);
  Tensor m = mask_of({true, false, true, false, true, true}, {2, 3});
  // A 2-D mask covers dims 0 and 1: the rows (0,0), (0,2), (1,1), (1,2).
  expect_close(x.index({m}), ref_index(x, {{0, 0, 1, 1}, {0, 2, 1, 2}}, {4}), 0, 0);
  // A 1-D mask with an integer index broadcasting against its positions.
  Tensor m1 = mask_of({false, true, true}, {3});
  Tensor y = random({3, 4});
  expect_close(y.index({m1, idx({2}, {})}), ref_index(y, {{1, 2}, {2}}, {2}), 0, 0);
  // masked_select agrees with indexing by a full mask.
  Tensor full = random({2, 3}) > 0;
  Tensor z = random({2, 3}, kFloat64);
  expect_close(z.masked_select(full), z.index({full}), 0, 0);
  EXPECT_EQ(x.index({mask_of({false, false}, {2})}).sizes(), IntArrayRef({0, 3, 4}));
}

TEST(AdvancedIndex, ErrorsNameShapes) {
  Tensor x = random({3, 4});
  expect_error(ErrorKind::Index, "index 3 is out of bounds for dimension 0 with size 3",
               [&] { x.index({idx({0, 3}, {2})}); });
  expect_error(ErrorKind::Index, "index -5 is out of bounds for dimension 1 with size 4",
               [&] { x.index({idx({0}, {1}), idx({-5}, {1})}); });
  expect_error(ErrorKind::Index, "too many indices for a tensor of shape [3, 4]",
               [&] { x.index({idx({0}, {1}), idx({0}, {1}), idx({0}, {1})}); });
  expect_error(ErrorKind::Index, "does not match the shape of the indexed tensor [3, 4]",
               [&] { x.index({mask_of({true, false}, {2})}); });
  expect_error(ErrorKind::Type, "must be int64, int32 or bool", [&] { x.index({random({2})}); });
  expect_error(ErrorKind::Value, "are not broadcastable",
               [&] { x.index({idx({0, 1}, {2}), idx({0, 1, 2}, {3})}); });
  expect_error(ErrorKind::Value, "at least one index tensor", [&] { x.index({}); });
  Tensor mx = empty({3, 4}, std::nullopt, Device(DeviceType::Meta));
  expect_error(ErrorKind::NotImplemented, "data-dependent output shape",
               [&] { mx.index({empty({3}, kBool, Device(DeviceType::Meta))}); });
  EXPECT_EQ(mx.index({empty({2, 5}, kInt64, Device(DeviceType::Meta))}).sizes(),
            IntArrayRef({2, 5, 4}));
}

TEST(IndexPut, OverwriteAccumulateAndMasks) {
  for (ScalarType dt : dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({4, 3}, dt, 0, 5);
    Tensor v = random({2, 3}, dt, 0, 5);
    Tensor r = x.index_put({idx({3, -4}, {2})}, v);
    auto xv = to_doubles(x), vv = to_doubles(v), rv = to_doubles(r);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j) {
        const double want = i == 3 ? vv[j] : i == 0 ? vv[3 + j] : xv[i * 3 + j];
        EXPECT_EQ(rv[i * 3 + j], want);
      }
    EXPECT_EQ(to_doubles(x), xv);  // functional: x unchanged
    // Accumulate with repeated indices adds every value; a scalar value broadcasts.
    Tensor a = x.clone().index_put_({idx({1, 1, 2}, {3}), idx({0, 0, 2}, {3})}, ones({}, dt), true);
    auto av = to_doubles(a);
    EXPECT_NEAR(av[3], xv[3] + 2, 0.07);  // bfloat16 rounds values near 7 to 1/32
    EXPECT_NEAR(av[8], xv[8] + 1, 0.07);
  }
  // Repeated indices without accumulate: the last write wins.
  Tensor y = zeros({3});
  y.index_put_({idx({1, 1, 1}, {3})}, from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(to_doubles(y), (std::vector<double>{0, 3, 0}));
  // A mask selects the positions written.
  Tensor z = zeros({2, 3});
  z.index_put_({mask_of({true, false, false, false, true, true}, {2, 3})},
               from_vector<float>({1, 2, 3}, {3}));
  EXPECT_EQ(to_doubles(z), (std::vector<double>{1, 0, 0, 0, 2, 3}));
  // bfloat16 accumulation: each sum is computed in float and rounded once per write.
  Tensor b = zeros({1}, kBFloat16).index_put({idx({0, 0, 0, 0}, {4})},
                                             full({4}, 1.0 / 256, kBFloat16), true);
  EXPECT_NEAR(b.item<float>(), 4.0 / 256, 1e-6);
  expect_error(ErrorKind::Value, "cannot be broadcast to the indexing result of shape [2, 3]",
               [&] { zeros({4, 3}).index_put({idx({0, 1}, {2})}, zeros({3, 3})); });
  expect_error(ErrorKind::Type, "expected values to have the dtype of self",
               [&] { zeros({4, 3}).index_put({idx({0}, {1})}, zeros({3}, kFloat64)); });
  expect_error(ErrorKind::Index, "index 4 is out of bounds",
               [&] { zeros({4, 3}).index_put_({idx({4}, {1})}, zeros({3})); });
}

TEST(MaskedSelectNonzero, AgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 4}, dt, -2, 2);
    Tensor m = random({4}, kFloat32) > 0;  // broadcasts over rows
    auto xv = to_doubles(x), mv = to_doubles(m);
    std::vector<double> want;
    std::vector<double> nz;
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        if (mv[j]) want.push_back(xv[i * 4 + j]);
        if (xv[i * 4 + j] != 0) {
          nz.push_back(i);
          nz.push_back(j);
        }
      }
    EXPECT_EQ(to_doubles(non_contiguous(x).masked_select(m)), want);
    Tensor n = non_contiguous(x).nonzero();
    EXPECT_EQ(n.dtype(), kInt64);
    EXPECT_EQ(n.size(1), 2);
    EXPECT_EQ(to_doubles(n), nz);
  }
  EXPECT_EQ(zeros({2, 0}).nonzero().sizes(), IntArrayRef({0, 2}));
  EXPECT_EQ(scalar_tensor_of(3.0, kFloat32).nonzero().sizes(), IntArrayRef({1, 0}));
  // NaN is nonzero, -0.0 is zero.
  EXPECT_EQ(from_vector<float>({NAN, -0.0f}, {2}).nonzero().sizes(), IntArrayRef({1, 1}));
  expect_error(ErrorKind::Type, "expected a mask of dtype bool",
               [&] { random({3}).masked_select(random({3})); });
  expect_error(ErrorKind::Value, "not broadcastable",
               [&] { random({3}).masked_select(random({2}) > 0); });
}

TEST(AdvancedIndex, Gradients) {
  using V = std::vector<Tensor>;
  Tensor x = random({4, 3}, kFloat64, -1, 1, 7);
  Tensor v = random({3, 3}, kFloat64, -1, 1, 8);
  Tensor dup = idx({3, 0, 3}, {3});
  Tensor m = mask_of({true, false, true, true}, {4});
  EXPECT_TRUE(gradgradcheck([&](const V& a) { return V{a[0].index({dup})}; }, {x}));
  EXPECT_TRUE(gradgradcheck([&](const V& a) { return V{a[0].index({m, idx({2, 0, 1}, {3})})}; }, {x}));
  EXPECT_TRUE(gradgradcheck([&](const V& a) { return V{a[0].index_put({dup}, a[1], true)}; }, {x, v}));
  EXPECT_TRUE(gradgradcheck(
      [&](const V& a) { return V{a[0].index_put({idx({2, 0}, {2})}, a[1], false)}; },
      {x, random({3}, kFloat64)}));
  EXPECT_TRUE(gradgradcheck([&](const V& a) { return V{a[0].masked_select(m.unsqueeze(1))}; }, {x}));
  // The overwritten rows of self get no gradient.
  Tensor s = x.detach().requires_grad_();
  s.index_put({idx({1}, {1})}, zeros({3}, kFloat64)).sum().backward();
  EXPECT_EQ(to_doubles(s.grad()), (std::vector<double>{1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1}));
}

}  // namespace
}  // namespace kiln::testing
