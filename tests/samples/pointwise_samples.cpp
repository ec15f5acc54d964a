// Manifest samples for the pointwise ops (pointwise.toml, unary.toml), including the generated
// in-place ("sub_") and out= ("sub.out") variants. Each sample is a boxed argument list.
#include "samples/op_samples.h"
#include "samples/manifest.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;

// Appends an empty out= tensor (resized by the op) to each sample. A sample whose inputs are all
// integer counts for its own dtype only (Note [Sample dtypes]), so it gets a float32 companion:
// each integer tensor plus 0.25 for the first, 0.375 for the next, ... (off the points where
// floor, sign, fmod or a rounding div jump, so gradcheck stays smooth).
S with_out(S s) {
  S out;
  for (Stack st : s) {
    bool floating = false;
    for (const IValue& v : st)
      floating = floating || (v.is_tensor() && is_floating(v.to_tensor().dtype()));
    if (!floating) {
      Stack companion;
      double offset = 0.25;
      for (const IValue& v : st) {
        if (v.is_tensor() && v.to_tensor().dtype() != kBool) {
          companion.emplace_back(copy_tensor(v.to_tensor(), kFloat32, kCPU) + offset);
          offset += 0.125;
        } else {
          companion.push_back(v);
        }
      }
      companion.push_back(random({0}));
      out.push_back(std::move(companion));
    }
    st.push_back(random({0}));
    out.push_back(std::move(st));
  }
  return out;
}

