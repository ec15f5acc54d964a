// linear_int8, conv2d_int8 and linear_int8_dynamic on the CPU (tensor/ops/quantized.toml, Note
// [Quantization scheme] there): oneDNN's u8 x s8 matmul and convolution (s32 accumulation,
// AVX-512 VNNI where the CPU has it), per-output-channel scales, bias and relu. Without oneDNN
// (KILN_HAVE_DNNL=0) the same math runs in float32 on the dequantized operands.
//
// Note [oneDNN int8 scales]: oneDNN 2.6 (Debian 12's libdnnl) computes an int8 primitive as
//   dst = post_ops(output_scale[n] * (sum_k (src - src_zp) * wei + bias[n])) + dst_zp,
// rounded to nearest-even and saturated to the dst type: the bias is added to the s32
// accumulator *before* the output scale (oneDNN 3 moved it after). With real values
// x = (q_x - zp_x) * s_x and w = q_w * s_w[n], the float result
//   y[n] = s_x * s_w[n] * sum_k (q_x - zp_x) q_w + bias[n]
// is therefore output_scale[n] = s_x * s_w[n] (/ s_y for a uint8 output) with the bias passed as
// bias[n] / (s_x * s_w[n]). Relu commutes with the positive output scale, and the dst zero point
// is added after the post-ops, so relu(y) / s_y + zp_y is exactly the quantized relu(y).
// conv2d_int8 runs that way; QuantizedTest.* check it against a float reference (within 1 LSB).
//
// Note [Int8 matmul epilogue]: the linear rows do not. In oneDNN 2.6 any output scale given at
// execution time (DNNL_RUNTIME_F32_VAL) turns the matmul from its brgemm VNNI kernel into the
// older gemm:jit one, and a constant scale makes the primitive depend on s_x, which the dynamic
// row changes every call. So the primitive computes only acc = sum_k (q_x - zp_x) q_w into
// float32 (the zero point given at execution, which brgemm supports), and one vectorized pass
// over the output applies y = acc * s_x * s_w[n] + bias[n], relu and, for linear_int8, the
// output quantization. The primitive then depends on (M, K, N) only and is created once per
// shape and kept (matmul_primitive). |acc| < K * 255 * 127 is exact in float32 up to K = 518;
// beyond, its rounding (2^-24 relative) is far below one output step.
//
// Note [Dynamic linear]: linear_int8_dynamic quantizes its input per call: one parallel pass
// for min/max, one for the uint8 codes (quantized.h's choose_qparams_u8 / quantize_u8), then
// the matmul and the epilogue. The weights stay in Kiln's (N, K) layout, read by oneDNN as a
// (K, N) matrix in column-major order ("ba").
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kiln/generated/meta/quantized.h"
#include "kiln/generated/ops/quantized.h"
#include "kiln/operators.h"
#include "loops.h"
#include "quantized.h"

#if KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include "dnnl_util.h"
#endif

