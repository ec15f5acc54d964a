// mm, bmm, addmm, matmul and linear against a naive triple loop in double
// (tensor/ops/linalg.toml). The reference reads the operands as stored (bfloat16 inputs
// already rounded), so the tolerance only covers the op's own rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "test_util.h"

namespace kiln::testing {
namespace {

// PyTorch's matmul semantics, spelled out: 1-D operands get a unit dim, batch dims broadcast,
// then C[b] = A[b] @ B[b] by a triple loop in double.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  auto av = to_doubles(a), bv = to_doubles(b);
  DimVector as(a.sizes()), bs(b.sizes());
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(0, 1);
  if (b1) bs.push_back(1);
  int64_t n = as[as.size() - 2], k = as.back(), m = bs.back();
  int64_t na = as.size() - 2, nb = bs.size() - 2, nd = std::max(na, nb);
  DimVector batch(nd);
  for (int64_t i = 0; i < nd; ++i) {
    int64_t da = i >= nd - na ? as[i - (nd - na)] : 1, db = i >= nd - nb ? bs[i - (nd - nb)] : 1;
    batch[i] = da == 1 ? db : da;
  }
  DimVector out_sizes(batch);
  if (!a1) out_sizes.push_back(n);
  if (!b1) out_sizes.push_back(m);
  std::vector<double> out(numel_of(batch) * n * m, 0.0);
  int64_t ob = 0;
  for_each_index(batch, [&](const std::vector<int64_t>& bi) {
    int64_t ia = 0, ib = 0;  // flat batch index into a and b (broadcast dims read index 0)
    for (int64_t i = 0; i < nd; ++i) {
      if (i >= nd - na) ia = ia * as[i - (nd - na)] + (as[i - (nd - na)] == 1 ? 0 : bi[i]);
      if (i >= nd - nb) ib = ib * bs[i - (nd - nb)] + (bs[i - (nd - nb)] == 1 ? 0 : bi[i]);
    }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < m; ++c) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += av[ia * n * k + r * k + p] * bv[ib * k * m + p * m + c];
        out[(ob * n + r) * m + c] = s;
      }
    ++ob;
  });
  return from_vector<double>(out, out_sizes);
}

// Tolerance of a length-k dot product in dtype dt against the double reference.
void expect_matmul_close(const Tensor& got, const Tensor& want, ScalarType dt, int64_t k) {
  EXPECT_EQ(got.dtype(), dt);
  double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (dt) {
    case kFloat64:
      return expect_close(got, want, 1e-12, 1e-13 * kk);
    case kFloat32:
      return expect_close(got, want, 1e-5, 2e-6 * kk);
    default:
      return expect_close(got, want, rtol_for(dt), 2e-3 * std::sqrt(kk));
  }
}

// The layouts an (r x c) operand is tested in: contiguous, transposed storage, padded rows
// (BLAS leading dimension > c), and strided columns (no BLAS layout: copied first).
std::vector<std::pair<const char*, Tensor>> layouts(const Tensor& x) {
  int64_t r = x.size(0), c = x.size(1);
  Tensor padded = empty_on({r, c + 5}, x.dtype(), kCPU).narrow(1, 2, c);
  padded.copy_(x);
  Tensor transposed = x.t().contiguous().t();
  return {{"contiguous", x},
          {"transposed", transposed},
          {"padded", padded},
          {"strided", non_contiguous(x)}};
}

TEST(MM, EveryDtypeAndLayoutAgainstReference) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor a = random({5, 7}, dt, -2, 2, 1), b = random({7, 3}, dt, -2, 2, 2);
    Tensor want = ref_matmul(a, b);
    for (auto& [na, la] : layouts(a))
      for (auto& [nb, lb] : layouts(b)) {
        SCOPED_TRACE(std::string(na) + " x " + nb);
        expect_matmul_close(mm(la, lb), want, dt, 7);
      }
  }
}

TEST(MM, LargerThanOneBlock) {
  // M not a multiple of 4, K crosses a 256 block, N crosses a 512 block (gemm_strided's tiling).
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor a = random({67, 300}, dt, -2, 2, 3), b = random({300, 530}, dt, -2, 2, 4);
    expect_matmul_close(a.mm(b), ref_matmul(a, b), dt, 300);
    Tensor at = random({300, 67}, dt, -2, 2, 5).t();
    expect_matmul_close(at.mm(b), ref_matmul(at, b), dt, 300);
  }
}

