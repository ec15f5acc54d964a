// The 2-D pools and their backward rows on the CPU (tensor/ops/pool.toml). Every kernel works on
// contiguous (P, H, W) planes (P = N * C), one plane per task, so the backward sums (windows
// overlap) are deterministic. Windows accumulate in acc_t (float32 for bfloat16/float16).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/generated/meta/pool.h"
#include "kiln/generated/ops/pool.h"
#include "kiln/meta.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// kernel_size, stride, padding, dilation as the rows take them (one value or two; an empty
// stride means the kernel size). The meta functions validated them.
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  Window(IntArrayRef k, IntArrayRef s, IntArrayRef p, IntArrayRef d)
      : kh(k[0]),
        kw(second(k)),
        sh(s.empty() ? kh : s[0]),
        sw(s.empty() ? kw : second(s)),
        ph(p[0]),
        pw(second(p)),
        dh(d[0]),
        dw(second(d)) {}
  static int64_t second(IntArrayRef v) { return v.size() == 2 ? v[1] : v[0]; }
};

// (planes, H, W, OH, OW) of an input of `in` sizes pooled to `out` sizes (both (.., H, W)).
struct Planes {
  int64_t P, H, W, OH, OW;
  Planes(IntArrayRef in, IntArrayRef out)
      : H(in[in.size() - 2]), W(in.back()), OH(out[out.size() - 2]), OW(out.back()) {
    P = 1;
    for (size_t i = 0; i + 2 < in.size(); ++i) P *= in[i];
  }
  // Runs f(plane) over all planes in parallel; `work` is the cost of one plane in elements.
  template <typename F>
  void each(int64_t work, const F& f) const {
    parallel_for(P, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(work, 1)),
                 [&](int64_t p0, int64_t p1) {
                   for (int64_t p = p0; p < p1; ++p) f(p);
                 });
  }
};

template <typename T>
T* data_of(const Tensor& t) {
  return static_cast<T*>(t.impl()->raw_data());
}

// ---- max_pool2d --------------------------------------------------------------------------------

