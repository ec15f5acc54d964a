// cat, stack, split, chunk, tril, triu against naive references (tensor/ops/shape.toml).
#include <gtest/gtest.h>

#include <functional>
#include <limits>

#include "test_util.h"

namespace kiln::testing {
namespace {

Tensor ref_tensor(const std::vector<double>& v, IntArrayRef sizes) {
  return from_vector<double>(v, sizes);
}

// Naive cat: walks the output and picks the input that covers each index along `dim`.
Tensor ref_cat(const std::vector<Tensor>& ts, int64_t dim) {
  std::vector<Tensor> used;
  for (const Tensor& t : ts)
    if (!(t.dim() == 1 && t.size(0) == 0)) used.push_back(t);
  DimVector sizes(used[0].sizes());
  sizes[dim] = 0;
  for (const Tensor& t : used) sizes[dim] += t.size(dim);
  std::vector<double> out(numel_of(sizes));
  for_each_index(sizes, [&](const std::vector<int64_t>& idx) {
    std::vector<int64_t> j = idx;
    size_t k = 0;
    while (j[dim] >= used[k].size(dim)) j[dim] -= used[k++].size(dim);
    out[flat(sizes, idx)] = to_doubles(used[k])[flat(used[k].sizes(), j)];
  });
  return ref_tensor(out, sizes);
}

TEST(Cat, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor a = random({2, 3, 4}, dt, -5, 5, 1), b = random({2, 1, 4}, dt, -5, 5, 2);
    Tensor c = non_contiguous(random({2, 2, 4}, dt, -5, 5, 3));
    for (int64_t dim : {1, -2}) {
      Tensor got = cat({a, b, c}, dim);
      EXPECT_EQ(got.dtype(), dt);
      expect_close(got, ref_cat({a, b, c}, 1), 0, 0);
    }
    Tensor x = random({3, 2}, dt, -5, 5, 4), y = non_contiguous(random({3, 5}, dt, -5, 5, 5));
    expect_close(cat({x, y}, 1), ref_cat({x, y}, 1), 0, 0);
    expect_close(cat({x, x.t().t()}, 0), ref_cat({x, x}, 0), 0, 0);
  }
}

TEST(Cat, PromotesAcrossInputs) {
  Tensor a = random({2, 2}, kInt32), b = random({1, 2}, kFloat64), c = random({1, 2}, kBool);
  Tensor got = cat({a, b, c});
  EXPECT_EQ(got.dtype(), kFloat64);
  expect_close(got, ref_cat({a, b, c}, 0), 0, 0);
  EXPECT_EQ(cat({random({2}, kInt8), random({2}, kUInt8)}).dtype(), kInt16);
  EXPECT_EQ(cat({random({2}, kBool), random({2}, kInt64)}).dtype(), kInt64);
  EXPECT_EQ(cat({random({2}, kBFloat16), random({2}, kFloat16)}).dtype(), kFloat32);
}

TEST(Cat, SkipsLegacyEmptyAndHandlesZeroSize) {
  Tensor a = random({2, 3}), b = random({1, 3});
  Tensor got = cat({random({0}), a, random({0}, kFloat64), b}, 0);
  EXPECT_EQ(got.sizes(), IntArrayRef({3, 3}));
  EXPECT_EQ(got.dtype(), kFloat64);  // empty inputs still take part in type promotion
  expect_close(got, ref_cat({a, b}, 0), 0, 0);
  // dim wraps against the first non-skipped input, so dim=1 is valid with 1-D empties around.
  EXPECT_EQ(cat({random({0}), random({2, 3}), random({2, 1})}, 1).sizes(), IntArrayRef({2, 4}));
  EXPECT_EQ(cat({random({0}), random({0})}).sizes(), IntArrayRef({0}));
  EXPECT_EQ(cat({random({2, 0}), random({3, 0})}).sizes(), IntArrayRef({5, 0}));
  Tensor e = cat({random({0, 3}), b});
  expect_close(e, b, 0, 0);
  EXPECT_EQ(cat({random({2, 0}), random({2, 3})}, 1).sizes(), IntArrayRef({2, 3}));
}

TEST(Cat, BadInputs) {
  expect_error(ErrorKind::Value, "non-empty list", [] { cat(std::vector<Tensor>{}); });
  expect_error(ErrorKind::Value, "zero-dimensional tensor (at position 1)", [] {
    cat({random({2}), scalar_tensor_of(1.0, kFloat32)});
  });
  expect_error(ErrorKind::Value, "tensor 0 has shape [2, 3] but tensor 2 has shape [2, 4]", [] {
    cat({random({2, 3}), random({1, 3}), random({2, 4})}, 0);
  });
  expect_error(ErrorKind::Value,
               "same number of dimensions: tensor 0 has shape [2, 3] but tensor 1 has shape [3]",
               [] {
                 cat({random({2, 3}), random({3})}, 0);
               });
  expect_error(ErrorKind::Index, "dimension out of range", [] {
    cat({random({2, 3}), random({2, 3})}, 2);
  });
}

TEST(Stack, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor a = random({2, 3}, dt, -5, 5, 1), b = non_contiguous(random({2, 3}, dt, -5, 5, 2));
    for (int64_t dim : {0, 1, 2, -1}) {
      int64_t d = dim < 0 ? dim + 3 : dim;
      Tensor got = stack({a, b}, dim);
      DimVector sizes{2, 3};
      sizes.insert(d, 2);
      ASSERT_EQ(got.sizes(), sizes.ref());
      std::vector<double> want(got.numel());
      auto av = to_doubles(a), bv = to_doubles(b);
      for_each_index(sizes, [&](const std::vector<int64_t>& idx) {
        std::vector<int64_t> src = idx;
        src.erase(src.begin() + d);
        want[flat(sizes, idx)] = (idx[d] == 0 ? av : bv)[flat({2, 3}, src)];
      });
      EXPECT_EQ(got.dtype(), dt);
      expect_close(got, ref_tensor(want, sizes), 0, 0);
    }
  }
}

