// kernels/cpu/reduce.h: the deterministic reduction engine behind sum/mean/prod/var/std/norm/
// logsumexp/max/min/argmax/argmin/any/all (reduce.cpp) and the row sums of softmax.cpp.
//
//   std::vector<bool> mask = meta::dim_mask("sum", dim, x.dim());
//   ReducePlan plan = make_plan(x, mask, /*logical_order=*/false);
//   std::vector<float> acc(plan.num_out);
//   reduce(plan, x_data, SumReducer<float, float, CastMap<float>>{}, acc.data());
//   // acc[o] is the sum for output element o (row-major over the kept dims)
//
// Note [Deterministic reductions]: a result must not depend on the thread count (DESIGN.md,
// "Determinism"), so everything that fixes the order of floating-point operations depends only
// on the shape and strides of the input:
//  - the reduced index space of one output is cut into chunks of kReduceChunk elements; each
//    chunk gives one partial, and partials are combined by a pairwise cascade in chunk order;
//  - inside a chunk, blocks of kReduceBlock elements are reduced into R::kLanes independent
//    accumulators (lane = position in the block mod kLanes, so the compiler vectorizes the
//    contiguous case and the adds do not form one long dependency chain); the lanes are folded
//    pairwise and the block results enter the same binary-counter cascade;
//  - threads only decide which (output, chunk) tasks they run, never how a task is computed.
// The cascade makes the error grow with log(n) rather than n: summing 2^24 float32 values gives
// about float epsilon relative error, where a sequential float sum drifts by several percent.
//
// Note [Reduction layouts]: make_plan splits the input into kept dims (the output's index space)
// and reduced dims, drops size-1 dims and merges neighbours whose strides chain. Two paths:
//  - row path: each output reduces its own index space (contiguous inner runs are vectorized);
//  - column path, when the innermost kept dim has stride 1 but the innermost reduced one does
//    not (sum over dim 0 of a row-major matrix, or over non-adjacent dims): a task walks the
//    reduced rows once and updates kColBlock neighbouring outputs per row, vectorized across
//    outputs, instead of every output striding through memory on its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "kiln/scalar_math.h"
#include "loops.h"

namespace kiln::kernels {

constexpr int64_t kReduceChunk = 32768;  // reduced elements per partial result
constexpr int64_t kReduceBlock = 4096;   // elements per block before it enters the cascade
constexpr int64_t kColBlock = 4096;      // outputs per task on the column path
constexpr int64_t kColRows = 16;         // minimum reduced rows per block on the column path
constexpr int64_t kSmallRange = 32;      // runs this short use one sequential accumulator
constexpr int64_t kColChunk = 1 << 18;   // elements per partial on the column path

struct ReducePlan {
  DimVector out_sizes, out_strides;  // kept dims, row-major order of the output (input strides)
  DimVector red_sizes, red_strides;  // reduced dims, innermost last (never empty)
  int64_t num_out = 1, red_numel = 1;
};

// With logical_order the reduced dims keep their row-major order (argmax needs flat indices in
// that order); otherwise they are sorted by decreasing stride so the inner loop is the densest.
inline ReducePlan make_plan(const Tensor& x, const std::vector<bool>& mask, bool logical_order) {
  ReducePlan p;
  std::vector<std::pair<int64_t, int64_t>> kept, red;  // (size, stride)
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (mask[d]) p.red_numel *= x.size(d);
    else p.num_out *= x.size(d);
    if (x.size(d) == 1) continue;
    (mask[d] ? red : kept).emplace_back(x.size(d), x.stride(d));
  }
  if (!logical_order)
    std::stable_sort(red.begin(), red.end(), [](auto& a, auto& b) { return a.second > b.second; });
  auto coalesce = [](const std::vector<std::pair<int64_t, int64_t>>& dims, DimVector& sizes,
                     DimVector& strides) {
    for (auto [size, stride] : dims) {
      if (!sizes.empty() && strides.back() == stride * size) {
        sizes.back() *= size;
        strides.back() = stride;
        continue;
      }
      sizes.push_back(size);
      strides.push_back(stride);
    }
  };
  coalesce(kept, p.out_sizes, p.out_strides);
  coalesce(red, p.red_sizes, p.red_strides);
  if (p.red_sizes.empty()) {
    p.red_sizes.push_back(1);
    p.red_strides.push_back(0);
  }
  return p;
}

