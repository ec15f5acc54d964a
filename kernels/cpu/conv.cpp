// convolution and convolution_backward_weight on the CPU (tensor/ops/conv.toml).
//
// Note [CPU convolution]: both rows run one of the three passes of a plain convolution
// src (N, C, in...) * wei (O, C / groups, k...) = dst (N, O, out...): forward (src, wei -> dst),
// backward data (diff_dst, wei -> diff_src) and backward weights (src, diff_dst -> diff_wei).
// A transposed convolution is the backward data pass of the plain convolution it is the adjoint
// of (its input plays diff_dst, its output diff_src; its weight (C, O / groups, k...) is that
// convolution's weight as stored). Padding is symmetric: the floor in the output size drops
// the trailing rows oneDNN would otherwise ask a right padding for.
// - float32 runs on oneDNN, which picks its own (blocked) layouts: operands are reordered from
//   and to Kiln's contiguous NC(H)W around the primitive. In a build without oneDNN
//   (KILN_HAVE_DNNL=0) it takes float64's path.
// - bfloat16/float16 run on oneDNN (float32 accumulation) when it has an optimized
//   implementation for this CPU (AVX-512 BF16, AMX); otherwise they are computed in float32 and
//   rounded once at the end.
// - float64, which oneDNN lacks, uses im2col and kiln::matmul (1-D convolutions as 2-D ones
//   with H = 1).
#include <vector>

#include "kiln/generated/meta/conv.h"
#include "kiln/generated/ops/conv.h"
#include "kiln/meta.h"
#include "loops.h"

#if KILN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include "dnnl_util.h"
#endif

