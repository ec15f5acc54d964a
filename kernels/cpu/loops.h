// kernels/cpu/loops.h: iteration over strided, broadcast operands for CPU kernels.
//
//   // out and inputs already have out's dtype (cast_inputs does that); T = that C++ type.
//   auto ins = cast_inputs(out.dtype(), {self, other});
//   binary_kernel<float>(out, ins[0], ins[1], [](float a, float b) { return a + b; });
//   unary_kernel<float>(out, x, [](float a) { return a * a; });
//
// Note [CPU loops]: operands are described by byte strides over out's shape (0 where an input
// broadcasts). Dims are coalesced, then the outer index space is split across OpenMP threads
// in chunks of at least kGrainSize elements, so small ops never wake a thread. The inner loop
// has contiguous, scalar-broadcast and generic-stride variants, so the compiler vectorizes the
// first two.
#pragma once

#include <omp.h>

#include <array>
#include <cstring>
#include <vector>

#include "kiln/generated/ops.h"
#include "kiln/parallel.h"
#include "kiln/tensor.h"

namespace kiln::kernels {

constexpr int64_t kGrainSize = 32768;

// Runs f(begin, end) over [0, n), in parallel when n is large enough. Chunk boundaries depend
// only on n and grain, never on the thread count (determinism for reductions). Chunks are handed
// out dynamically: on a machine shared with other processes, a thread that the OS has not
// scheduled yet leaves its share to the running ones instead of stalling the whole op.
template <typename F>
void parallel_for(int64_t n, int64_t grain, const F& f) {
  int threads = get_num_threads();
  if (n <= grain || threads == 1 || omp_in_parallel()) {
    f(0, n);
    return;
  }
  int64_t chunks = (n + grain - 1) / grain;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) f(c * grain, std::min(n, (c + 1) * grain));
}

// The inputs of a kernel converted to one dtype: a cast copy where the dtype differs, else a
// reference to the caller's tensor (no copy, no refcount traffic: this runs on every call).
template <size_t N>
class CastInputs {
 public:
  const Tensor& operator[](size_t i) const { return *ptr_[i]; }
  template <typename... Ts>
  CastInputs(ScalarType dtype, const Ts&... ins) : ptr_{&ins...} {
    for (size_t i = 0; i < N; ++i) {
      if (ptr_[i]->dtype() == dtype) continue;
      owned_[i] = ptr_[i]->to(dtype);
      ptr_[i] = &owned_[i];
    }
  }
  CastInputs(const CastInputs&) = delete;
  CastInputs& operator=(const CastInputs&) = delete;

 private:
  std::array<const Tensor*, N> ptr_;
  std::array<Tensor, N> owned_;
};

template <typename... Ts>
CastInputs<sizeof...(Ts)> cast_inputs(ScalarType dtype, const Ts&... ins) {
  return CastInputs<sizeof...(Ts)>(dtype, ins...);
}

// Shape and byte strides of N operands (operand 0 is the output) over the output's shape.
template <int N>
struct StridedIter {
  DimVector shape;                       // coalesced, innermost last
  std::array<DimVector, N> strides;      // bytes
  std::array<char*, N> base;
  int64_t numel = 0;

  StridedIter(const std::array<const Tensor*, N>& ts) {
    const Tensor& out = *ts[0];
    int64_t nd = out.dim();
    numel = out.numel();
    shape = out.sizes();
    for (int k = 0; k < N; ++k) {
      const Tensor& t = *ts[k];
      base[k] = static_cast<char*>(t.impl()->raw_data());
      strides[k] = DimVector(nd, 0);
      int64_t off = nd - t.dim();
      for (int64_t d = 0; d < t.dim(); ++d)
        if (t.size(d) != 1) strides[k][off + d] = t.stride(d) * static_cast<int64_t>(t.element_size());
    }
    coalesce();
  }

