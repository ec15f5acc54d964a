// index_select, gather, scatter(_add), masked_fill and one_hot against naive references
// (tensor/ops/indexing.toml).
#include <gtest/gtest.h>

#include <functional>

#include "kiln/meta.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

Tensor ref_tensor(const std::vector<double>& v, IntArrayRef sizes) {
  return from_vector<double>(v, sizes);
}
Tensor idx(const std::vector<int64_t>& v, IntArrayRef sizes) {
  return from_vector<int64_t>(v, sizes);
}

Tensor ref_index_select(const Tensor& self, int64_t d, const Tensor& index) {
  auto sv = to_doubles(self), iv = to_doubles(index);
  DimVector sizes(self.sizes());
  sizes[d] = index.numel();
  std::vector<double> out(numel_of(sizes));
  for_each_index(sizes, [&](std::vector<int64_t> i) {
    int64_t o = flat(sizes, i);
    i[d] = static_cast<int64_t>(iv[i[d]]);
    out[o] = sv[flat(self.sizes(), i)];
  });
  return ref_tensor(out, sizes);
}

TEST(IndexSelect, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({4, 5, 3}, dt, -9, 9);
    Tensor i = idx({4, 0, 0, 2}, {4});
    expect_close(index_select(x, 1, i), ref_index_select(x, 1, i), 0, 0);
    expect_close(index_select(x, 1, i.to(kInt32)), ref_index_select(x, 1, i), 0, 0);
    expect_close(x.index_select(-1, idx({2, 1}, {2})), ref_index_select(x, 2, idx({2, 1}, {2})), 0,
                 0);
    // Non-contiguous self and index (every other element of a longer index).
    Tensor nc = non_contiguous(x);
    Tensor si = idx({3, 9, 0, 9, 3, 9}, {6}).slice(0, 0, std::nullopt, 2);
    ASSERT_FALSE(si.is_contiguous());
    expect_close(nc.index_select(0, si), ref_index_select(x, 0, si), 0, 0);  // picks 3, 0, 3
    Tensor si2 = idx({1, 9, 2, 9}, {4}).slice(0, 0, std::nullopt, 2);
    expect_close(nc.index_select(2, si2), ref_index_select(x, 2, si2), 0, 0);
  }
}

TEST(IndexSelect, ZeroSizeScalarAndBadInputs) {
  Tensor x = random({3, 4});
  EXPECT_EQ(x.index_select(0, idx({}, {0})).sizes(), IntArrayRef({0, 4}));
  EXPECT_EQ(random({0, 4}).index_select(1, idx({1, 1}, {2})).sizes(), IntArrayRef({0, 2}));
  Tensor s = scalar_tensor_of(2.5, kFloat64);
  Tensor r = s.index_select(0, idx({0}, {}));
  EXPECT_EQ(r.dim(), 0);
  EXPECT_EQ(r.item<double>(), 2.5);
  expect_error(ErrorKind::Index, "index 3 is out of bounds for dimension 0 with size 3", [&] {
    x.index_select(0, idx({0, 3}, {2}));
  });
  expect_error(ErrorKind::Index, "index -1 is out of bounds for dimension 1 with size 4",
               [&] { x.index_select(1, idx({-1}, {1})); });
  expect_error(ErrorKind::Index, "index 1 is out of bounds",
               [&] { s.index_select(0, idx({1}, {1})); });
  expect_error(ErrorKind::Type, "int64 or int32",
               [&] { x.index_select(0, random({2}, kFloat32)); });
  expect_error(ErrorKind::Value, "vector or a scalar", [&] {
    x.index_select(0, idx({0, 1}, {1, 2}));
  });
  expect_error(ErrorKind::Index, "dimension out of range",
               [&] { x.index_select(2, idx({0}, {1})); });
}

