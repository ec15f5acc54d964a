// Nearest and bilinear upsampling and their backward ops on the CPU (tensor/ops/interpolate.toml).
// Inputs are made contiguous and viewed as planes (N * C, *spatial); the backward ops accumulate
// one plane per task, in a fixed order, so they are deterministic.
//
// Note [Interpolation coordinates] (PyTorch's): with r = 1 / scale when a scale is given, else
// in / out, output index o reads
// - nearest: min(floor(o * r), in - 1) (exactly o when out == in, o / 2 when out == 2 in);
// - bilinear: src = o * (in - 1) / (out - 1) with align_corners (0 when out == 1), else
//   max((o + 0.5) * r - 0.5, 0); the taps are i0 = floor(src) and min(i0 + 1, in - 1), weighted
//   1 - (src - i0) and src - i0.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kiln/generated/ops/interpolate.h"
#include "kiln/meta.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

float nearest_ratio(int64_t in, int64_t out, std::optional<double> scale) {
  return scale && *scale > 0 ? static_cast<float>(1.0 / *scale)
                             : static_cast<float>(in) / static_cast<float>(out);
}

// Source index of every output index along one dim (nearest).
std::vector<int64_t> nearest_table(int64_t in, int64_t out, std::optional<double> scale) {
  std::vector<int64_t> t(out);
  const float r = nearest_ratio(in, out, scale);
  for (int64_t o = 0; o < out; ++o) {
    if (out == in)
      t[o] = o;
    else if (out == 2 * in)
      t[o] = o >> 1;
    else
      t[o] = std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * r)), in - 1);
  }
  return t;
}

// Taps and weights of every output index along one dim (bilinear), computed in W (the
// accumulation type: double for float64 inputs, float otherwise).
template <typename W>
struct Taps {
  std::vector<int64_t> i0, i1;
  std::vector<W> w0, w1;
};

template <typename W>
Taps<W> linear_taps(int64_t in, int64_t out, bool align_corners, std::optional<double> scale) {
  Taps<W> t;
  const W r = align_corners ? (out > 1 ? static_cast<W>(in - 1) / static_cast<W>(out - 1) : W(0))
              : scale && *scale > 0 ? static_cast<W>(1.0 / *scale)
                                    : static_cast<W>(in) / static_cast<W>(out);
  for (int64_t o = 0; o < out; ++o) {
    const W src = align_corners ? r * static_cast<W>(o)
                                : std::max(r * (static_cast<W>(o) + W(0.5)) - W(0.5), W(0));
    const int64_t i0 = std::min(static_cast<int64_t>(src), in - 1);
    const W l1 = src - static_cast<W>(i0);
    t.i0.push_back(i0);
    t.i1.push_back(i0 + (i0 < in - 1 ? 1 : 0));
    t.w0.push_back(W(1) - l1);
    t.w1.push_back(l1);
  }
  return t;
}

// (N, C, *spatial) padded to 3 spatial dims with leading 1s: {planes, d, h, w}
std::array<int64_t, 4> geometry(IntArrayRef sizes) {
  std::array<int64_t, 4> g{sizes[0] * sizes[1], 1, 1, 1};
  const size_t spatial = sizes.size() - 2;
  for (size_t k = 0; k < spatial; ++k) g[4 - spatial + k] = sizes[2 + k];
  return g;
}

// The nearest tables of the three (padded) spatial dims.
std::array<std::vector<int64_t>, 3> nearest_tables(IntArrayRef in, IntArrayRef out,
                                                   std::optional<double> scale) {
  auto gi = geometry(in), go = geometry(out);
  return {nearest_table(gi[1], go[1], scale), nearest_table(gi[2], go[2], scale),
          nearest_table(gi[3], go[3], scale)};
}

// self: (N, C, *in) -> out: (N, C, *output_size), out[o] = self[nearest source of o]
void upsample_nearest_cpu(const Tensor& out, const Tensor& self, IntArrayRef,
                          std::optional<double> scale) {
  if (out.numel() == 0) return;
  Tensor x = self.contiguous();
  auto gi = geometry(self.sizes()), go = geometry(out.sizes());
  auto t = nearest_tables(self.sizes(), out.sizes(), scale);
  const int64_t rows = go[0] * go[1] * go[2];
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "upsample_nearest", [&] {
    using T = scalar_t;
    const T* xp = static_cast<const T*>(x.impl()->raw_data());
    T* op_ = static_cast<T*>(out.impl()->raw_data());
    parallel_for(rows, std::max<int64_t>(1, kGrainSize / go[3]), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t h = r % go[2], dd = (r / go[2]) % go[1], p = r / (go[2] * go[1]);
        const T* src = xp + ((p * gi[1] + t[0][dd]) * gi[2] + t[1][h]) * gi[3];
        T* dst = op_ + r * go[3];
        for (int64_t w = 0; w < go[3]; ++w) dst[w] = src[t[2][w]];
      }
    });
  });
}