// See Note [GEMM leading dimensions]: large float32 GEMMs copy operands whose rows run along K
// and lie a multiple of 256 floats apart to padded rows first; padded and unpadded layouts of
// each operand, and a batch, still match.
TEST(MM, PaddedLeadingDimensions) {
  Tensor a = random({300, 512}, kFloat32, -2, 2, 6), b = random({512, 256}, kFloat32, -2, 2, 7);
  expect_matmul_close(a.mm(b), ref_matmul(a, b), kFloat32, 512);  // both 'N', ld 512 and 256
  Tensor at = random({512, 256}, kFloat32, -2, 2, 8).t();          // 'T', ld 256, 512 lines
  Tensor bt = random({768, 512}, kFloat32, -2, 2, 9).t();          // 'T', ld 512, 768 lines
  expect_matmul_close(at.mm(bt), ref_matmul(at, bt), kFloat32, 512);
  Tensor rows = random({300, 1024}, kFloat32, -2, 2, 10).narrow(1, 0, 512);  // ld 1024 > K
  expect_matmul_close(rows.mm(b), ref_matmul(rows, b), kFloat32, 512);
  Tensor ba = random({2, 256, 512}, kFloat32, -2, 2, 11), bb = random({2, 512, 256}, kFloat32, -2, 2, 12);
  expect_matmul_close(ba.bmm(bb), ref_matmul(ba, bb), kFloat32, 512);
}

TEST(MM, ThreadCountDoesNotChangeResults) {
  Tensor a = random({130, 150}), b = random({150, 140});
  int saved = get_num_threads();
  set_num_threads(1);
  Tensor one = mm(a, b);
  set_num_threads(2);
  Tensor two = mm(a, b);
  set_num_threads(saved);
  expect_matmul_close(one, ref_matmul(a, b), kFloat32, 150);
  expect_matmul_close(two, ref_matmul(a, b), kFloat32, 150);
}

TEST(MM, ZeroSize) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    EXPECT_EQ(mm(random({0, 3}, dt), random({3, 4}, dt)).sizes(), IntArrayRef({0, 4}));
    EXPECT_EQ(mm(random({2, 3}, dt), random({3, 0}, dt)).sizes(), IntArrayRef({2, 0}));
    for (int rep = 0; rep < 2; ++rep) {  // the second output reuses a cached (dirty) block
      Tensor z = mm(random({2, 0}, dt), random({0, 3}, dt));
      ASSERT_EQ(z.sizes(), IntArrayRef({2, 3}));
      for (double v : to_doubles(z)) EXPECT_EQ(v, 0.0);
      z.fill_(7);
    }
  }
}

TEST(MM, BadInputs) {
  expect_error(ErrorKind::Value, "mm: mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)", [] {
    mm(random({2, 3}), random({4, 5}));
  });
  expect_error(ErrorKind::Value, "mm: mat1 must be a matrix, got shape [3]", [] {
    mm(random({3}), random({3, 2}));
  });
  expect_error(ErrorKind::Value, "mm: mat2 must be a matrix", [] {
    mm(random({2, 3}), random({1, 3, 2}));
  });
  expect_error(ErrorKind::Type, "same dtype, but got float32 != float64", [] {
    mm(random({2, 3}), random({3, 2}, kFloat64));
  });
  expect_error(ErrorKind::Type, "floating-point", [] {
    mm(random({2, 3}, kInt64), random({3, 2}, kInt64));
  });
}

TEST(BMM, EveryDtypeAndLayoutAgainstReference) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor a = random({3, 5, 7}, dt, -2, 2, 1), b = random({3, 7, 4}, dt, -2, 2, 2);
    Tensor want = ref_matmul(a, b);
    expect_matmul_close(bmm(a, b), want, dt, 7);
    Tensor at = a.transpose(1, 2).contiguous().transpose(1, 2);        // transposed matrices
    Tensor bp = b.permute({1, 0, 2}).contiguous().permute({1, 0, 2});  // batch not outermost
    expect_matmul_close(at.bmm(bp), want, dt, 7);
    expect_matmul_close(non_contiguous(a).bmm(non_contiguous(b)), want, dt, 7);
    expect_matmul_close(a.bmm(b.narrow(0, 1, 1).expand({3, 7, 4})),
                        ref_matmul(a, b.narrow(0, 1, 1)), dt, 7);
  }
  // Big enough that each batch entry is one multi-threaded GEMM.
  Tensor a = random({2, 130, 140}), b = random({2, 140, 129});
  expect_matmul_close(bmm(a, b), ref_matmul(a, b), kFloat32, 140);
}