// self: (N, C, H, W) or (C, H, W) -> values and int64 indices (flat h * W + w in the plane).
// A NaN in a window wins (the last one), as in PyTorch.
std::tuple<Tensor, Tensor> max_pool2d_with_indices_cpu(const Tensor& self, IntArrayRef kernel_size,
                                                       IntArrayRef stride, IntArrayRef padding,
                                                       IntArrayRef dilation, bool ceil_mode) {
  auto specs =
      meta::max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode);
  Tensor out = empty_on(specs[0].sizes, specs[0].dtype, kCPU);
  Tensor idx = empty_on(specs[1].sizes, kInt64, kCPU);
  if (out.numel() == 0) return {out, idx};
  const Window w(kernel_size, stride, padding, dilation);
  const Planes pl(self.sizes(), out.sizes());
  Tensor x = self.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(self.dtype(), "max_pool2d", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* xp = data_of<const T>(x);
    T* yp = data_of<T>(out);
    int64_t* ip = data_of<int64_t>(idx);
    // 2x2 windows with stride 2, all inside the plane (no padding, no ceil_mode overhang).
    const bool two_by_two = w.kh == 2 && w.kw == 2 && w.sh == 2 && w.sw == 2 && w.dh == 1 &&
                            w.dw == 1 && w.ph == 0 && w.pw == 0 && 2 * pl.OH <= pl.H &&
                            2 * pl.OW <= pl.W;
    pl.each(pl.OH * pl.OW * w.kh * w.kw, [&](int64_t p) {
      const T* plane = xp + p * pl.H * pl.W;
      if (two_by_two) {  // the CNN case: straight-line selects the compiler vectorizes
        const int64_t W = pl.W, OW = pl.OW;
        for (int64_t oh = 0; oh < pl.OH; ++oh) {
          const T* __restrict r0 = plane + 2 * oh * W;
          const T* __restrict r1 = r0 + W;
          T* __restrict yrow = yp + (p * pl.OH + oh) * OW;
          int64_t* __restrict irow = ip + (p * pl.OH + oh) * OW;
          const int64_t base = 2 * oh * W;
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t k = 2 * ow;
            const A b = static_cast<A>(r0[k + 1]), c = static_cast<A>(r1[k]),
                    d = static_cast<A>(r1[k + 1]);
            A best = static_cast<A>(r0[k]);
            int64_t off = 0;
            bool t = b > best || std::isnan(b);
            best = t ? b : best, off = t ? 1 : off;
            t = c > best || std::isnan(c);
            best = t ? c : best, off = t ? W : off;
            t = d > best || std::isnan(d);
            best = t ? d : best, off = t ? W + 1 : off;
            yrow[ow] = static_cast<T>(best);
            irow[ow] = base + k + off;
          }
        }
        return;
      }
      // Each window clipped to the plane (padding never wins): rows i in [i0, i1), columns
      // j in [j0, j1). It starts at its first element, so a NaN there stays.
      for (int64_t oh = 0; oh < pl.OH; ++oh) {
        const int64_t h0 = oh * w.sh - w.ph;
        const int64_t i0 = h0 >= 0 ? 0 : (w.dh - 1 - h0) / w.dh;
        const int64_t i1 = std::min(w.kh, (pl.H - h0 + w.dh - 1) / w.dh);
        T* yrow = yp + (p * pl.OH + oh) * pl.OW;
        int64_t* irow = ip + (p * pl.OH + oh) * pl.OW;
        for (int64_t ow = 0; ow < pl.OW; ++ow) {
          const int64_t w0 = ow * w.sw - w.pw;
          const int64_t j0 = w0 >= 0 ? 0 : (w.dw - 1 - w0) / w.dw;
          const int64_t j1 = std::min(w.kw, (pl.W - w0 + w.dw - 1) / w.dw);
          const int64_t first = (h0 + i0 * w.dh) * pl.W + w0 + j0 * w.dw;
          A best = static_cast<A>(plane[first]);
          int64_t at = first;
          for (int64_t i = i0; i < i1; ++i)
            for (int64_t j = j0; j < j1; ++j) {
              const int64_t k = (h0 + i * w.dh) * pl.W + w0 + j * w.dw;
              const A v = static_cast<A>(plane[k]);
              const bool take = v > best || (std::isnan(v) && k != first);  // selects, no branch
              best = take ? v : best;
              at = take ? k : at;
            }
          yrow[ow] = static_cast<T>(best);
          irow[ow] = at;
        }
      }
    });
  });
  return {out, idx};
}

// grad_output, indices: (.., OH, OW) -> (.., H, W) = self_size: each gradient added at its index.
Tensor max_pool2d_backward_cpu(const Tensor& grad_output, const Tensor& indices,
                               IntArrayRef self_size) {
  TensorSpec spec = meta::max_pool2d_backward(grad_output, indices, self_size);
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  if (grad_output.numel() == 0) return out.zero_();
  const Planes pl(self_size, grad_output.sizes());
  Tensor g = grad_output.contiguous(), ind = indices.contiguous();
  const int64_t HW = pl.H * pl.W, L = pl.OH * pl.OW;
  const int64_t* ip = data_of<const int64_t>(ind);
  std::atomic<bool> in_range{true};  // a bad index is skipped (never written out of bounds)
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, "max_pool2d_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* gp = data_of<const T>(g);
    T* op = data_of<T>(out);
    pl.each(L, [&](int64_t p) {
      // float32/float64 accumulate in the output plane itself, bfloat16/float16 in float32.
      std::vector<A> buf(std::is_same_v<T, A> ? 0 : HW, A(0));
      A* acc = std::is_same_v<T, A> ? reinterpret_cast<A*>(op + p * HW) : buf.data();
      if constexpr (std::is_same_v<T, A>) std::fill(acc, acc + HW, A(0));
      for (int64_t l = 0; l < L; ++l) {
        const int64_t at = ip[p * L + l];
        if (at < 0 || at >= HW) {
          in_range = false;
          continue;
        }
        acc[at] += static_cast<A>(gp[p * L + l]);
      }
      if constexpr (!std::is_same_v<T, A>)
        for (int64_t i = 0; i < HW; ++i) op[p * HW + i] = static_cast<T>(acc[i]);
    });
  });
  KILN_CHECK(in_range, Index, "max_pool2d_backward: an index is out of range for planes of ", pl.H,
             "x", pl.W, " elements");
  return out;
}