namespace kiln::kernels {
namespace {

// The result of an int8 linear/convolution whose reduction is empty (K = 0 or C = 0): bias (or
// 0) broadcast to `sizes` with channel dim `cdim`, relu'd; float32.
Tensor bias_only(IntArrayRef sizes, int64_t cdim, const std::optional<Tensor>& bias, bool relu) {
  Tensor y = kiln::zeros(sizes, kFloat32);
  if (bias && bias->defined()) {
    DimVector shape(sizes.size(), 1);
    shape[cdim] = sizes[cdim];
    y = y + bias->reshape(shape);
  }
  return relu ? kiln::relu(y) : y;
}

// The weight scales as floats, each checked to be a positive finite number (ValueError naming
// `op` otherwise).
std::vector<float> checked_weight_scales(const Tensor& weight_scale, const char* op) {
  Tensor ws = weight_scale.contiguous();
  const float* w = ws.data_ptr<float>();
  std::vector<float> out(w, w + ws.numel());
  for (size_t i = 0; i < out.size(); ++i)
    KILN_CHECK(std::isfinite(out[i]) && out[i] > 0, Value, op,
               ": expected every weight_scale to be a positive finite number, got weight_scale[", i,
               "] = ", out[i]);
  return out;
}

// The bias as a float vector (empty when there is none).
std::vector<float> bias_vector(const std::optional<Tensor>& bias) {
  if (!bias || !bias->defined()) return {};
  Tensor b = bias->contiguous();
  return std::vector<float>(b.data_ptr<float>(), b.data_ptr<float>() + b.numel());
}

// Per-channel quantization parameters as float vectors: scales[n] = in_scale * w_scale[n] /
// out_scale, bias'[n] = bias[n] / (in_scale * w_scale[n]) (Note [oneDNN int8 scales]).
void fold_scales(const Tensor& weight_scale, const std::optional<Tensor>& bias, float in_scale,
                 float out_scale, std::vector<float>& scales, std::vector<float>& bias_q) {
  const std::vector<float> w = checked_weight_scales(weight_scale, "conv2d_int8");
  scales.resize(w.size());
  for (size_t i = 0; i < w.size(); ++i) scales[i] = in_scale * w[i] / out_scale;
  bias_q = bias_vector(bias);
  for (size_t i = 0; i < bias_q.size(); ++i) bias_q[i] /= in_scale * w[i];
}

#if KILN_HAVE_DNNL
using dnnl::memory;
using dt = memory::data_type;
using tag = memory::format_tag;

// ---- matmul (linear_int8, linear_int8_dynamic) ------------------------------------------------

struct MatmulKey {
  int64_t m, k, n;
  bool operator<(const MatmulKey& o) const { return std::tie(m, k, n) < std::tie(o.m, o.k, o.n); }
};

struct MatmulPrimitive {
  dnnl::matmul prim;
  memory::desc scratch;
};

// src (M, K) u8 with a zero point given at execution, weights (K, N) s8 read from Kiln's (N, K),
// dst (M, N) f32 = the integer sums (Note [Int8 matmul epilogue]). Kept for reuse; a process
// that sees very many shapes starts over after kMaxCached of them.
std::shared_ptr<const MatmulPrimitive> matmul_primitive(const MatmulKey& key) {
  constexpr size_t kMaxCached = 256;
  static std::mutex mu;
  static std::map<MatmulKey, std::shared_ptr<const MatmulPrimitive>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  using namespace dnnl;
  memory::desc src({key.m, key.k}, dt::u8, tag::ab), wei({key.k, key.n}, dt::s8, tag::ba);
  memory::desc dst({key.m, key.n}, dt::f32, tag::ab);
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei, dst), attr, dnnl_engine());
  auto p = std::make_shared<const MatmulPrimitive>(
      MatmulPrimitive{dnnl::matmul(pd), pd.scratchpad_desc()});
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxCached) cache.clear();
  cache.emplace(key, p);
  return p;
}

// acc (M, N) f32 contiguous = sum_k (x - x_zp) w for x (M, K) u8 and w (N, K) s8, contiguous.
void run_matmul(const Tensor& x, int32_t x_zp, const Tensor& w, const Tensor& acc) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  try {
    auto p = matmul_primitive({M, K, N});
    dnnl::engine& eng = dnnl_engine();
    auto mem = [&](memory::dims d, dt t, tag f, const void* ptr) {
      return memory({d, t, f}, eng, const_cast<void*>(ptr));
    };
    Tensor scratch = empty_on({static_cast<int64_t>(p->scratch.get_size())}, kUInt8, kCPU);
    int32_t zp = x_zp;
    sync_omp_threads();
    dnnl::stream s(eng);
    p->prim.execute(s,
                    {{DNNL_ARG_SRC, mem({M, K}, dt::u8, tag::ab, x.impl()->raw_data())},
                     {DNNL_ARG_WEIGHTS, mem({K, N}, dt::s8, tag::ba, w.impl()->raw_data())},
                     {DNNL_ARG_DST, mem({M, N}, dt::f32, tag::ab, acc.impl()->raw_data())},
                     {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, mem({1}, dt::s32, tag::a, &zp)},
                     {DNNL_ARG_SCRATCHPAD, memory(p->scratch, eng, scratch.impl()->raw_data())}});
    s.wait();
  } catch (const dnnl::error& e) {
    KILN_FAIL(Runtime, "int8 linear: oneDNN failed: ", e.what());
  }
}
#endif