  void coalesce() {
    // Drop size-1 dims, then merge neighbours whose strides chain for every operand.
    DimVector s;
    std::array<DimVector, N> st;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool merge = !s.empty();
      for (int k = 0; k < N && merge; ++k) merge = st[k].back() == strides[k][d] * shape[d];
      if (merge) {
        s.back() *= shape[d];
        for (int k = 0; k < N; ++k) st[k].back() = strides[k][d];
      } else {
        s.push_back(shape[d]);
        for (int k = 0; k < N; ++k) st[k].push_back(strides[k][d]);
      }
    }
    if (s.empty()) {
      s.push_back(1);
      for (int k = 0; k < N; ++k) st[k].push_back(0);
    }
    shape = s;
    strides = st;
  }

  // Calls loop(ptrs, inner_strides, n) over inner segments of elements [begin, end). The outer
  // index is found by division once, then advanced as an odometer: short inner segments (a
  // (B, H, T, D) -> (B, T, H, D) copy moves D elements at a time) pay no division each.
  template <typename Loop>
  void run_range(int64_t begin, int64_t end, const Loop& loop) const {
    if (begin >= end) return;  // nothing to do, and an empty dim may make `inner` 0
    const int64_t nd = static_cast<int64_t>(shape.size());
    const int64_t inner = shape[nd - 1];
    std::array<int64_t, N> istr;
    for (int k = 0; k < N; ++k) istr[k] = strides[k][nd - 1];
    DimVector idx(static_cast<size_t>(nd - 1), 0);
    std::array<char*, N> p = base;
    int64_t rem = begin / inner, j = begin % inner;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      for (int k = 0; k < N; ++k) p[k] += idx[d] * strides[k][d];
    }
    for (int64_t i = begin; i < end;) {
      const int64_t n = std::min(inner - j, end - i);
      std::array<char*, N> q = p;
      for (int k = 0; k < N; ++k) q[k] += j * istr[k];
      loop(q, istr, n);
      i += n;
      j = 0;
      for (int64_t d = nd - 2; d >= 0; --d) {  // the next row
        for (int k = 0; k < N; ++k) p[k] += strides[k][d];
        if (++idx[d] < shape[d]) break;
        for (int k = 0; k < N; ++k) p[k] -= strides[k][d] * shape[d];
        idx[d] = 0;
      }
    }
  }

  template <typename Loop>
  void run(const Loop& loop) const {
    parallel_for(numel, kGrainSize, [&](int64_t b, int64_t e) { run_range(b, e, loop); });
  }
};

// out[i] = f(a[i]); out and a have dtype T.
template <typename T, typename F>
void unary_kernel(const Tensor& out, const Tensor& a, const F& f) {
  if (out.numel() == 0) return;
  if (out.is_contiguous() && a.is_contiguous() && a.numel() == out.numel()) {
    T* o = static_cast<T*>(out.impl()->raw_data());
    const T* x = static_cast<const T*>(a.impl()->raw_data());
    parallel_for(out.numel(), kGrainSize, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) o[i] = f(x[i]);
    });
    return;
  }
  StridedIter<2> it({&out, &a});
  it.run([&](const std::array<char*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<T*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]));
  });
}

// o[i] = f(x[i], y[i]) for i < n, where x (y) is one value for every i when x_one (y_one): the
// vectorized inner loop of binary_kernel, for its contiguous and its strided operands alike.
template <typename T, typename O, typename F>
void binary_run(O* o, const T* x, bool x_one, const T* y, bool y_one, int64_t n, const F& f) {
  if (x_one && y_one) {
    const O v = f(*x, *y);
    for (int64_t i = 0; i < n; ++i) o[i] = v;
  } else if (y_one) {  // b constant along the run (a bias over channels, say)
    const T yv = *y;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
  } else if (x_one) {
    const T xv = *x;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
  }
}

// out[i] = f(a[i], b[i]) with broadcasting; a and b have dtype T, out has dtype O.
template <typename T, typename F, typename O = T>
void binary_kernel(const Tensor& out, const Tensor& a, const Tensor& b, const F& f) {
  int64_t n = out.numel();
  if (n == 0) return;
  O* o = static_cast<O*>(out.impl()->raw_data());
  const T* x = static_cast<const T*>(a.impl()->raw_data());
  const T* y = static_cast<const T*>(b.impl()->raw_data());
  if (out.is_contiguous() && a.is_contiguous() && b.is_contiguous() &&
      (a.numel() == n || a.numel() == 1) && (b.numel() == n || b.numel() == 1)) {
    const bool x_one = a.numel() != n, y_one = b.numel() != n;
    parallel_for(n, kGrainSize, [&](int64_t s, int64_t e) {
      binary_run(o + s, x_one ? x : x + s, x_one, y_one ? y : y + s, y_one, e - s, f);
    });
    return;
  }
  StridedIter<3> it({&out, &a, &b});
  it.run([&](const std::array<char*, 3>& p, const std::array<int64_t, 3>& s, int64_t cnt) {
    constexpr int64_t so = sizeof(O), st = sizeof(T);
    if (s[0] == so && (s[1] == st || s[1] == 0) && (s[2] == st || s[2] == 0))
      return binary_run(reinterpret_cast<O*>(p[0]), reinterpret_cast<const T*>(p[1]), s[1] == 0,
                        reinterpret_cast<const T*>(p[2]), s[2] == 0, cnt, f);
    for (int64_t i = 0; i < cnt; ++i)
      *reinterpret_cast<O*>(p[0] + i * s[0]) = f(*reinterpret_cast<const T*>(p[1] + i * s[1]),
                                                 *reinterpret_cast<const T*>(p[2] + i * s[2]));
  });
}

}  // namespace kiln::kernels