// ---- avg_pool2d --------------------------------------------------------------------------------

// PyTorch's windows: the sum over the window's part inside the input, divided by
// divisor_override, else by the window's size clipped to the padded input (count_include_pad)
// or to the input. f(oh, ow, h0, h1, w0, w1, scale) per output; an empty window gets scale 0.
template <typename F>
void avg_windows(const Planes& pl, const Window& w, bool count_include_pad,
                 std::optional<int64_t> divisor_override, const F& f) {
  for (int64_t oh = 0; oh < pl.OH; ++oh)
    for (int64_t ow = 0; ow < pl.OW; ++ow) {
      int64_t h0 = oh * w.sh - w.ph, w0 = ow * w.sw - w.pw;
      int64_t h1 = std::min(h0 + w.kh, pl.H + w.ph), w1 = std::min(w0 + w.kw, pl.W + w.pw);
      const int64_t padded = (h1 - h0) * (w1 - w0);
      h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
      h1 = std::min(h1, pl.H), w1 = std::min(w1, pl.W);
      const int64_t inside = (h1 - h0) * (w1 - w0);
      const int64_t div =
          divisor_override ? *divisor_override : (count_include_pad ? padded : inside);
      f(oh, ow, h0, h1, w0, w1, h0 < h1 && w0 < w1 ? 1.0 / static_cast<double>(div) : 0.0);
    }
}

// Mean pooling over the windows that `windows(f)` enumerates, calling f(oh, ow, h0, h1, w0, w1,
// scale) per output (avg_windows, adaptive_windows): the forward sums each window into its
// output; the backward spreads each output's gradient over its window, one plane per task.
template <typename Windows>
void window_mean_forward(const char* name, const Tensor& self, const Tensor& out,
                         const Planes& pl, int64_t cost, const Windows& windows) {
  Tensor x = self.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), name, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* xp = data_of<const T>(x);
    T* yp = data_of<T>(out);
    pl.each(cost, [&](int64_t p) {
      const T* plane = xp + p * pl.H * pl.W;
      T* o = yp + p * pl.OH * pl.OW;
      windows([&](int64_t oh, int64_t ow, int64_t h0, int64_t h1, int64_t w0, int64_t w1,
                  double scale) {
        A s = 0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t c = w0; c < w1; ++c) s += static_cast<A>(plane[h * pl.W + c]);
        o[oh * pl.OW + ow] = static_cast<T>(s * static_cast<A>(scale));
      });
    });
  });
}

template <typename Windows>
void window_mean_backward(const char* name, const Tensor& grad_output, const Tensor& out,
                          const Planes& pl, int64_t cost, const Windows& windows) {
  Tensor g = grad_output.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), name, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* gp = data_of<const T>(g);
    T* op = data_of<T>(out);
    pl.each(cost, [&](int64_t p) {
      std::vector<A> acc(pl.H * pl.W, A(0));
      const T* gplane = gp + p * pl.OH * pl.OW;
      windows([&](int64_t oh, int64_t ow, int64_t h0, int64_t h1, int64_t w0, int64_t w1,
                  double scale) {
        const A v = static_cast<A>(gplane[oh * pl.OW + ow]) * static_cast<A>(scale);
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t c = w0; c < w1; ++c) acc[h * pl.W + c] += v;
      });
      T* plane = op + p * pl.H * pl.W;
      for (int64_t i = 0; i < pl.H * pl.W; ++i) plane[i] = static_cast<T>(acc[i]);
    });
  });
}