// One row of the epilogue: y[n] = max(y[n] * scale[n] (+ bias[n]), lo), then quantized into out
// unless out is null.
void epilogue_row(float* y, const float* scale, const float* bias, int64_t n, float lo,
                  uint8_t* out, float out_scale, float out_zp) {
  if (bias) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = std::max(y[i] * scale[i] + bias[i], lo);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = std::max(y[i] * scale[i], lo);
  }
  if (out) quant::quantize_u8_n(y, out, n, out_scale, out_zp);
}

// The epilogue of Note [Int8 matmul epilogue] over acc (M, N) f32: y = acc * scale[n] + bias[n]
// (bias may be empty), relu'd; written over acc (out == nullptr) or quantized into out (M, N) u8
// with out_scale / out_zp.
void matmul_epilogue(const Tensor& acc, const std::vector<float>& scale,
                     const std::vector<float>& bias, bool relu, uint8_t* out, float out_scale,
                     float out_zp) {
  const int64_t M = acc.size(0), N = acc.size(1);
  float* a = acc.data_ptr<float>();
  const float* sc = scale.data();
  const float* bp = bias.empty() ? nullptr : bias.data();
  const float lo = relu ? 0.0f : -std::numeric_limits<float>::infinity();
  parallel_for(
      M, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(N, 1)), [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m)
          epilogue_row(a + m * N, sc, bp, N, lo, out ? out + m * N : nullptr, out_scale, out_zp);
      });
}

// Per-channel s_x * s_w[n] (checking the weight scales) and the bias as a float vector.
void linear_scales(const Tensor& weight_scale, const std::optional<Tensor>& bias, float in_scale,
                   std::vector<float>& scales, std::vector<float>& bias_v) {
  scales = checked_weight_scales(weight_scale, "int8 linear");
  for (float& v : scales) v *= in_scale;
  bias_v = bias_vector(bias);
}

#if KILN_HAVE_DNNL
// ---- convolution (conv2d_int8) ----------------------------------------------------------------

// out (N, O, OH, OW) u8 = the int8 convolution of x (N, C, H, W) u8 and w (O, C / G, kH, kW) s8,
// both contiguous.
void run_conv(const Tensor& x, int32_t x_zp, const Tensor& w, const std::vector<float>& scales,
              const std::vector<float>& bias_q, IntArrayRef stride, IntArrayRef padding,
              IntArrayRef dilation, int64_t groups, bool relu, const Tensor& out, int32_t out_zp) {
  using namespace dnnl;
  engine& eng = dnnl_engine();
  auto dims = [](IntArrayRef s) { return memory::dims(s.begin(), s.end()); };
  const memory::dims src = dims(x.sizes()), dst = dims(out.sizes());
  memory::dims wei = dims(w.sizes());
  if (groups > 1) {
    wei[0] /= groups;
    wei.insert(wei.begin(), groups);
  }
  memory::dims dil = dims(dilation);
  for (auto& d : dil) d -= 1;  // oneDNN counts the gaps
  const tag wei_tag = groups > 1 ? tag::abcde : tag::abcd;
  try {
    primitive_attr attr;
    attr.set_scratchpad_mode(scratchpad_mode::user);
    attr.set_output_scales(1 << 1, scales);
    attr.set_zero_points(DNNL_ARG_SRC, 0, {x_zp});
    attr.set_zero_points(DNNL_ARG_DST, 0, {out_zp});
    if (relu) {
      post_ops po;
      po.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
      attr.set_post_ops(po);
    }
    const memory::desc bias_md({dst[1]}, dt::f32, tag::a);
    auto any = [](const memory::dims& d, dt t) { return memory::desc(d, t, tag::any); };
    auto desc =
        bias_q.empty()
            ? convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct,
                                        any(src, dt::u8), any(wei, dt::s8), any(dst, dt::u8),
                                        dims(stride), dil, dims(padding), dims(padding))
            : convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct,
                                        any(src, dt::u8), any(wei, dt::s8), bias_md,
                                        any(dst, dt::u8), dims(stride), dil, dims(padding),
                                        dims(padding));
    convolution_forward::primitive_desc pd(desc, attr, eng);
    sync_omp_threads();
    stream s(eng);
    DnnlTemps temps(s);
    memory xm = temps.bring_in(x, {src, dt::u8, tag::abcd}, pd.src_desc());
    memory wm = temps.bring_in(w, {wei, dt::s8, wei_tag}, pd.weights_desc());
    memory user_out({dst, dt::u8, tag::abcd}, eng, out.impl()->raw_data());
    const bool direct = pd.dst_desc() == user_out.get_desc();
    memory om = direct ? user_out : temps.make(pd.dst_desc());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, xm},
                                         {DNNL_ARG_WEIGHTS, wm},
                                         {DNNL_ARG_DST, om},
                                         {DNNL_ARG_SCRATCHPAD, temps.make(pd.scratchpad_desc())}};
    if (!bias_q.empty())
      args.emplace(DNNL_ARG_BIAS, memory(bias_md, eng, const_cast<float*>(bias_q.data())));
    convolution_forward(pd).execute(s, args);
    if (!direct) reorder(om, user_out).execute(s, om, user_out);
    s.wait();
  } catch (const dnnl::error& e) {
    KILN_FAIL(Runtime, "conv2d_int8: oneDNN failed: ", e.what());
  }
}
#endif