inline int64_t last(const DimVector& v) { return v[v.size() - 1]; }

// Input element offset of output element o.
inline int64_t out_offset(const ReducePlan& p, int64_t o) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(p.out_sizes.size()) - 1; d >= 0; --d) {
    off += (o % p.out_sizes[d]) * p.out_strides[d];
    o /= p.out_sizes[d];
  }
  return off;
}

// Pairwise combination of a stream of partial results (a binary counter: level k holds the
// combination of 2^k consecutive items). Deterministic for a given stream.
// The multi-index (over red_sizes) of flat reduced position `pos`, and its element offset.
inline int64_t reduced_position(const ReducePlan& p, int64_t pos, DimVector& idx) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(p.red_sizes.size()) - 1; d >= 0; --d) {
    idx[d] = pos % p.red_sizes[d];
    pos /= p.red_sizes[d];
    off += idx[d] * p.red_strides[d];
  }
  return off;
}

template <typename R>
struct Cascade {
  using Acc = typename R::Acc;
  Acc lv[64];
  uint64_t n = 0;
  void push(const R& r, Acc v) {
    int k = 0;
    for (uint64_t c = n; c & 1; c >>= 1, ++k) {
      Acc a = lv[k];
      r.combine(a, v);  // older first
      v = a;
    }
    lv[k] = v;
    ++n;
  }
  Acc result(const R& r) const {
    Acc out = r.identity();
    bool first = true;
    for (int k = 63; k >= 0; --k) {
      if (!((n >> k) & 1)) continue;
      if (first) out = lv[k];
      else r.combine(out, lv[k]);
      first = false;
    }
    return out;
  }
};

// Lane accumulators of one block (Note [Deterministic reductions]).
template <typename T, typename R>
struct BlockLanes {
  using Acc = typename R::Acc;
  static constexpr int L = R::kLanes;
  Acc lanes[L];
  int64_t filled = 0;  // elements fed since the block started

  void reset(const R& r) {
    for (int j = 0; j < L; ++j) lanes[j] = r.identity();
    filled = 0;
  }
  // Feeds n elements q[k * s] (flat reduced indices idx + k); must not overflow the block.
  void feed(const R& r, const T* q, int64_t s, int64_t n, int64_t o, int64_t idx) {
    int64_t k = 0;
    for (; k < n && filled % L != 0; ++k, ++filled) r.step(lanes[filled % L], q[k * s], o, idx + k);
    if (k + L <= n) {
      Acc acc[L];  // a local copy, so the compiler keeps the lanes in registers
      for (int j = 0; j < L; ++j) acc[j] = lanes[j];
      if (s == 1) {
        for (; k + L <= n; k += L, filled += L)
#pragma omp simd
          for (int j = 0; j < L; ++j) r.step(acc[j], q[k + j], o, idx + k + j);
      } else {
        for (; k + L <= n; k += L, filled += L)
#pragma omp simd
          for (int j = 0; j < L; ++j) r.step(acc[j], q[(k + j) * s], o, idx + k + j);
      }
      for (int j = 0; j < L; ++j) lanes[j] = acc[j];
    }
    for (; k < n; ++k, ++filled) r.step(lanes[filled % L], q[k * s], o, idx + k);
  }
  Acc fold(const R& r) {
    for (int w = L / 2; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) r.combine(lanes[j], lanes[j + w]);
    return lanes[0];
  }
};