// ---- unary
KILN_OP_SAMPLES("exp", exp_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("exp_", exp_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("exp.out", exp_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("log", log_s) { return S{{random({2, 3}, kFloat32, 0.5, 3)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, 0.5, 3)}}; }
KILN_OP_SAMPLES("log_", log_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, 0.5, 3))}}; }
KILN_OP_SAMPLES("log.out", log_out_s) { return with_out(S{{random({3, 2}, kFloat64, 0.5, 3)}}); }
KILN_OP_SAMPLES("log1p", log1p_s) { return S{{random({2, 3}, kFloat32, 0.5, 3)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, 0.5, 3)}}; }
KILN_OP_SAMPLES("log1p_", log1p_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, 0.5, 3))}}; }
KILN_OP_SAMPLES("log1p.out", log1p_out_s) { return with_out(S{{random({3, 2}, kFloat64, 0.5, 3)}}); }
KILN_OP_SAMPLES("expm1", expm1_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("expm1_", expm1_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("expm1.out", expm1_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("sqrt", sqrt_s) { return S{{random({2, 3}, kFloat32, 0.5, 3)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, 0.5, 3)}}; }
KILN_OP_SAMPLES("sqrt_", sqrt_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, 0.5, 3))}}; }
KILN_OP_SAMPLES("sqrt.out", sqrt_out_s) { return with_out(S{{random({3, 2}, kFloat64, 0.5, 3)}}); }
KILN_OP_SAMPLES("rsqrt", rsqrt_s) { return S{{random({2, 3}, kFloat32, 0.5, 3)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, 0.5, 3)}}; }
KILN_OP_SAMPLES("rsqrt_", rsqrt_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, 0.5, 3))}}; }
KILN_OP_SAMPLES("rsqrt.out", rsqrt_out_s) { return with_out(S{{random({3, 2}, kFloat64, 0.5, 3)}}); }
KILN_OP_SAMPLES("sin", sin_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("sin_", sin_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("sin.out", sin_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("cos", cos_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("cos_", cos_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("cos.out", cos_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("tanh", tanh_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("tanh_", tanh_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("tanh.out", tanh_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("sigmoid", sigmoid_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("sigmoid_", sigmoid_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("sigmoid.out", sigmoid_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("erf", erf_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("erf_", erf_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("erf.out", erf_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("reciprocal", reciprocal_s) { return S{{random({2, 3}, kFloat32, -2, 2)}, {random({4}, kInt32, 1, 5)}, {random({}, kFloat64, -2, 2)}}; }
KILN_OP_SAMPLES("reciprocal_", reciprocal_inplace_s) { return S{{non_contiguous(random({2, 3}, kFloat32, -2, 2))}}; }
KILN_OP_SAMPLES("reciprocal.out", reciprocal_out_s) { return with_out(S{{random({3, 2}, kFloat64, -2, 2)}}); }
KILN_OP_SAMPLES("neg", neg_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("neg_", neg_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("neg.out", neg_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("abs", abs_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("abs_", abs_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("abs.out", abs_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("relu", relu_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("relu_", relu_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("relu.out", relu_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("threshold_backward", threshold_backward_s) {
  return S{{random({2, 3}), random({2, 3}), Scalar(0)},
           {random({4}, kFloat64), random({4}, kFloat64), Scalar(0.25)},
           {random({3}, kInt32, -3, 3), random({2, 3}, kInt32, -3, 3), Scalar(1)},
           {non_contiguous(random({3, 2}, kBFloat16)), random({3, 2}, kBFloat16), Scalar(0)}};
}
KILN_OP_SAMPLES("floor", floor_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("floor_", floor_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("floor.out", floor_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("ceil", ceil_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("ceil_", ceil_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("ceil.out", ceil_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("round", round_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("round_", round_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("round.out", round_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("sign", sign_s) { return S{{random({2, 3})}, {random({4}, kInt16)}, {non_contiguous(random({3, 2}, kBFloat16))}}; }
KILN_OP_SAMPLES("sign_", sign_inplace_s) { return S{{non_contiguous(random({2, 3}))}}; }
KILN_OP_SAMPLES("sign.out", sign_out_s) { return with_out(S{{random({3, 2}, kInt64)}}); }
KILN_OP_SAMPLES("gelu", gelu_s) {
  return S{{random({2, 3}), "none"}, {random({4}, kFloat64), "tanh"}, {random({2}, kBFloat16), "none"}};
}
KILN_OP_SAMPLES("gelu_", gelu_inplace_s) { return S{{non_contiguous(random({2, 3})), "tanh"}}; }
KILN_OP_SAMPLES("gelu.out", gelu_out_s) { return with_out(S{{random({3}), "none"}}); }
KILN_OP_SAMPLES("gelu_backward", gelu_backward_s) {
  return S{{random({2, 3}), random({2, 3}, kFloat32, -3, 3), "none"},
           {random({4}, kFloat64), random({4}, kFloat64, -3, 3), "tanh"},
           {random({2}, kBFloat16), non_contiguous(random({3, 2}, kBFloat16, -3, 3)), "none"}};
}
KILN_OP_SAMPLES("silu", silu_s) { return S{{random({2, 3})}, {random({4}, kFloat16)}}; }
KILN_OP_SAMPLES("silu_", silu_inplace_s) { return S{{random({2, 3}, kFloat64)}}; }
KILN_OP_SAMPLES("silu.out", silu_out_s) { return with_out(S{{random({3})}}); }
KILN_OP_SAMPLES("logical_not", logical_not_s) { return S{{random({2, 3})}, {random({4}, kBool)}}; }
KILN_OP_SAMPLES("logical_not_", logical_not_inplace_s) { return S{{random({2, 3}, kInt32)}, {random({3, 2})}}; }
KILN_OP_SAMPLES("logical_not.out", logical_not_out_s) { return with_out(S{{random({3})}}); }
KILN_OP_SAMPLES("clamp", clamp_s) {
  return S{{random({2, 3}), Scalar(-0.5), Scalar(0.5)}, {random({4}, kInt32), Scalar(0.5), kNone},
           {random({4}, kInt64), kNone, Scalar(1)}};
}
KILN_OP_SAMPLES("clamp_", clamp_inplace_s) { return S{{non_contiguous(random({2, 3})), Scalar(0), kNone}}; }
KILN_OP_SAMPLES("clamp.out", clamp_out_s) { return with_out(S{{random({3}, kInt8), Scalar(-1), Scalar(1)}}); }

// ---- binary
KILN_OP_SAMPLES("sub", sub_s) {
  return S{{random({2, 3}), random({3}), Scalar(2)},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64), Scalar(1)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2)), Scalar(1)}};
}
KILN_OP_SAMPLES("sub_", sub_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3}), Scalar(1)}}; }
KILN_OP_SAMPLES("sub.out", sub_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4), Scalar(1)}}); }
KILN_OP_SAMPLES("mul", mul_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("mul_", mul_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("mul.out", mul_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("maximum", maximum_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("maximum_", maximum_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("maximum.out", maximum_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("minimum", minimum_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("minimum_", minimum_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("minimum.out", minimum_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("pow", pow_s) {
  return S{{random({2, 3}), random({3}, kFloat32, 0.5, 2)},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64, 0.5, 2)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("pow_", pow_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3}, kFloat32, 0.5, 2)}}; }
KILN_OP_SAMPLES("pow.out", pow_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("fmod", fmod_s) {
  return S{{random({2, 3}), random({3}, kFloat32, 0.5, 2)},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64, 0.5, 2)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("fmod_", fmod_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3}, kFloat32, 0.5, 2)}}; }
KILN_OP_SAMPLES("fmod.out", fmod_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("remainder", remainder_s) {
  return S{{random({2, 3}), random({3}, kFloat32, 0.5, 2)},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64, 0.5, 2)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("remainder_", remainder_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3}, kFloat32, 0.5, 2)}}; }
KILN_OP_SAMPLES("remainder.out", remainder_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("eq", eq_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("eq_", eq_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("eq.out", eq_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("ne", ne_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("ne_", ne_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("ne.out", ne_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("lt", lt_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("lt_", lt_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("lt.out", lt_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("le", le_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("le_", le_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("le.out", le_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("gt", gt_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("gt_", gt_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("gt.out", gt_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("ge", ge_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("ge_", ge_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("ge.out", ge_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("logical_and", logical_and_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("logical_and_", logical_and_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("logical_and.out", logical_and_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("logical_or", logical_or_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("logical_or_", logical_or_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("logical_or.out", logical_or_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("logical_xor", logical_xor_s) {
  return S{{random({2, 3}), random({3})},
           {random({2, 1}, kInt32, 1, 4), random({3}, kFloat64)},
           {random({4}, kInt16, 1, 4), scalar_to_tensor(Scalar(2))}};
}
KILN_OP_SAMPLES("logical_xor_", logical_xor_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3})}}; }
KILN_OP_SAMPLES("logical_xor.out", logical_xor_out_s) { return with_out(S{{random({2, 3}, kInt64, 1, 4), random({2, 1}, kInt64, 1, 4)}}); }
KILN_OP_SAMPLES("div", div_s) {
  return S{{random({2, 3}), random({3}, kFloat32, 0.5, 2), kNone}, {random({4}, kInt32, 1, 9), random({4}, kInt32, 1, 3), kNone},
           {random({4}, kInt32, -9, 9), random({1}, kInt64, 1, 3), "floor"}, {random({2, 2}, kFloat64), scalar_to_tensor(Scalar(3)), "trunc"}};
}
KILN_OP_SAMPLES("div_", div_inplace_s) { return S{{non_contiguous(random({2, 3})), random({3}, kFloat32, 0.5, 2), kNone}}; }
KILN_OP_SAMPLES("div.out", div_out_s) {
  // rounding_mode 'trunc' refuses bool tensors (as PyTorch does), so that sample has no float
  // companion (which would be cast to bool) and counts for int64 only.
  S s = with_out(S{{random({3}, kInt64), random({3}, kInt64, 1, 3), kNone}});
  s.push_back({random({2, 3}, kInt64, 1, 9), random({3}, kInt64, 1, 3), "trunc", random({0})});
  return s;
}
KILN_OP_SAMPLES("where", where_s) {
  return S{{random({2, 3}, kBool), random({3}), random({2, 1}, kFloat64)}, {random({4}, kBool), random({}, kInt32), random({}, kFloat64)}};
}
KILN_OP_SAMPLES("where.out", where_out_s) { return with_out(S{{random({2, 1}, kBool), random({3}, kInt8), random({2, 3}, kInt16)}}); }

}  // namespace
}  // namespace kiln::testing