TEST(BMM, ZeroSizeAndBadInputs) {
  EXPECT_EQ(bmm(random({0, 2, 3}), random({0, 3, 4})).sizes(), IntArrayRef({0, 2, 4}));
  Tensor z = bmm(random({2, 2, 0}, kFloat64), random({2, 0, 3}, kFloat64));
  for (double v : to_doubles(z)) EXPECT_EQ(v, 0.0);
  expect_error(ErrorKind::Value,
               "bmm: batch1 and batch2 shapes cannot be multiplied (2x2x3 and 2x4x5)", [] {
                 bmm(random({2, 2, 3}), random({2, 4, 5}));
               });
  expect_error(ErrorKind::Value, "same batch size (2x2x3 and 3x3x5)", [] {
    bmm(random({2, 2, 3}), random({3, 3, 5}));
  });
  expect_error(ErrorKind::Value, "3-D", [] { bmm(random({2, 3}), random({3, 5})); });
}

TEST(Addmm, EveryDtypeBroadcastAndScalars) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor m1 = random({4, 6}, dt, -2, 2, 1), m2 = random({6, 5}, dt, -2, 2, 2);
    auto prod = to_doubles(ref_matmul(m1, m2));
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{5}, {1, 5}, {4, 1}, {4, 5}}) {
      Tensor self = random(shape, dt, -2, 2, 3);
      auto sv = to_doubles(self.expand({4, 5}));
      for (auto [beta, alpha] : {std::pair{1.0, 1.0}, std::pair{0.5, 2.0}, std::pair{-1.0, 0.25}}) {
        std::vector<double> want(prod.size());
        for (size_t i = 0; i < want.size(); ++i) want[i] = beta * sv[i] + alpha * prod[i];
        expect_matmul_close(addmm(self, m1, m2, beta, alpha), from_vector<double>(want, {4, 5}), dt,
                            6);
      }
    }
    expect_matmul_close(addmm(random({5}, dt), m1.t().contiguous().t(), non_contiguous(m2), 1, 1),
                        ref_matmul(m1, m2).add(random({5}, dt).to(kFloat64)), dt, 6);
  }
}

TEST(Addmm, BetaZeroIgnoresSelfAndZeroK) {
  Tensor nan = full({2, 3}, std::nan(""), kFloat32, std::nullopt);
  Tensor a = random({2, 4}), b = random({4, 3});
  expect_matmul_close(addmm(nan, a, b, 0, 1), ref_matmul(a, b), kFloat32, 4);
  Tensor self = random({2, 3}, kFloat64);
  expect_close(addmm(self, random({2, 0}, kFloat64), random({0, 3}, kFloat64), 3, 1),
               self.add(self, 2), 1e-12);
  Tensor z = addmm(nan, random({2, 0}), random({0, 3}), 0, 1);
  for (double v : to_doubles(z)) EXPECT_EQ(v, 0.0);
  expect_error(ErrorKind::Value,
               "addmm: self of shape [3] cannot be broadcast to the result shape [2, 4]", [] {
                 addmm(random({3}), random({2, 5}), random({5, 4}));
               });
  expect_error(ErrorKind::Value, "addmm: mat1 and mat2 shapes cannot be multiplied (2x5 and 4x4)",
               [] {
                 addmm(random({4}), random({2, 5}), random({4, 4}));
               });
}