// out[p] = self[p with p[d] = index[p]] over index's shape.
Tensor ref_gather(const Tensor& self, int64_t d, const Tensor& index) {
  auto sv = to_doubles(self), iv = to_doubles(index);
  std::vector<double> out(index.numel());
  for_each_index(index.sizes(), [&](std::vector<int64_t> i) {
    int64_t o = flat(index.sizes(), i);
    i[d] = static_cast<int64_t>(iv[o]);
    out[o] = sv[flat(self.sizes(), i)];
  });
  return ref_tensor(out, index.sizes());
}

TEST(Gather, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 4, 2}, dt, -9, 9);
    Tensor i1 = random({2, 6, 2}, kInt64, 0, 4, 7);  // larger than self along dim 1 only
    expect_close(gather(x, 1, i1), ref_gather(x, 1, i1), 0, 0);
    Tensor i0 = random({3, 2, 1}, kInt64, 0, 3, 8);
    expect_close(x.gather(0, i0), ref_gather(x, 0, i0), 0, 0);
    Tensor i2 = non_contiguous(random({3, 4, 2}, kInt64, 0, 2, 9));
    expect_close(non_contiguous(x).gather(-1, i2), ref_gather(x, 2, i2), 0, 0);
  }
}

TEST(Gather, ZeroSizeAndBadInputs) {
  Tensor x = random({3, 4});
  EXPECT_EQ(x.gather(1, idx({}, {3, 0})).sizes(), IntArrayRef({3, 0}));
  EXPECT_EQ(x.gather(0, idx({}, {0})).sizes(), IntArrayRef({0}));  // empty index skips shape checks
  expect_error(ErrorKind::Index, "index 4 is out of bounds for dimension 1 with size 4", [&] {
    x.gather(1, idx({0, 4}, {1, 2}));
  });
  expect_error(ErrorKind::Index, "index -2 is out of bounds for dimension 0 with size 3", [&] {
    x.gather(0, idx({-2}, {1, 1}));
  });
  expect_error(ErrorKind::Type, "dtype int64", [&] { x.gather(0, idx({0}, {1, 1}).to(kInt32)); });
  expect_error(ErrorKind::Value, "same number of dimensions", [&] { x.gather(0, idx({0}, {1})); });
  expect_error(ErrorKind::Value, "larger than self of shape [3, 4] at dimension 1", [&] {
    x.gather(0, idx({0, 0, 0, 0, 0}, {1, 5}));
  });
}

// out = self; out[p with p[d] = index[p]] = src[p] (accumulated for scatter_add).
Tensor ref_scatter(const Tensor& self, int64_t d, const Tensor& index, const Tensor& src,
                   bool add) {
  auto out = to_doubles(self), iv = to_doubles(index), sv = to_doubles(src);
  for_each_index(index.sizes(), [&](std::vector<int64_t> i) {
    double v = sv[flat(src.sizes(), i)];
    i[d] = static_cast<int64_t>(iv[flat(index.sizes(), i)]);
    double& o = out[flat(self.sizes(), i)];
    o = add ? o + v : v;
  });
  return ref_tensor(out, self.sizes());
}

TEST(Scatter, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 5}, dt, -9, 9, 1), src = random({2, 4}, dt, -9, 9, 2);
    Tensor i = idx({4, 0, 2, 1, 0, 1, 2, 3}, {2, 4});  // distinct per row
    expect_close(scatter(x, 1, i, src), ref_scatter(x, 1, i, src, false), 0, 0);
    Tensor i0 = idx({2, 0, 1, 0, 1, 2}, {2, 3});  // distinct per column
    expect_close(x.scatter(0, i0, src), ref_scatter(x, 0, i0, src, false), 0, 0);
    // In place on a non-contiguous self, non-contiguous src.
    Tensor y = non_contiguous(x), nsrc = non_contiguous(src);
    Tensor want = ref_scatter(x, 1, i, src, false);
    Tensor r = y.scatter_(-1, i, nsrc);
    EXPECT_TRUE(r.is_same(y));
    expect_close(y, want, 0, 0);
  }
}