// Reduces flat reduced indices [rb, re) of the output whose data starts at `base`.
template <typename T, typename R>
typename R::Acc reduce_range(const ReducePlan& p, const T* base, const R& r, int64_t o, int64_t rb,
                             int64_t re) {
  const int64_t nd = static_cast<int64_t>(p.red_sizes.size());
  const int64_t inner = p.red_sizes[nd - 1], istr = p.red_strides[nd - 1];
  if (nd == 1 && re - rb <= kSmallRange) {  // short rows: lanes and cascade would cost more
    typename R::Acc a = r.identity();
    for (int64_t i = rb; i < re; ++i) r.step(a, base[i * istr], o, i);
    return a;
  }
  Cascade<R> cas;
  BlockLanes<T, R> blk;
  blk.reset(r);
  DimVector idx(nd);
  int64_t off = reduced_position(p, rb, idx);
  int64_t i = rb;
  while (i < re) {
    int64_t n = std::min(inner - idx[nd - 1], re - i);
    int64_t done = 0;
    while (done < n) {
      int64_t m = std::min(n - done, kReduceBlock - blk.filled);
      blk.feed(r, base + off + done * istr, istr, m, o, i + done);
      done += m;
      if (blk.filled == kReduceBlock) {
        cas.push(r, blk.fold(r));
        blk.reset(r);
      }
    }
    i += n;
    off += n * istr;
    idx[nd - 1] += n;
    if (idx[nd - 1] < inner || i >= re) continue;
    off -= inner * istr;
    idx[nd - 1] = 0;
    for (int64_t d = nd - 2; d >= 0; --d) {
      off += p.red_strides[d];
      if (++idx[d] < p.red_sizes[d]) break;
      off -= p.red_sizes[d] * p.red_strides[d];
      idx[d] = 0;
    }
  }
  if (blk.filled > 0) cas.push(r, blk.fold(r));
  return cas.result(r);
}

// A contiguous run of n elements as one output (softmax rows), chunked like reduce().
template <typename T, typename R>
typename R::Acc reduce_contiguous(const T* q, int64_t n, const R& r, int64_t o) {
  if (n <= kSmallRange) {  // the same order reduce_range uses for a short run
    typename R::Acc a = r.identity();
    for (int64_t i = 0; i < n; ++i) r.step(a, q[i], o, i);
    return a;
  }
  ReducePlan p;
  p.red_sizes.push_back(n);
  p.red_strides.push_back(1);
  p.red_numel = n;
  Cascade<R> chunks;
  for (int64_t c = 0; c < n; c += kReduceChunk)
    chunks.push(r, reduce_range(p, q, r, o, c, std::min(n, c + kReduceChunk)));
  return chunks.result(r);
}

// Column path: outputs [o0, o0 + cb) are neighbours at stride 1 in the input (whose data for o0
// starts at `base`); reduces flat reduced indices [rb, re) into acc[0..cb).
template <typename T, typename R>
void reduce_columns(const ReducePlan& p, const T* base, const R& r, int64_t o0, int64_t cb,
                    int64_t rb, int64_t re, typename R::Acc* acc) {
  using Acc = typename R::Acc;
  const int64_t nd = static_cast<int64_t>(p.red_sizes.size());
  // Rows per block: a function of the block width only, so narrow blocks push less often.
  const int64_t block_rows = std::clamp<int64_t>(kColBlock / 4 / cb, kColRows, 256);
  int levels = 1;
  while ((int64_t{1} << (levels - 1)) * block_rows < re - rb) ++levels;
  std::vector<Acc> cur(cb, r.identity()), lv(levels * cb);  // lv: cascade levels over blocks
  uint64_t pushed = 0;
  auto push = [&]() {
    int k = 0;
    for (uint64_t c = pushed; c & 1; c >>= 1, ++k) {
      const Acc* older = lv.data() + k * cb;
      for (int64_t j = 0; j < cb; ++j) {
        Acc a = older[j];
        r.combine(a, cur[j]);
        cur[j] = a;
      }
    }
    std::copy(cur.begin(), cur.end(), lv.begin() + k * cb);
    std::fill(cur.begin(), cur.end(), r.identity());
    ++pushed;
  };
  DimVector idx(nd);
  int64_t off = reduced_position(p, rb, idx);
  int64_t rows = 0;
  for (int64_t i = rb; i < re; ++i) {
    const T* q = base + off;
    Acc* a = cur.data();
#pragma omp simd
    for (int64_t j = 0; j < cb; ++j) r.step(a[j], q[j], o0 + j, i);
    if (++rows == block_rows) {
      push();
      rows = 0;
    }
    for (int64_t d = nd - 1; d >= 0; --d) {
      off += p.red_strides[d];
      if (++idx[d] < p.red_sizes[d]) break;
      off -= p.red_sizes[d] * p.red_strides[d];
      idx[d] = 0;
    }
  }
  if (rows > 0) push();
  // Combine the levels oldest (highest) first.
  bool first = true;
  for (int k = levels - 1; k >= 0; --k) {
    if (!((pushed >> k) & 1)) continue;
    const Acc* lk = lv.data() + k * cb;
    for (int64_t j = 0; j < cb; ++j) {
      if (first) acc[j] = lk[j];
      else r.combine(acc[j], lk[j]);
    }
    first = false;
  }
  if (first) std::fill(acc, acc + cb, r.identity());
}