TEST(Stack, PromotesZeroSizeAndBadInputs) {
  EXPECT_EQ(stack({random({2}, kInt32), random({2}, kFloat32)}).dtype(), kFloat32);
  EXPECT_EQ(stack({random({0, 3}), random({0, 3})}, 1).sizes(), IntArrayRef({0, 2, 3}));
  EXPECT_EQ(stack({scalar_tensor_of(1, kInt64), scalar_tensor_of(2, kInt64)}).sizes(),
            IntArrayRef({2}));
  expect_error(ErrorKind::Value, "got [2, 3] at entry 0 and [3, 2] at entry 1", [] {
    stack({random({2, 3}), random({3, 2})});
  });
  expect_error(ErrorKind::Value, "non-empty list", [] { stack(std::vector<Tensor>{}); });
  expect_error(ErrorKind::Index, "dimension out of range", [] {
    stack({random({2}), random({2})}, 3);
  });
}

// Each piece must be a view equal to the matching narrow of self.
void expect_pieces(const Tensor& self, const std::vector<Tensor>& pieces, int64_t dim,
                   std::vector<int64_t> lens) {
  ASSERT_EQ(pieces.size(), lens.size());
  int64_t start = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    EXPECT_TRUE(pieces[i].is_alias_of(self)) << "piece " << i << " is not a view";
    EXPECT_EQ(pieces[i].size(dim), lens[i]);
    expect_close(pieces[i], self.contiguous().narrow(dim, start, lens[i]), 0, 0);
    start += lens[i];
  }
}

TEST(Split, ViewsOfEveryDtype) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({5, 4}, dt, -5, 5);
    expect_pieces(x, split(x, 2), 0, {2, 2, 1});
    expect_pieces(x, x.split(4, -1), 1, {4});
    Tensor nc = non_contiguous(x);
    expect_pieces(nc, nc.split(3, 1), 1, {3, 1});
    expect_pieces(x, split(x, 7), 0, {5});
  }
  Tensor v = random({6});
  v.split(2)[1].fill_(9.0);  // writes through the view
  EXPECT_EQ(to_doubles(v)[2], 9.0);
}

TEST(Split, ZeroSizeAndBadInputs) {
  Tensor e = random({0, 3});
  expect_pieces(e, split(e, 2), 0, {0});
  expect_pieces(e, split(e, 0), 0, {0});
  expect_error(ErrorKind::Value, "split_size can only be 0 if dimension size is 0",
               [] { split(random({3}), 0); });
  expect_error(ErrorKind::Value, "non-negative", [] { split(random({3}), -1); });
  expect_error(ErrorKind::Value, "at least a 1-dimensional",
               [] { split(scalar_tensor_of(1.0, kFloat32), 1); });
  expect_error(ErrorKind::Index, "dimension out of range", [] { split(random({3}), 1, 1); });
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
  Tensor x = random({3});
  expect_pieces(x, split(x, kHuge), 0, {3});
  // A huge empty dimension split into rows: refused before a view per row is made.
  expect_error(ErrorKind::Value, "split: would return 1099511627776 tensors, more than the",
               [] { split(random({int64_t{1} << 40, 0}), 1); });
}

TEST(Chunk, ViewsOfEveryDtype) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({5, 6}, dt, -5, 5);
    expect_pieces(x, chunk(x, 3), 0, {2, 2, 1});
    expect_pieces(x, x.chunk(4, 1), 1, {2, 2, 2});  // like PyTorch: fewer chunks than asked
    expect_pieces(x, x.chunk(10, 0), 0, {1, 1, 1, 1, 1});
    Tensor nc = non_contiguous(x);
    expect_pieces(nc, nc.chunk(2, -1), 1, {3, 3});
  }
}