namespace kiln::kernels {
namespace {

enum class Pass { kForward, kBackwardData, kBackwardWeights };

struct ConvGeom {
  DimVector src, wei, dst, stride, padding, dilation;
  int64_t groups;
};

#if KILN_HAVE_DNNL
// ---- oneDNN ------------------------------------------------------------------------------------

using dnnl::memory;

memory::dims to_dims(IntArrayRef s) { return memory::dims(s.begin(), s.end()); }

memory::format_tag plain_tag(size_t ndims) {
  using tag = memory::format_tag;
  return ndims == 3 ? tag::abc : ndims == 4 ? tag::abcd : tag::abcde;
}

// oneDNN's grouped weights: (G, O / G, C / G, k...), the same memory as Kiln's (O, C / G, k...).
memory::dims weight_dims(const ConvGeom& g) {
  memory::dims d = to_dims(g.wei);
  if (g.groups == 1) return d;
  d[0] /= g.groups;
  d.insert(d.begin(), g.groups);
  return d;
}

// Runs `pass` in oneDNN dtype dt. a, b: the pass's inputs (forward: src, wei; backward data:
// diff_dst, wei; backward weights: src, diff_dst), contiguous; out: its contiguous output.
// Returns false, computing nothing, when dt is a low-precision type that oneDNN supports only
// with its reference implementation here.
bool dnnl_conv(Pass pass, const ConvGeom& g, memory::data_type dt, const Tensor& a, const Tensor& b,
               const Tensor& out) {
  using namespace dnnl;
  engine& eng = dnnl_engine();
  const memory::dims src = to_dims(g.src), dst = to_dims(g.dst), wei = weight_dims(g);
  const memory::dims strides = to_dims(g.stride), pad = to_dims(g.padding);
  memory::dims dil = to_dims(g.dilation);
  for (auto& d : dil) d -= 1;  // oneDNN counts the gaps
  auto any = [&](const memory::dims& d) { return memory::desc(d, dt, memory::format_tag::any); };
  auto plain = [&](const memory::dims& d) { return memory::desc(d, dt, plain_tag(d.size())); };
  const bool lowp = dt != memory::data_type::f32;
  const algorithm alg = algorithm::convolution_direct;
  primitive_attr attr;
  attr.set_scratchpad_mode(scratchpad_mode::user);
  try {
    convolution_forward::primitive_desc fwd(
        convolution_forward::desc(prop_kind::forward_training, alg, any(src), any(wei), any(dst),
                                  strides, dil, pad, pad),
        attr, eng);
    primitive prim;
    memory::desc amd, bmd, omd, scratch;
    memory::dims adims, bdims, odims;
    int aarg, barg, oarg;
    if (pass == Pass::kForward) {
      if (lowp && is_reference_impl(fwd)) return false;
      prim = convolution_forward(fwd);
      amd = fwd.src_desc(), bmd = fwd.weights_desc(), omd = fwd.dst_desc();
      adims = src, bdims = wei, odims = dst;
      aarg = DNNL_ARG_SRC, barg = DNNL_ARG_WEIGHTS, oarg = DNNL_ARG_DST;
      scratch = fwd.scratchpad_desc();
    } else if (pass == Pass::kBackwardData) {
      convolution_backward_data::primitive_desc pd(
          convolution_backward_data::desc(alg, any(src), any(wei), any(dst), strides, dil, pad,
                                          pad),
          attr, eng, fwd);
      if (lowp && is_reference_impl(pd)) return false;
      prim = convolution_backward_data(pd);
      amd = pd.diff_dst_desc(), bmd = pd.weights_desc(), omd = pd.diff_src_desc();
      adims = dst, bdims = wei, odims = src;
      aarg = DNNL_ARG_DIFF_DST, barg = DNNL_ARG_WEIGHTS, oarg = DNNL_ARG_DIFF_SRC;
      scratch = pd.scratchpad_desc();
    } else {
      convolution_backward_weights::primitive_desc pd(
          convolution_backward_weights::desc(alg, any(src), any(wei), any(dst), strides, dil, pad,
                                             pad),
          attr, eng, fwd);
      if (lowp && is_reference_impl(pd)) return false;
      prim = convolution_backward_weights(pd);
      amd = pd.src_desc(), bmd = pd.diff_dst_desc(), omd = pd.diff_weights_desc();
      adims = src, bdims = dst, odims = wei;
      aarg = DNNL_ARG_SRC, barg = DNNL_ARG_DIFF_DST, oarg = DNNL_ARG_DIFF_WEIGHTS;
      scratch = pd.scratchpad_desc();
    }
    sync_omp_threads();
    stream s(eng);
    DnnlTemps temps(s);
    memory am = temps.bring_in(a, plain(adims), amd), bm = temps.bring_in(b, plain(bdims), bmd);
    memory user_out(plain(odims), eng, out.impl()->raw_data());
    const bool direct = omd == user_out.get_desc();
    memory om = direct ? user_out : temps.make(omd);
    prim.execute(s,
                 {{aarg, am}, {barg, bm}, {oarg, om}, {DNNL_ARG_SCRATCHPAD, temps.make(scratch)}});
    if (!direct) reorder(om, user_out).execute(s, om, user_out);
    s.wait();
    return true;
  } catch (const dnnl::error& e) {
    if (lowp && e.status == dnnl_unimplemented) return false;
    KILN_FAIL(Runtime, "convolution: oneDNN failed: ", e.what());
  }
}
#endif

// ---- float64 (and float32 without oneDNN): im2col + GEMM ---------------------------------------

// A 1-D convolution as a 2-D one with H = 1.
ConvGeom as_2d(ConvGeom g) {
  if (g.src.size() == 4) return g;
  g.src.insert(2, 1), g.wei.insert(2, 1), g.dst.insert(2, 1);
  g.stride.insert(0, 1), g.padding.insert(0, 0), g.dilation.insert(0, 1);
  return g;
}

// Visits, for every input plane (n, c) in parallel, each (kernel offset, output position) with
// the input position it reads: f(plane, kk, l, i), i = -1 where the window reads padding.
// kk = kh * KW + kw, l = oh * OW + ow, i = ih * W + iw.
template <typename F>
void for_each_tap(const ConvGeom& g, const F& f) {
  const int64_t H = g.src[2], W = g.src[3], KH = g.wei[2], KW = g.wei[3];
  const int64_t OH = g.dst[2], OW = g.dst[3];
  const int64_t work = KH * KW * OH * OW;
  parallel_for(g.src[0] * g.src[1], std::max<int64_t>(1, kGrainSize / std::max<int64_t>(work, 1)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p)
                   for (int64_t kh = 0; kh < KH; ++kh)
                     for (int64_t kw = 0; kw < KW; ++kw)
                       for (int64_t oh = 0; oh < OH; ++oh) {
                         const int64_t ih = oh * g.stride[0] - g.padding[0] + kh * g.dilation[0];
                         for (int64_t ow = 0; ow < OW; ++ow) {
                           const int64_t iw = ow * g.stride[1] - g.padding[1] + kw * g.dilation[1];
                           const bool in = ih >= 0 && ih < H && iw >= 0 && iw < W;
                           f(p, kh * KW + kw, oh * OW + ow, in ? ih * W + iw : -1);
                         }
                       }
               });
}

// x: (N, C, H, W) contiguous, T its dtype -> cols: (N, G, C / G * KH * KW, OH * OW), 0 where
// padding is read.
template <typename T>
Tensor im2col(const Tensor& x, const ConvGeom& g) {
  const int64_t K = g.wei[2] * g.wei[3], L = g.dst[2] * g.dst[3], HW = g.src[2] * g.src[3];
  Tensor cols = empty_on({g.src[0], g.groups, g.src[1] / g.groups * K, L}, x.dtype(), kCPU);
  const T* xp = static_cast<const T*>(x.impl()->raw_data());
  T* cp = static_cast<T*>(cols.impl()->raw_data());
  for_each_tap(g, [&](int64_t p, int64_t kk, int64_t l, int64_t i) {
    cp[(p * K + kk) * L + l] = i < 0 ? T(0) : xp[p * HW + i];
  });
  return cols;
}

// The adjoint: cols (N, G, C / G * KH * KW, OH * OW) contiguous, T its dtype, summed into
// (N, C, H, W).
template <typename T>
Tensor col2im(const Tensor& cols, const ConvGeom& g) {
  const int64_t K = g.wei[2] * g.wei[3], L = g.dst[2] * g.dst[3], HW = g.src[2] * g.src[3];
  Tensor x = kiln::zeros(g.src, cols.dtype());
  const T* cp = static_cast<const T*>(cols.impl()->raw_data());
  T* xp = static_cast<T*>(x.impl()->raw_data());
  for_each_tap(g, [&](int64_t p, int64_t kk, int64_t l, int64_t i) {
    if (i >= 0) xp[p * HW + i] += cp[(p * K + kk) * L + l];
  });
  return x;
}

// The pass on 2-D geometry in a's dtype T (float64, or float32 without oneDNN); a, b contiguous
// as in dnnl_conv. Returns the output in the pass's shape.
template <typename T>
Tensor conv_im2col(Pass pass, const ConvGeom& g, const Tensor& a, const Tensor& b) {
  const int64_t N = g.src[0], G = g.groups, Og = g.wei[0] / G;
  const int64_t K = g.wei[1] * g.wei[2] * g.wei[3], L = g.dst[2] * g.dst[3];
  if (pass == Pass::kForward) {  // (1, G, Og, K) @ (N, G, K, L) -> (N, G, Og, L)
    return kiln::matmul(b.view({1, G, Og, K}), im2col<T>(a, g)).view(g.dst);
  }
  if (pass == Pass::kBackwardData) {  // (1, G, K, Og) @ (N, G, Og, L) -> (N, G, K, L)
    Tensor cols = kiln::matmul(b.view({1, G, Og, K}).transpose(2, 3), a.view({N, G, Og, L}));
    return col2im<T>(cols, g);
  }
  // (N, G, Og, L) @ (N, G, L, K) -> (N, G, Og, K), summed over N.
  Tensor per_n = kiln::matmul(b.view({N, G, Og, L}), im2col<T>(a, g).transpose(2, 3));
  return per_n.sum(std::vector<int64_t>{0}).view(g.wei);
}

// ---- dtype dispatch ----------------------------------------------------------------------------

// Runs `pass` of the plain convolution `g` on a and b (as in dnnl_conv), in their dtype; the
// result has out_sizes (the pass's output shape in the caller's rank).
Tensor run_conv(Pass pass, const ConvGeom& g, const Tensor& a_in, const Tensor& b_in,
                IntArrayRef out_sizes) {
  const ScalarType dtype = a_in.dtype();
  if (a_in.numel() == 0 || b_in.numel() == 0) return kiln::zeros(out_sizes, dtype);
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  if (dtype == kFloat64) return conv_im2col<double>(pass, as_2d(g), a, b).view(out_sizes);
#if KILN_HAVE_DNNL
  Tensor out = empty_on(out_sizes, dtype, kCPU);
  if (out.numel() == 0) return out;
  switch (dtype) {
    case kFloat32:
      dnnl_conv(pass, g, memory::data_type::f32, a, b, out);
      return out;
    case kBFloat16:
    case kFloat16: {
      auto dt = dtype == kBFloat16 ? memory::data_type::bf16 : memory::data_type::f16;
      if (dnnl_conv(pass, g, dt, a, b, out)) return out;
      break;
    }
    default:
      unsupported_dtype("convolution", dtype);
  }
#else
  if (dtype == kFloat32) return conv_im2col<float>(pass, as_2d(g), a, b).view(out_sizes);
  if (dtype != kBFloat16 && dtype != kFloat16) unsupported_dtype("convolution", dtype);
#endif
  // bfloat16/float16 without an optimized oneDNN implementation: in float32, rounded once.
  return run_conv(pass, g, a.to(kFloat32), b.to(kFloat32), out_sizes).to(dtype);
}

// input: (N, C, in...), weight: (O, C / groups, k...) -> (N, O, out...). Transposed: weight
// (C, O / groups, k...) -> (N, O, out...), the backward data pass of the plain convolution from
// (N, O, out...) to (N, C, in...) (Note [CPU convolution]).
Tensor convolution_cpu(const Tensor& input, const Tensor& weight, IntArrayRef stride,
                       IntArrayRef padding, IntArrayRef dilation, bool transposed,
                       IntArrayRef output_padding, int64_t groups) {
  TensorSpec spec = meta::convolution(input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups);
  ConvGeom g{transposed ? spec.sizes : DimVector(input.sizes()),
             weight.sizes(),
             transposed ? DimVector(input.sizes()) : spec.sizes,
             stride,
             padding,
             dilation,
             groups};
  return run_conv(transposed ? Pass::kBackwardData : Pass::kForward, g, input, weight, spec.sizes);
}

// grad_output: (N, O, out...), input: (N, C, in...) -> (O, C / groups, k...) = weight_size.
Tensor convolution_backward_weight_cpu(const Tensor& grad_output, const Tensor& input,
                                       IntArrayRef weight_size, IntArrayRef stride,
                                       IntArrayRef padding, IntArrayRef dilation, int64_t groups) {
  meta::convolution_backward_weight(grad_output, input, weight_size, stride, padding, dilation,
                                    groups);
  ConvGeom g{input.sizes(), weight_size, grad_output.sizes(), stride, padding, dilation, groups};
  return run_conv(Pass::kBackwardWeights, g, input, grad_output, weight_size);
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::convolution>(convolution_cpu);
  m.impl<ops::convolution_backward_weight>(convolution_backward_weight_cpu);
}

}  // namespace
}  // namespace kiln::kernels