// ---- the rows ---------------------------------------------------------------------------------

// acc (M, N) f32 = sum_k (x - x_zp) w for x (M, K) u8 and w (N, K) s8: oneDNN, or without it
// a float32 matmul of the codes (exact while the sums fit float32's 24 bits).
Tensor int8_matmul_acc(const Tensor& x, int64_t x_zp, const Tensor& w) {
#if KILN_HAVE_DNNL
  Tensor acc = empty_on({x.size(0), w.size(0)}, kFloat32, kCPU);
  run_matmul(x.contiguous(), static_cast<int32_t>(x_zp), w.contiguous(), acc);
  return acc;
#else
  return kiln::matmul(x.to(kFloat32) - static_cast<double>(x_zp), w.to(kFloat32).transpose(0, 1))
      .contiguous();
#endif
}

// input (*, K) u8, weight (N, K) s8, weight_scale (N) f32, bias (N) f32 -> (*, N) u8.
Tensor linear_int8_cpu(const Tensor& input, double input_scale, int64_t input_zero_point,
                       const Tensor& weight, const Tensor& weight_scale,
                       const std::optional<Tensor>& bias, double output_scale,
                       int64_t output_zero_point, bool relu) {
  TensorSpec spec = meta::linear_int8(input, input_scale, input_zero_point, weight, weight_scale,
                                      bias, output_scale, output_zero_point, relu);
  Tensor out = empty_on(spec.sizes, kUInt8, kCPU);
  if (out.numel() == 0) return out;
  const int64_t K = weight.size(1), N = weight.size(0), M = out.numel() / N;
  if (K == 0) {
    Tensor y = bias_only({M, N}, 1, bias, relu);
    return kiln::quantize_per_tensor(y, output_scale, output_zero_point).view(spec.sizes);
  }
  std::vector<float> scales, bias_v;
  linear_scales(weight_scale, bias, static_cast<float>(input_scale), scales, bias_v);
  Tensor acc = int8_matmul_acc(input.reshape({M, K}), input_zero_point, weight);
  matmul_epilogue(acc, scales, bias_v, relu, out.data_ptr<uint8_t>(),
                  static_cast<float>(output_scale), static_cast<float>(output_zero_point));
  return out;
}