// grad_output: (N, C, *output_size) -> out: input_size, each output's gradient added to its source
void upsample_nearest_backward_cpu(const Tensor& out, const Tensor& grad_output, IntArrayRef,
                                   IntArrayRef input_size, std::optional<double> scale) {
  if (out.numel() == 0) return;
  Tensor g = grad_output.contiguous();
  auto gi = geometry(input_size), go = geometry(grad_output.sizes());
  auto t = nearest_tables(input_size, grad_output.sizes(), scale);
  const int64_t in_plane = gi[1] * gi[2] * gi[3], out_plane = go[1] * go[2] * go[3];
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "upsample_nearest_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* gp = static_cast<const T*>(g.impl()->raw_data());
    T* op_ = static_cast<T*>(out.impl()->raw_data());
    parallel_for(go[0], std::max<int64_t>(1, kGrainSize / std::max<int64_t>(out_plane, 1)),
                 [&](int64_t p0, int64_t p1) {
                   std::vector<A> acc(in_plane);
                   for (int64_t p = p0; p < p1; ++p) {
                     std::fill(acc.begin(), acc.end(), A(0));
                     const T* src = gp + p * out_plane;
                     for (int64_t dd = 0; dd < go[1]; ++dd)
                       for (int64_t h = 0; h < go[2]; ++h) {
                         A* row = acc.data() + (t[0][dd] * gi[2] + t[1][h]) * gi[3];
                         const T* s = src + (dd * go[2] + h) * go[3];
                         for (int64_t w = 0; w < go[3]; ++w) row[t[2][w]] += static_cast<A>(s[w]);
                       }
                     T* dst = op_ + p * in_plane;
                     for (int64_t i = 0; i < in_plane; ++i) dst[i] = static_cast<T>(acc[i]);
                   }
                 });
  });
}

// self: (N, C, H, W) -> out: (N, C, OH, OW), each output the weighted sum of its four taps
void upsample_bilinear_cpu(const Tensor& out, const Tensor& self, IntArrayRef, bool align_corners,
                           std::optional<double> scale) {
  if (out.numel() == 0) return;
  Tensor x = self.contiguous();
  const int64_t P = self.size(0) * self.size(1), H = self.size(2), W = self.size(3);
  const int64_t OH = out.size(2), OW = out.size(3);
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "upsample_bilinear", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    Taps<A> th = linear_taps<A>(H, OH, align_corners, scale);
    Taps<A> tw = linear_taps<A>(W, OW, align_corners, scale);
    const T* xp = static_cast<const T*>(x.impl()->raw_data());
    T* op_ = static_cast<T*>(out.impl()->raw_data());
    parallel_for(P * OH, std::max<int64_t>(1, kGrainSize / OW), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t p = r / OH, oh = r % OH;
        const T* a = xp + (p * H + th.i0[oh]) * W;
        const T* b = xp + (p * H + th.i1[oh]) * W;
        const A wa = th.w0[oh], wb = th.w1[oh];
        T* dst = op_ + r * OW;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t j0 = tw.i0[ow], j1 = tw.i1[ow];
          const A v0 = tw.w0[ow], v1 = tw.w1[ow];
          dst[ow] = static_cast<T>(wa * (v0 * static_cast<A>(a[j0]) + v1 * static_cast<A>(a[j1])) +
                                   wb * (v0 * static_cast<A>(b[j0]) + v1 * static_cast<A>(b[j1])));
        }
      }
    });
  });
}

// grad_output: (N, C, OH, OW) -> out: input_size, each output's gradient spread over its taps
void upsample_bilinear_backward_cpu(const Tensor& out, const Tensor& grad_output, IntArrayRef,
                                    IntArrayRef input_size, bool align_corners,
                                    std::optional<double> scale) {
  if (out.numel() == 0) return;
  Tensor g = grad_output.contiguous();
  const int64_t P = input_size[0] * input_size[1], H = input_size[2], W = input_size[3];
  const int64_t OH = g.size(2), OW = g.size(3);
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "upsample_bilinear_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    Taps<A> th = linear_taps<A>(H, OH, align_corners, scale);
    Taps<A> tw = linear_taps<A>(W, OW, align_corners, scale);
    const T* gp = static_cast<const T*>(g.impl()->raw_data());
    T* op_ = static_cast<T*>(out.impl()->raw_data());
    parallel_for(P, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(OH * OW, 1)),
                 [&](int64_t p0, int64_t p1) {
                   std::vector<A> acc(H * W);
                   for (int64_t p = p0; p < p1; ++p) {
                     std::fill(acc.begin(), acc.end(), A(0));
                     for (int64_t oh = 0; oh < OH; ++oh) {
                       A* a = acc.data() + th.i0[oh] * W;
                       A* b = acc.data() + th.i1[oh] * W;
                       const A wa = th.w0[oh], wb = th.w1[oh];
                       const T* s = gp + (p * OH + oh) * OW;
                       for (int64_t ow = 0; ow < OW; ++ow) {
                         const A v = static_cast<A>(s[ow]);
                         const int64_t j0 = tw.i0[ow], j1 = tw.i1[ow];
                         const A v0 = tw.w0[ow], v1 = tw.w1[ow];
                         a[j0] += wa * v0 * v;
                         a[j1] += wa * v1 * v;
                         b[j0] += wb * v0 * v;
                         b[j1] += wb * v1 * v;
                       }
                     }
                     T* dst = op_ + p * H * W;
                     for (int64_t i = 0; i < H * W; ++i) dst[i] = static_cast<T>(acc[i]);
                   }
                 });
  });
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::upsample_nearest>(upsample_nearest_cpu);
  m.structured<ops::upsample_nearest_backward>(upsample_nearest_backward_cpu);
  m.structured<ops::upsample_bilinear>(upsample_bilinear_cpu);
  m.structured<ops::upsample_bilinear_backward>(upsample_bilinear_backward_cpu);
}

}  // namespace
}  // namespace kiln::kernels