TEST(ScatterAdd, EveryDtypeAccumulatesRepeats) {
  for (ScalarType dt : dtypes_of_set("numeric")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({3, 4}, dt, 0, 5, 1), src = random({3, 6}, dt, 0, 5, 2);
    Tensor i = random({3, 6}, kInt64, 0, 4, 3);  // repeats along dim 1
    expect_close(scatter_add(x, 1, i, src), ref_scatter(x, 1, i, src, true), 4 * rtol_for(dt),
                 1e-2);
    Tensor i0 = idx({2, 2, 2, 2, 0, 0, 0, 0}, {2, 4});
    Tensor y = non_contiguous(x);
    Tensor want = ref_scatter(x, 0, i0, src, true);
    EXPECT_TRUE(y.scatter_add_(0, i0, src).is_same(y));
    expect_close(y, want, 4 * rtol_for(dt), 1e-2);
  }
}

TEST(Scatter, ZeroSizeAndBadInputs) {
  Tensor x = random({3, 4}), src = random({3, 4});
  expect_close(x.scatter(0, idx({}, {0, 4}), src), x, 0, 0);
  EXPECT_EQ(random({0, 4}).scatter(1, idx({}, {0, 4}), random({0, 4})).sizes(),
            IntArrayRef({0, 4}));
  expect_error(ErrorKind::Index, "index 3 is out of bounds for dimension 0 with size 3", [&] {
    x.scatter(0, idx({3}, {1, 1}), src);
  });
  expect_error(ErrorKind::Index, "index -1 is out of bounds for dimension 1 with size 4", [&] {
    x.scatter_add_(1, idx({-1}, {1, 1}), src);
  });
  expect_error(ErrorKind::Type, "same dtype", [&] {
    x.scatter(0, idx({0}, {1, 1}), random({3, 4}, kFloat64));
  });
  expect_error(ErrorKind::Type, "dtype int64", [&] {
    x.scatter(0, idx({0}, {1, 1}).to(kInt32), src);
  });
  expect_error(ErrorKind::Value, "larger than src", [&] {
    x.scatter(0, idx({0, 0}, {2, 1}), random({1, 1}));
  });
  expect_error(ErrorKind::Value, "larger than self", [&] {
    x.scatter(0, idx({0, 0, 0, 0, 0}, {1, 5}), random({1, 5}));
  });
}

Tensor ref_masked_fill(const Tensor& self, const Tensor& mask, double value) {
  DimVector sizes = kiln::meta::broadcast_shapes("ref", self.sizes(), mask.sizes());
  auto sv = to_doubles(self.expand(sizes)), mv = to_doubles(mask.expand(sizes));
  for (size_t i = 0; i < sv.size(); ++i)
    if (mv[i] != 0) sv[i] = value;
  return ref_tensor(sv, sizes);
}

TEST(MaskedFill, EveryDtypeWithBroadcasting) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    double v = dt == kBool ? 1 : (dt == kUInt8 ? 7 : -3);
    Tensor x = random({2, 3, 4}, dt, -9, 9);
    Tensor m = random({2, 3, 4}, kBool, 0, 2, 5), row = random({4}, kBool, 0, 2, 6),
           col = random({3, 1}, kBool, 0, 2, 7);
    for (const Tensor& mask : {m, row, col, non_contiguous(m)}) {
      Tensor got = x.masked_fill(mask, v);
      EXPECT_EQ(got.dtype(), dt);
      expect_close(got, ref_masked_fill(x, mask, v), 0, 0);
    }
    // self broadcasts too in the functional form.
    Tensor small = random({4}, dt, -9, 9);
    expect_close(masked_fill(small, m, v), ref_masked_fill(small, m, v), 0, 0);
    // In place on a non-contiguous self.
    Tensor y = non_contiguous(x);
    Tensor want = ref_masked_fill(x, col, v);
    EXPECT_TRUE(y.masked_fill_(col, v).is_same(y));
    expect_close(y, want, 0, 0);
  }
}