// out[o] = the reduction of output o, for every o in [0, p.num_out).
template <typename T, typename R>
void reduce(const ReducePlan& p, const T* data, const R& r, typename R::Acc* out) {
  using Acc = typename R::Acc;
  const int64_t O = p.num_out, N = p.red_numel;
  if (O == 0) return;
  if (N == 0) {
    std::fill(out, out + O, r.identity());
    return;
  }
  const bool columns = O > 1 && last(p.out_strides) == 1 && last(p.red_strides) != 1;
  if (!columns) {
    const int64_t nch = (N + kReduceChunk - 1) / kReduceChunk;
    if (nch == 1) {
      parallel_for(O, std::max<int64_t>(1, kGrainSize / N), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) out[o] = reduce_range(p, data + out_offset(p, o), r, o, 0, N);
      });
      return;
    }
    std::vector<Acc> part(O * nch);
    parallel_for(O * nch, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / nch, c = t % nch;
        part[t] = reduce_range(p, data + out_offset(p, o), r, o, c * kReduceChunk,
                               std::min(N, (c + 1) * kReduceChunk));
      }
    });
    for (int64_t o = 0; o < O; ++o) {
      Cascade<R> cas;
      for (int64_t c = 0; c < nch; ++c) cas.push(r, part[o * nch + c]);
      out[o] = cas.result(r);
    }
    return;
  }
  // Column path (Note [Reduction layouts]).
  const int64_t Ki = last(p.out_sizes), Ko = O / Ki;
  const int64_t cbw = std::min(Ki, kColBlock), ncb = (Ki + cbw - 1) / cbw;
  // Rows per partial: fixed by the shape; large enough that partials stay under 2^22 values.
  const int64_t rch = std::max({int64_t{1}, kColChunk / cbw, (N * O + (1 << 22) - 1) >> 22});
  const int64_t nrc = (N + rch - 1) / rch;
  const int64_t tasks = Ko * ncb * nrc;
  std::vector<Acc> part(nrc > 1 ? O * nrc : 0);
  const int64_t grain = nrc > 1 ? 1 : std::max<int64_t>(1, kGrainSize / (cbw * N));
  parallel_for(tasks, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t rc = t % nrc, cbi = (t / nrc) % ncb, ko = t / (nrc * ncb);
      int64_t o0 = ko * Ki + cbi * cbw, cb = std::min(cbw, Ki - cbi * cbw);
      Acc* dst = nrc > 1 ? part.data() + rc * O + o0 : out + o0;
      reduce_columns(p, data + out_offset(p, o0), r, o0, cb, rc * rch, std::min(N, (rc + 1) * rch), dst);
    }
  });
  if (nrc == 1) return;
  for (int64_t o = 0; o < O; ++o) {
    Cascade<R> cas;
    for (int64_t c = 0; c < nrc; ++c) cas.push(r, part[c * O + o]);
    out[o] = cas.result(r);
  }
}

