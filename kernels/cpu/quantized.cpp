// The element-wise int8 quantization rows on the CPU (tensor/ops/quantized.toml, Note
// [Quantization scheme] there): quantize_per_tensor, dequantize_per_tensor,
// quantize_weight_per_channel and the two fake-quantize rows. The int8 linear and convolution
// are in quantized_dnnl.cpp. Every loop runs over contiguous float32/float64 data with the
// rounding of Note [Vectorizable rounding] (quantized.h), in parallel chunks (loops.h).
#include "kiln/generated/meta/quantized.h"

#include <vector>

#include "kiln/generated/ops/quantized.h"
#include "loops.h"
#include "quantized.h"

namespace kiln::kernels {
namespace {

using quant::quantize_value;

// A float input as contiguous float32 (other floating dtypes are converted first).
Tensor as_f32(const Tensor& t) {
  return t.dtype() == kFloat32 ? t.contiguous() : t.to(kFloat32).contiguous();
}

// x: (*) floating -> (*) uint8.
Tensor quantize_per_tensor_cpu(const Tensor& input, double scale, int64_t zero_point) {
  TensorSpec spec = meta::quantize_per_tensor(input, scale, zero_point);
  Tensor out = empty_on(spec.sizes, kUInt8, kCPU);
  if (out.numel() == 0) return out;
  Tensor x = as_f32(input);
  const float* xp = x.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  const float s = static_cast<float>(scale), zp = static_cast<float>(zero_point);
  parallel_for(out.numel(), kGrainSize,
               [&](int64_t b, int64_t e) { quant::quantize_u8_n(xp + b, op + b, e - b, s, zp); });
  return out;
}

// q: (*) uint8 -> (*) float32.
Tensor dequantize_per_tensor_cpu(const Tensor& input, double scale, int64_t zero_point) {
  TensorSpec spec = meta::dequantize_per_tensor(input, scale, zero_point);
  Tensor out = empty_on(spec.sizes, kFloat32, kCPU);
  if (out.numel() == 0) return out;
  Tensor q = input.contiguous();
  const uint8_t* qp = q.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale), zp = static_cast<float>(zero_point);
  parallel_for(out.numel(), kGrainSize, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) op[i] = (static_cast<float>(qp[i]) - zp) * s;
  });
  return out;
}

// The weight viewed as (C, R): channel c's R values contiguous (axis moved to the front).
// w: (..., C at axis, ...) floating -> (q int8 same shape, scales (C) float32).
std::tuple<Tensor, Tensor> quantize_weight_per_channel_cpu(const Tensor& weight, int64_t axis) {
  std::vector<TensorSpec> spec = meta::quantize_weight_per_channel(weight, axis);
  const int64_t a = axis < 0 ? axis + weight.dim() : axis;
  const int64_t C = spec[1].sizes[0];
  Tensor scales = empty_on({C}, kFloat32, kCPU);
  Tensor wt = as_f32(weight.transpose(0, a));  // (C, ...) contiguous
  Tensor qt = empty_on(wt.sizes(), kInt8, kCPU);
  const int64_t R = C == 0 ? 0 : wt.numel() / C;
  const float* wp = wt.data_ptr<float>();
  int8_t* qp = qt.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  parallel_for(C, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(R, 1)),
               [&](int64_t c0, int64_t c1) {
                 for (int64_t c = c0; c < c1; ++c) {
                   const float* w = wp + c * R;
                   float m = 0;
#pragma omp simd reduction(max : m)
                   for (int64_t i = 0; i < R; ++i) m = std::max(m, std::abs(w[i]));
                   // A channel of zeros (or an empty one) gets scale 1: its codes are 0 anyway.
                   const float s = m > 0 ? m / 127.0f : 1.0f;
                   sp[c] = s;
                   int8_t* q = qp + c * R;
#pragma omp simd
                   for (int64_t i = 0; i < R; ++i)
                     q[i] = static_cast<int8_t>(quantize_value(w[i], s, 0.0f, -127.0f, 127.0f));
                 }
               });
  Tensor q = qt.transpose(0, a).contiguous();
  return {q, scales};
}

