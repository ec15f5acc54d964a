// ScalarType, Half/BFloat16 conversion, type promotion (Note [Type promotion]), Scalar, Device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "test_util.h"

namespace kiln {
namespace {

TEST(ScalarType, SizesAndNames) {
  EXPECT_EQ(element_size(kBool), 1u);
  EXPECT_EQ(element_size(kBFloat16), 2u);
  EXPECT_EQ(element_size(kInt64), 8u);
  EXPECT_STREQ(scalar_type_name(kFloat16), "float16");
  EXPECT_EQ(scalar_type_from_name("bfloat16"), kBFloat16);
  EXPECT_EQ(scalar_type_from_name("kiln.float64"), kFloat64);
  testing::expect_error(ErrorKind::Value, "unknown dtype", [] { scalar_type_from_name("float128"); });
}

// torch.promote_types for every pair, as PyTorch 2.x defines it.
TEST(ScalarType, PromoteTypesTable) {
  const ScalarType b = kBool, u1 = kUInt8, i1 = kInt8, i2 = kInt16, i4 = kInt32, i8 = kInt64,
                   f2 = kFloat16, bf = kBFloat16, f4 = kFloat32, f8 = kFloat64;
  const ScalarType order[] = {b, u1, i1, i2, i4, i8, f2, bf, f4, f8};
  const ScalarType table[10][10] = {
      /* b  */ {b, u1, i1, i2, i4, i8, f2, bf, f4, f8},
      /* u1 */ {u1, u1, i2, i2, i4, i8, f2, bf, f4, f8},
      /* i1 */ {i1, i2, i1, i2, i4, i8, f2, bf, f4, f8},
      /* i2 */ {i2, i2, i2, i2, i4, i8, f2, bf, f4, f8},
      /* i4 */ {i4, i4, i4, i4, i4, i8, f2, bf, f4, f8},
      /* i8 */ {i8, i8, i8, i8, i8, i8, f2, bf, f4, f8},
      /* f2 */ {f2, f2, f2, f2, f2, f2, f2, f4, f4, f8},
      /* bf */ {bf, bf, bf, bf, bf, bf, f4, bf, f4, f8},
      /* f4 */ {f4, f4, f4, f4, f4, f4, f4, f4, f4, f8},
      /* f8 */ {f8, f8, f8, f8, f8, f8, f8, f8, f8, f8},
  };
  for (int i = 0; i < 10; ++i)
    for (int j = 0; j < 10; ++j)
      EXPECT_EQ(promote_types(order[i], order[j]), table[i][j]) << order[i] << " + " << order[j];
}

// torch.result_type: dim>0 tensors > 0-dim tensors > wrapped numbers, within a category.
TEST(ScalarType, ResultTypeCategories) {
  Tensor i32 = zeros({2}, kInt32), f64_0d = zeros({}, kFloat64), f16 = zeros({2}, kFloat16);
  Tensor u8 = zeros({2}, kUInt8), b = zeros({2}, kBool);
  EXPECT_EQ(result_type({i32, scalar_to_tensor(2.5)}), kFloat32);   // int tensor + float scalar
  EXPECT_EQ(result_type({i32, scalar_to_tensor(int64_t{2})}), kInt32);
  EXPECT_EQ(result_type({f16, scalar_to_tensor(2.5)}), kFloat16);
  EXPECT_EQ(result_type({f16, f64_0d}), kFloat16);                   // same category: dim wins
  EXPECT_EQ(result_type({i32, f64_0d}), kFloat64);                   // higher category wins
  EXPECT_EQ(result_type({u8, zeros({}, kInt64)}), kUInt8);
  EXPECT_EQ(result_type({b, scalar_to_tensor(int64_t{1})}), kInt64);
  EXPECT_EQ(result_type({b, scalar_to_tensor(true)}), kBool);
  EXPECT_EQ(result_type({zeros({}, kInt32), scalar_to_tensor(1.0)}), kFloat32);
}

TEST(Half, RoundTripAndRounding) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.9604645e-08f})
    EXPECT_EQ(float(Half(f)), f) << f;
  EXPECT_TRUE(std::isinf(float(Half(70000.0f))));
  EXPECT_TRUE(std::isnan(float(Half(NAN))));
  EXPECT_EQ(float(Half(1.0f + 1.0f / 2048)), 1.0f);               // ties to even
  EXPECT_EQ(float(Half(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);
  EXPECT_EQ(float(Half(1.0f + 3.0f / 4096)), 1.0f + 1.0f / 1024);
  EXPECT_EQ(float(Half(1e-8f)), 0.0f);                              // underflow
  EXPECT_EQ(float(Half(3e-8f)), 5.9604645e-08f);                    // rounds up to min subnormal
}

TEST(BFloat16, RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -3.0f, 1.5f, 3.0e38f}) EXPECT_EQ(float(BFloat16(f)), float(BFloat16(float(BFloat16(f)))));
  EXPECT_EQ(float(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(float(BFloat16(1.0f + 1.0f / 256)), 1.0f);              // ties to even
  EXPECT_EQ(float(BFloat16(1.0f + 3.0f / 256)), 1.0f + 2.0f / 128);
  EXPECT_TRUE(std::isnan(float(BFloat16(NAN))));
  EXPECT_TRUE(std::isinf(float(BFloat16(INFINITY))));
}

TEST(Scalar, Kinds) {
  EXPECT_EQ(Scalar(2.5).dtype(), kFloat64);
  EXPECT_EQ(Scalar(3).dtype(), kInt64);
  EXPECT_EQ(Scalar(true).dtype(), kBool);
  EXPECT_EQ(Scalar(2.7).to<int64_t>(), 2);
  EXPECT_EQ(Scalar(int64_t{1} << 40).to_double(), std::ldexp(1.0, 40));
}

TEST(Device, Parsing) {
  EXPECT_EQ(Device("cpu"), kCPU);
  EXPECT_EQ(Device("cuda").index(), 0);
  EXPECT_EQ(Device("cuda:3").index(), 3);
  EXPECT_EQ(Device("cuda:3").str(), "cuda:3");
  EXPECT_EQ(Device("meta").type(), DeviceType::Meta);
  EXPECT_NE(Device("cuda:0"), Device("cuda:1"));
  testing::expect_error(ErrorKind::Value, "unknown device", [] { Device("tpu"); });
  testing::expect_error(ErrorKind::Value, "bad device index", [] { Device("cuda:x"); });
  testing::expect_error(ErrorKind::Value, "takes no index", [] { Device("cpu:1"); });
}

}  // namespace
}  // namespace kiln