// input (N, C, H, W) u8, weight (O, C / groups, kH, kW) s8, weight_scale (O), bias (O) f32 ->
// (N, O, OH, OW) u8.
Tensor conv2d_int8_cpu(const Tensor& input, double input_scale, int64_t input_zero_point,
                       const Tensor& weight, const Tensor& weight_scale,
                       const std::optional<Tensor>& bias, IntArrayRef stride, IntArrayRef padding,
                       IntArrayRef dilation, int64_t groups, double output_scale,
                       int64_t output_zero_point, bool relu) {
  TensorSpec spec =
      meta::conv2d_int8(input, input_scale, input_zero_point, weight, weight_scale, bias, stride,
                        padding, dilation, groups, output_scale, output_zero_point, relu);
  Tensor out = empty_on(spec.sizes, kUInt8, kCPU);
  if (out.numel() == 0) return out;
  if (weight.numel() == 0) {  // no input channels: the bias alone
    return kiln::quantize_per_tensor(bias_only(spec.sizes, 1, bias, relu), output_scale,
                                     output_zero_point);
  }
  std::vector<float> scales, bias_q;
  fold_scales(weight_scale, bias, static_cast<float>(input_scale), static_cast<float>(output_scale),
              scales, bias_q);
#if KILN_HAVE_DNNL
  run_conv(input.contiguous(), static_cast<int32_t>(input_zero_point), weight.contiguous(), scales,
           bias_q, stride, padding, dilation, groups, relu, out,
           static_cast<int32_t>(output_zero_point));
  return out;
#else
  Tensor x = kiln::dequantize_per_tensor(input, input_scale, input_zero_point);
  Tensor w = weight.to(kFloat32) * weight_scale.reshape({weight.size(0), 1, 1, 1});
  Tensor y = kiln::conv2d(x, w, bias, stride, padding, dilation, groups);
  if (relu) y = kiln::relu(y);
  return kiln::quantize_per_tensor(y, output_scale, output_zero_point);
#endif
}

// x (M, K) f32 contiguous -> (codes (M, K) u8, their parameters): Note [Dynamic linear].
std::pair<Tensor, quant::QParams> quantize_dynamic(const Tensor& x) {
  const int64_t n = x.numel();
  const float* xp = x.data_ptr<float>();
  constexpr int64_t kGrain = 1 << 16;
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<float> lo(chunks, 0.0f), hi(chunks, 0.0f);
  parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
    float l = 0, h = 0;  // the range always contains 0
    quant::min_max_n(xp + b, e - b, l, h);
    lo[b / kGrain] = l, hi[b / kGrain] = h;
  });
  float l = 0, h = 0;
  for (int64_t c = 0; c < chunks; ++c) l = std::min(l, lo[c]), h = std::max(h, hi[c]);
  KILN_CHECK(std::isfinite(l) && std::isfinite(h), Value,
             "linear_int8_dynamic: expected a finite input, got values in [", l, ", ", h, "]");
  const quant::QParams p = quant::choose_qparams_u8(l, h);
  Tensor q = empty_on(x.sizes(), kUInt8, kCPU);
  uint8_t* qp = q.data_ptr<uint8_t>();
  const float s = p.scale, zp = static_cast<float>(p.zero_point);
  parallel_for(n, kGrain,
               [&](int64_t b, int64_t e) { quant::quantize_u8_n(xp + b, qp + b, e - b, s, zp); });
  return {q, p};
}

// input (*, K) f32, weight (N, K) s8, weight_scale (N) f32, bias (N) f32 -> (*, N) f32.
Tensor linear_int8_dynamic_cpu(const Tensor& input, const Tensor& weight,
                               const Tensor& weight_scale, const std::optional<Tensor>& bias,
                               bool relu) {
  TensorSpec spec = meta::linear_int8_dynamic(input, weight, weight_scale, bias, relu);
  const int64_t K = weight.size(1), N = weight.size(0);
  const int64_t M = N == 0 ? 0 : numel_of(spec.sizes) / N;
  if (M == 0 || N == 0) return empty_on(spec.sizes, kFloat32, kCPU);
  if (K == 0) return bias_only({M, N}, 1, bias, relu).view(spec.sizes);
  auto [q, p] = quantize_dynamic(input.contiguous().view({M, K}));
  std::vector<float> scales, bias_v;
  linear_scales(weight_scale, bias, p.scale, scales, bias_v);
  Tensor acc = int8_matmul_acc(q, p.zero_point, weight);
  matmul_epilogue(acc, scales, bias_v, relu, nullptr, 0, 0);
  return acc.view(spec.sizes);
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::linear_int8>(linear_int8_cpu);
  m.impl<ops::conv2d_int8>(conv2d_int8_cpu);
  m.impl<ops::linear_int8_dynamic>(linear_int8_dynamic_cpu);
}

}  // namespace
}  // namespace kiln::kernels