// ---- Reducers: Acc, kLanes, identity(), step(acc, x, output, flat index), combine(a, later b).

template <typename T>
constexpr bool kReducedFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
// The type values are compared in (float for float16/bfloat16, uint8 for bool, T otherwise).
template <typename T>
using value_t = std::conditional_t<kReducedFloat<T>, float, std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

template <typename A>
struct CastMap {
  template <typename T>
  A operator()(T x, int64_t) const { return static_cast<A>(static_cast<value_t<T>>(x)); }
};

template <typename A>
constexpr int lanes_for() { return sizeof(A) >= 8 ? 16 : 32; }

template <typename T, typename A, typename Map>
struct SumReducer {
  using Acc = A;
  static constexpr int kLanes = lanes_for<A>();
  Map map;
  A identity() const { return A(0); }
  void step(A& a, T x, int64_t o, int64_t) const { a = wrapping_add(a, A(map(x, o))); }
  void combine(A& a, const A& b) const { a = wrapping_add(a, b); }
};

template <typename T, typename A, typename Map>
struct ProdReducer {
  using Acc = A;
  static constexpr int kLanes = lanes_for<A>();
  Map map;
  A identity() const { return A(1); }
  void step(A& a, T x, int64_t o, int64_t) const { a = wrapping_mul(a, A(map(x, o))); }
  void combine(A& a, const A& b) const { a = wrapping_mul(a, b); }
};

// max (kMax) or min of map(x); NaN wins (it propagates, as in PyTorch).
template <typename T, typename A, bool kMax, typename Map>
struct MinMaxReducer {
  using Acc = A;
  static constexpr int kLanes = 16;
  Map map;
  A identity() const {
    if constexpr (std::numeric_limits<A>::has_infinity)
      return kMax ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::infinity();
    else
      return kMax ? std::numeric_limits<A>::lowest() : std::numeric_limits<A>::max();
  }
  static void pick(A& a, A v) {
    if constexpr (kMax) a = (v > a || v != v) ? v : a;
    else a = (v < a || v != v) ? v : a;
  }
  void step(A& a, T x, int64_t o, int64_t) const { pick(a, map(x, o)); }
  void combine(A& a, const A& b) const { pick(a, b); }
};

// (value, flat index) of the max (kMax) or min; ties and NaNs go to the smallest index.
template <typename T, bool kMax>
struct ArgReducer {
  using V = value_t<T>;
  struct Acc {
    V v;
    int64_t i;
  };
  static constexpr int kLanes = 8;
  Acc identity() const { return Acc{V(0), -1}; }
  // Within one accumulator indices only grow, so a later element wins only when strictly better,
  // or when it is the first NaN (written branch-free so the loops vectorize).
  void step(Acc& a, T x, int64_t, int64_t idx) const {
    V v = static_cast<V>(x);
    bool take = (kMax ? v > a.v : v < a.v) | ((v != v) & (a.v == a.v)) | (a.i < 0);
    a.v = take ? v : a.v;
    a.i = take ? idx : a.i;
  }
  void combine(Acc& a, const Acc& b) const {
    if (b.i < 0) return;
    if (a.i < 0) {
      a = b;
      return;
    }
    bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) {
      if (bn && (!an || b.i < a.i)) a = b;
      return;
    }
    bool better = kMax ? b.v > a.v : b.v < a.v;
    if (better || (b.v == a.v && b.i < a.i)) a = b;
  }
};

template <typename T, bool kAll>
struct AnyAllReducer {
  using Acc = uint8_t;
  static constexpr int kLanes = 32;
  uint8_t identity() const { return kAll ? 1 : 0; }
  void step(uint8_t& a, T x, int64_t, int64_t) const {
    uint8_t nz = static_cast<value_t<T>>(x) != value_t<T>(0);
    if constexpr (kAll) a &= nz;
    else a |= nz;
  }
  void combine(uint8_t& a, const uint8_t& b) const {
    if constexpr (kAll) a &= b;
    else a |= b;
  }
};

}  // namespace kiln::kernels