TEST(Matmul, EveryRuleAgainstReference) {
  struct Case {
    DimVector a, b;
  };
  std::vector<Case> cases = {{{4}, {4}},
                             {{3, 4}, {4}},
                             {{4}, {4, 5}},
                             {{3, 4}, {4, 5}},
                             {{2, 3, 4}, {4}},
                             {{2, 3, 4}, {4, 5}},
                             {{4}, {2, 4, 5}},
                             {{3, 4}, {2, 4, 5}},
                             {{2, 3, 4}, {2, 4, 5}},
                             {{2, 1, 3, 4}, {5, 4, 2}},
                             {{1, 3, 4}, {6, 4, 2}},
                             {{0, 3, 4}, {4, 2}},
                             {{2, 3, 0}, {0, 5}}};
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::PrintToString(c.a.ref().vec()) + " @ " +
                   ::testing::PrintToString(c.b.ref().vec()));
      Tensor a = random(c.a, dt, -2, 2, 1), b = random(c.b, dt, -2, 2, 2);
      Tensor want = ref_matmul(a, b);
      int64_t k = a.size(-1);
      expect_matmul_close(matmul(a, b), want, dt, k);
      expect_matmul_close(non_contiguous(a).matmul(non_contiguous(b)), want, dt, k);
    }
  }
}

TEST(Matmul, BadInputs) {
  expect_error(ErrorKind::Value, "at least 1-D, but they are 0-D and 1-D",
               [] { matmul(scalar_tensor_of(1.0, kFloat32), random({2})); });
  expect_error(ErrorKind::Value, "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)",
               [] {
                 matmul(random({2, 3}), random({4, 5}));
               });
  expect_error(ErrorKind::Value, "matmul: shapes [3] and [4] cannot be multiplied",
               [] { matmul(random({3}), random({4})); });
  expect_error(ErrorKind::Value, "not broadcastable", [] {
    matmul(random({2, 3, 4}), random({3, 4, 5}));
  });
  expect_error(ErrorKind::Type, "same dtype", [] {
    matmul(random({2, 3}), random({3}, kFloat64));
  });
}

// input: (..., in), weight: (out, in), bias -> input @ weight^T + bias, by the reference.
Tensor ref_linear(const Tensor& x, const Tensor& w, const std::optional<Tensor>& bias) {
  Tensor y = ref_matmul(x, w.t());
  return bias ? y.add(bias->to(kFloat64)) : y;
}

TEST(Linear, EveryDtypeAgainstReference) {
  for (ScalarType dt : dtypes_of_set("floating")) {
    SCOPED_TRACE(scalar_type_name(dt));
    Tensor w = random({5, 4}, dt, -2, 2, 1), b = random({5}, dt, -2, 2, 2);
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{4}, {3, 4}, {2, 3, 4}, {0, 4}}) {
      Tensor x = random(shape, dt, -2, 2, 3);
      expect_matmul_close(linear(x, w, b), ref_linear(x, w, b), dt, 4);
      expect_matmul_close(linear(x, w), ref_linear(x, w, std::nullopt), dt, 4);
    }
    Tensor x = non_contiguous(random({2, 3, 4}, dt, -2, 2, 4)), b2 = random({3, 5}, dt, -2, 2, 5);
    expect_matmul_close(linear(x, non_contiguous(w), b2), ref_linear(x, w, b2), dt, 4);
  }
}

TEST(Linear, BadInputs) {
  expect_error(ErrorKind::Value,
               "linear: input of shape [2, 3] and weight of shape [5, 4] cannot be multiplied", [] {
                 linear(random({2, 3}), random({5, 4}));
               });
  expect_error(ErrorKind::Value, "weight must be a matrix", [] {
    linear(random({2, 3}), random({3}));
  });
  expect_error(ErrorKind::Value, "bias of shape [4] cannot be broadcast", [] {
    linear(random({2, 3}), random({5, 3}), random({4}));
  });
}

TEST(LinalgMeta, OutputsWithoutData) {
  Device meta("meta");
  Tensor a = empty({2, 1, 3, 4}, kBFloat16, meta), b = empty({5, 4, 6}, kBFloat16, meta);
  Tensor c = matmul(a, b);
  EXPECT_TRUE(c.is_meta());
  EXPECT_EQ(c.sizes(), IntArrayRef({2, 5, 3, 6}));
  EXPECT_EQ(mm(empty({2, 3}, kFloat32, meta), empty({3, 7}, kFloat32, meta)).sizes(),
            IntArrayRef({2, 7}));
  EXPECT_EQ(
      linear(empty({8, 4}, kFloat32, meta), empty({3, 4}, kFloat32, meta), std::nullopt).sizes(),
      IntArrayRef({8, 3}));
  expect_error(ErrorKind::Value, "(2x3 and 4x5)", [&] {
    mm(empty({2, 3}, kFloat32, meta), empty({4, 5}, kFloat32, meta));
  });
}

}  // namespace
}  // namespace kiln::testing