// f(T{}) with T the C++ type of a float32/float64 dtype (the fake-quantize rows claim only
// those: QAT trains in float32 and gradcheck runs in float64).
template <typename F>
void dispatch_f32_f64(ScalarType dtype, const char* op, const F& f) {
  if (dtype == kFloat32) return f(float{});
  if (dtype == kFloat64) return f(double{});
  unsupported_dtype(op, dtype);
}

template <typename T>
void fake_quantize_loop(const T* x, T* out, int64_t n, T scale, T zp, T qmin, T qmax) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    out[i] = (quantize_value(x[i], scale, zp, qmin, qmax) - zp) * scale;
}

// x: (*) float32/float64 -> (*) same dtype.
Tensor fake_quantize_per_tensor_affine_cpu(const Tensor& input, double scale, int64_t zero_point,
                                           int64_t quant_min, int64_t quant_max) {
  TensorSpec spec =
      meta::fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max);
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  Tensor x = input.contiguous();
  dispatch_f32_f64(out.dtype(), "fake_quantize_per_tensor_affine", [&](auto t) {
    using T = decltype(t);
    const T* xp = x.data_ptr<T>();
    T* op = out.data_ptr<T>();
    parallel_for(out.numel(), kGrainSize, [&](int64_t b, int64_t e) {
      fake_quantize_loop<T>(xp + b, op + b, e - b, static_cast<T>(scale), T(zero_point),
                            T(quant_min), T(quant_max));
    });
  });
  return out;
}

// x: (outer, C at axis, inner) float32/float64, scale (C) floating, zero_point (C) int32/int64.
Tensor fake_quantize_per_channel_affine_cpu(const Tensor& input, const Tensor& scale,
                                            const Tensor& zero_point, int64_t axis,
                                            int64_t quant_min, int64_t quant_max) {
  const char* op = "fake_quantize_per_channel_affine";
  TensorSpec spec =
      meta::fake_quantize_per_channel_affine(input, scale, zero_point, axis, quant_min, quant_max);
  const int64_t a = axis < 0 ? axis + input.dim() : axis;
  Tensor s = scale.to(kFloat64).contiguous();
  Tensor z = zero_point.to(kInt64).contiguous();
  const int64_t C = s.numel();
  for (int64_t c = 0; c < C; ++c) {
    const double sc = s.data_ptr<double>()[c];
    const int64_t zc = z.data_ptr<int64_t>()[c];
    KILN_CHECK(std::isfinite(sc) && sc > 0, Value, op,
               ": expected every scale to be a positive finite number, got scale[", c, "] = ", sc);
    KILN_CHECK(zc >= quant_min && zc <= quant_max, Value, op,
               ": expected every zero_point in [quant_min, quant_max] = [", quant_min, ", ",
               quant_max, "], got zero_point[", c, "] = ", zc);
  }
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  Tensor x = input.contiguous();
  int64_t inner = 1;
  for (int64_t d = a + 1; d < input.dim(); ++d) inner *= input.size(d);
  const int64_t rows = out.numel() / inner;  // (outer * C) rows of `inner` values
  dispatch_f32_f64(out.dtype(), op, [&](auto t) {
    using T = decltype(t);
    const T* xp = x.data_ptr<T>();
    T* o = out.data_ptr<T>();
    const double* sp = s.data_ptr<double>();
    const int64_t* zp = z.data_ptr<int64_t>();
    parallel_for(rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(inner, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) {
                     const int64_t c = r % C;
                     fake_quantize_loop<T>(xp + r * inner, o + r * inner, inner,
                                           static_cast<T>(sp[c]), T(zp[c]), T(quant_min),
                                           T(quant_max));
                   }
                 });
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::quantize_per_tensor>(quantize_per_tensor_cpu);
  m.impl<ops::dequantize_per_tensor>(dequantize_per_tensor_cpu);
  m.impl<ops::quantize_weight_per_channel>(quantize_weight_per_channel_cpu);
  m.impl<ops::fake_quantize_per_tensor_affine>(fake_quantize_per_tensor_affine_cpu);
  m.impl<ops::fake_quantize_per_channel_affine>(fake_quantize_per_channel_affine_cpu);
}

}  // namespace
}  // namespace kiln::kernels