TEST(Chunk, ZeroSizeAndBadInputs) {
  Tensor e = random({0, 2});
  expect_pieces(e, chunk(e, 3), 0, {0, 0, 0});
  expect_error(ErrorKind::Value, "greater than 0, got: 0", [] { chunk(random({3}), 0); });
  expect_error(ErrorKind::Value, "at least a 1-dimensional",
               [] { chunk(scalar_tensor_of(1.0, kFloat32), 2); });
  Tensor x = random({3});
  expect_pieces(x, chunk(x, std::numeric_limits<int64_t>::max()), 0, {1, 1, 1});
  expect_error(ErrorKind::Value, "chunk: would return 1000000000000 tensors",
               [] { chunk(random({0, 2}), 1000000000000); });
}

Tensor ref_triangular(const Tensor& x, int64_t k, bool lower) {
  std::vector<double> v = to_doubles(x);
  int64_t R = x.size(-2), C = x.size(-1);
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    int64_t r = (i / C) % R, c = i % C;
    if (lower ? c - r > k : c - r < k) v[i] = 0;
  }
  return ref_tensor(v, x.sizes());
}

TEST(Triangular, EveryDtypeAndDiagonal) {
  for (ScalarType dt : dtypes_of_set("all")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor x = random({2, 4, 5}, dt, 1, 5);
    for (int64_t k : {-6, -1, 0, 2, 7}) {
      SCOPED_TRACE(k);
      expect_close(tril(x, k), ref_triangular(x, k, true), 0, 0);
      expect_close(x.triu(k), ref_triangular(x, k, false), 0, 0);
      Tensor nc = non_contiguous(random({3, 4}, dt, 1, 5));
      expect_close(nc.tril(k), ref_triangular(nc, k, true), 0, 0);
      expect_close(triu(nc.t(), k), ref_triangular(nc.t(), k, false), 0, 0);
    }
  }
}

TEST(Triangular, InPlaceAndOut) {
  Tensor x = non_contiguous(random({4, 3}));
  Tensor want = ref_triangular(x, 0, true);
  Tensor r = x.tril_();
  EXPECT_TRUE(r.is_same(x));
  expect_close(x, want, 0, 0);
  Tensor y = random({3, 3}, kInt32, 1, 9);
  want = ref_triangular(y, 1, false);
  triu_(y, 1);
  expect_close(y, want, 0, 0);
  Tensor src = random({3, 4}), out = random({0}), wide = random({4, 3}, kFloat64);
  Tensor o = tril_out(out, src, -1);
  EXPECT_TRUE(o.is_same(out));
  expect_close(out, ref_triangular(src, -1, true), 0, 0);
  triu_out(wide.t(), src, 0);  // non-contiguous out of another dtype
  expect_close(wide.t(), ref_triangular(src, 0, false));
}

TEST(Triangular, ZeroSizeAndBadInputs) {
  EXPECT_EQ(tril(random({0, 3})).sizes(), IntArrayRef({0, 3}));
  EXPECT_EQ(triu(random({2, 0, 3})).sizes(), IntArrayRef({2, 0, 3}));
  expect_error(ErrorKind::Value,
               "tril: input tensor must have at least 2 dimensions, got shape [3]",
               [] { tril(random({3})); });
  expect_error(ErrorKind::Value, "triu: input tensor must have at least 2 dimensions",
               [] { triu(scalar_tensor_of(1.0, kFloat32)); });
  expect_error(ErrorKind::Value, "at least 2 dimensions", [] { random({3}).tril_(); });
  expect_error(ErrorKind::Type, "can't be cast", [] {
    tril_out(random({2, 2}, kInt32), random({2, 2}));
  });
}

TEST(ShapeMeta, OutputsWithoutData) {
  Device meta("meta");
  Tensor a = empty({2, 3}, kInt32, meta), b = empty({4, 3}, kFloat32, meta);
  Tensor c = cat({a, b});
  EXPECT_TRUE(c.is_meta());
  EXPECT_EQ(c.sizes(), IntArrayRef({6, 3}));
  EXPECT_EQ(c.dtype(), kFloat32);
  EXPECT_EQ(stack({b, b}, 2).sizes(), IntArrayRef({4, 3, 2}));
  auto parts = chunk(b, 3);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_TRUE(parts[1].is_meta());
  EXPECT_EQ(parts[1].sizes(), IntArrayRef({2, 3}));
  expect_error(ErrorKind::Value, "tensor 0 has shape [2, 3] but tensor 1 has shape [2, 4]", [&] {
    cat({a, empty({2, 4}, kInt32, meta)});
  });
}

}  // namespace
}  // namespace kiln::testing