TEST(MaskedFill, ZeroSizeAndBadInputs) {
  EXPECT_EQ(random({0, 3}).masked_fill(random({3}, kBool), 1.0).sizes(), IntArrayRef({0, 3}));
  Tensor x = random({3});
  expect_error(ErrorKind::Type, "mask of dtype bool, got int32",
               [&] { x.masked_fill(random({3}, kInt32), 1.0); });
  expect_error(ErrorKind::Value, "not broadcastable",
               [&] { x.masked_fill(random({4}, kBool), 1.0); });
  expect_error(ErrorKind::Value, "doesn't match the broadcast shape", [&] {
    x.masked_fill_(random({2, 3}, kBool), 1.0);
  });
}

Tensor ref_one_hot(const Tensor& self, int64_t c) {
  auto v = to_doubles(self);
  DimVector sizes(self.sizes());
  sizes.push_back(c);
  std::vector<double> out(numel_of(sizes), 0.0);
  for (size_t i = 0; i < v.size(); ++i) out[i * c + static_cast<int64_t>(v[i])] = 1;
  return ref_tensor(out, sizes);
}

TEST(OneHot, AgainstReference) {
  for (ScalarType dt : dtypes_of_set("int64")) {
    Tensor x = random({3, 4}, dt, 0, 5);
    Tensor got = one_hot(x, 6);
    EXPECT_EQ(got.dtype(), kInt64);
    expect_close(got, ref_one_hot(x, 6), 0, 0);
    int64_t mx = 0;
    for (double v : to_doubles(x)) mx = std::max<int64_t>(mx, static_cast<int64_t>(v));
    expect_close(x.one_hot(), ref_one_hot(x, mx + 1), 0, 0);  // -1 infers max + 1
    Tensor nc = non_contiguous(x);
    expect_close(nc.one_hot(5), ref_one_hot(x, 5), 0, 0);
    expect_close(one_hot(scalar_tensor_of(2, kInt64), 3),
                 ref_one_hot(scalar_tensor_of(2, kInt64), 3), 0, 0);
  }
}

TEST(OneHot, ZeroSizeBadInputsAndMeta) {
  EXPECT_EQ(one_hot(idx({}, {0, 2}), 3).sizes(), IntArrayRef({0, 2, 3}));
  expect_error(ErrorKind::Value, "empty tensor", [] { one_hot(idx({}, {0})); });
  expect_error(ErrorKind::Index, "class value 3 is out of range for num_classes 3", [] {
    one_hot(idx({0, 3}, {2}), 3);
  });
  expect_error(ErrorKind::Index, "class value -1", [] { one_hot(idx({0, -1}, {2})); });
  expect_error(ErrorKind::Type, "dtype int64, got int32",
               [] { one_hot(random({2}, kInt32, 0, 2), 2); });
  expect_error(ErrorKind::Value, "-1 or non-negative", [] { one_hot(idx({0}, {1}), -2); });
  Tensor m = empty({4}, kInt64, Device("meta"));
  EXPECT_EQ(one_hot(m, 7).sizes(), IntArrayRef({4, 7}));
  EXPECT_TRUE(one_hot(m, 7).is_meta());
  expect_error(ErrorKind::NotImplemented, "pass num_classes explicitly", [&] { one_hot(m); });
}

TEST(IndexingMeta, OutputsWithoutData) {
  Device meta("meta");
  Tensor x = empty({3, 4}, kFloat32, meta), i = empty({2, 4}, kInt64, meta);
  EXPECT_EQ(gather(x, 0, i).sizes(), IntArrayRef({2, 4}));
  EXPECT_EQ(scatter(x, 0, i, x).sizes(), IntArrayRef({3, 4}));
  EXPECT_EQ(index_select(x, 1, empty({5}, kInt64, meta)).sizes(), IntArrayRef({3, 5}));
  EXPECT_EQ(masked_fill(empty({4}, kFloat32, meta), empty({2, 1}, kBool, meta), 0).sizes(),
            IntArrayRef({2, 4}));
}

}  // namespace
}  // namespace kiln::testing