Tensor avg_pool2d_cpu(const Tensor& self, IntArrayRef kernel_size, IntArrayRef stride,
                      IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override) {
  TensorSpec spec = meta::avg_pool2d(self, kernel_size, stride, padding, ceil_mode,
                                     count_include_pad, divisor_override);
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  const Window w(kernel_size, stride, padding, {1});
  const Planes pl(self.sizes(), out.sizes());
  window_mean_forward("avg_pool2d", self, out, pl, pl.OH * pl.OW * w.kh * w.kw, [&](auto&& f) {
    avg_windows(pl, w, count_include_pad, divisor_override, f);
  });
  return out;
}

Tensor avg_pool2d_backward_cpu(const Tensor& grad_output, IntArrayRef self_size,
                               IntArrayRef kernel_size, IntArrayRef stride, IntArrayRef padding,
                               bool ceil_mode, bool count_include_pad,
                               std::optional<int64_t> divisor_override) {
  TensorSpec spec = meta::avg_pool2d_backward(grad_output, self_size, kernel_size, stride, padding,
                                              ceil_mode, count_include_pad, divisor_override);
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  const Window w(kernel_size, stride, padding, {1});
  const Planes pl(self_size, grad_output.sizes());
  window_mean_backward("avg_pool2d_backward", grad_output, out, pl, pl.OH * pl.OW * w.kh * w.kw,
                       [&](auto&& f) { avg_windows(pl, w, count_include_pad, divisor_override, f); });
  return out;
}

// ---- adaptive_avg_pool2d -----------------------------------------------------------------------

// Output o of `out` along an input dim of `in`: [floor(o * in / out), ceil((o + 1) * in / out)).
int64_t adaptive_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t adaptive_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

template <typename F>
void adaptive_windows(const Planes& pl, const F& f) {
  for (int64_t oh = 0; oh < pl.OH; ++oh) {
    const int64_t h0 = adaptive_start(oh, pl.H, pl.OH), h1 = adaptive_end(oh, pl.H, pl.OH);
    for (int64_t ow = 0; ow < pl.OW; ++ow) {
      const int64_t w0 = adaptive_start(ow, pl.W, pl.OW), w1 = adaptive_end(ow, pl.W, pl.OW);
      f(oh, ow, h0, h1, w0, w1, 1.0 / static_cast<double>((h1 - h0) * (w1 - w0)));
    }
  }
}

Tensor adaptive_avg_pool2d_cpu(const Tensor& self, IntArrayRef output_size) {
  TensorSpec spec = meta::adaptive_avg_pool2d(self, output_size);
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  const Planes pl(self.sizes(), out.sizes());
  window_mean_forward("adaptive_avg_pool2d", self, out, pl, std::max(pl.H * pl.W, pl.OH * pl.OW),
                      [&](auto&& f) { adaptive_windows(pl, f); });
  return out;
}

Tensor adaptive_avg_pool2d_backward_cpu(const Tensor& grad_output, IntArrayRef self_size) {
  TensorSpec spec = meta::adaptive_avg_pool2d_backward(grad_output, self_size);
  Tensor out = empty_on(spec.sizes, spec.dtype, kCPU);
  if (out.numel() == 0) return out;
  const Planes pl(self_size, grad_output.sizes());
  if (pl.OH * pl.OW == 0) return out.zero_();
  window_mean_backward("adaptive_avg_pool2d_backward", grad_output, out, pl,
                       std::max(pl.H * pl.W, pl.OH * pl.OW),
                       [&](auto&& f) { adaptive_windows(pl, f); });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::max_pool2d_with_indices>(max_pool2d_with_indices_cpu);
  m.impl<ops::max_pool2d_backward>(max_pool2d_backward_cpu);
  m.impl<ops::avg_pool2d>(avg_pool2d_cpu);
  m.impl<ops::avg_pool2d_backward>(avg_pool2d_backward_cpu);
  m.impl<ops::adaptive_avg_pool2d>(adaptive_avg_pool2d_cpu);
  m.impl<ops::adaptive_avg_pool2d_backward>(adaptive_avg_pool2d_backward_cpu);
}

}  // namespace
}  // namespace kiln::kernels
