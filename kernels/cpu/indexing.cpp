// index_select, gather, scatter(_add), masked_fill, one_hot, advanced indexing (index, index_put,
// masked_select, nonzero) and repeat_interleave's indices on the CPU (tensor/ops/indexing.toml,
// shape.toml). Index values are checked in a serial pass before any parallel work (exceptions
// must not leave an OpenMP region).
#include <algorithm>
#include <cstring>

#include "kiln/generated/meta/indexing.h"
#include "kiln/generated/meta/shape.h"
#include "kiln/generated/ops/indexing.h"
#include "kiln/generated/ops/shape.h"
#include "kiln/meta.h"
#include "loops.h"
#include "strided.h"

namespace kiln::kernels {
namespace {

// Element strides of t viewed with at least one dim (a 0-d tensor is (1,) with stride 0).
DimVector sizes1(const Tensor& t) { return t.dim() == 0 ? DimVector{1} : DimVector(t.sizes()); }
DimVector strides1(const Tensor& t) { return t.dim() == 0 ? DimVector{0} : DimVector(t.strides()); }

// Calls f(offsets) for every element of `shape`, where offsets[k] is the element offset of
// operand k (strides[k] per dim). Runs in parallel chunks when `parallel`; f must not throw then.
template <int K, typename F>
void for_each_offset(IntArrayRef shape, const std::array<DimVector, K>& strides, bool parallel,
                     const F& f) {
  int64_t n = numel_of(shape), nd = static_cast<int64_t>(shape.size());
  if (n == 0) return;
  auto body = [&](int64_t begin, int64_t end) {
    DimVector idx(nd);
    std::array<int64_t, K> off{};
    for (int64_t d = nd - 1, rem = begin; d >= 0; --d) {
      idx[d] = rem % shape[d];
      rem /= shape[d];
      for (int k = 0; k < K; ++k) off[k] += idx[d] * strides[k][d];
    }
    for (int64_t i = begin; i < end; ++i) {
      f(off);
      for (int64_t d = nd - 1; d >= 0; --d) {  // odometer increment
        for (int k = 0; k < K; ++k) off[k] += strides[k][d];
        if (++idx[d] < shape[d]) break;
        for (int k = 0; k < K; ++k) off[k] -= strides[k][d] * shape[d];
        idx[d] = 0;
      }
    }
  };
  if (parallel)
    parallel_for(n, kGrainSize, body);
  else
    body(0, n);
}

// Every value of `index` must lie in [0, size); IndexError naming the value and the size.
template <typename I>
void check_indices(const char* op, const Tensor& index, int64_t size, int64_t dim) {
  const I* p = static_cast<const I*>(index.impl()->raw_data());
  for_each_offset<1>(sizes1(index), {strides1(index)}, false,
                     [&](const std::array<int64_t, 1>& off) {
                       int64_t v = static_cast<int64_t>(p[off[0]]);
                       KILN_CHECK(v >= 0 && v < size, Index, op, ": index ", v,
                                  " is out of bounds for dimension ", dim, " with size ", size);
                     });
}

// self: (..., S, ...), index: (N) -> out: (..., N, ...), out[.., i, ..] = self[.., index[i], ..].
void index_select_cpu(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  int64_t d = meta::wrap_dim("index_select", dim, self.dim());
  DimVector ssz = sizes1(self), sst = strides1(self);
  bool wide = index.dtype() == kInt64;
  if (wide)
    check_indices<int64_t>("index_select", index, ssz[d], d);
  else
    check_indices<int32_t>("index_select", index, ssz[d], d);
  if (out.numel() == 0) return;
  // Operands over out's shape: out, self with its `d` stride zeroed, index advancing along d only.
  DimVector shape = sizes1(out), self_st = sst, idx_st(shape.size(), 0);
  self_st[d] = 0;
  idx_st[d] = index.dim() == 0 ? 0 : index.stride(0);
  const int64_t step = sst[d];
  const char* ip = static_cast<const char*>(index.impl()->raw_data());
  dispatch_word(out.element_size(), [&](auto word) {
    using U = decltype(word);
    U* o = static_cast<U*>(out.impl()->raw_data());
    const U* s = static_cast<const U*>(self.impl()->raw_data());
    for_each_offset<3>(shape, {strides1(out), self_st, idx_st}, true,
                       [&](const std::array<int64_t, 3>& off) {
                         int64_t v = wide ? reinterpret_cast<const int64_t*>(ip)[off[2]]
                                          : reinterpret_cast<const int32_t*>(ip)[off[2]];
                         o[off[0]] = s[off[1] + v * step];
                       });
  });
}

// self: (S_0, .., S_d, ..), index: (I_0, .., I_d, ..) with I_k <= S_k (k != d) -> out: index's
// shape, out[p] = self[p with p_d = index[p]].
void gather_cpu(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index) {
  int64_t d = meta::wrap_dim("gather", dim, self.dim());
  DimVector self_st = strides1(self);
  check_indices<int64_t>("gather", index, sizes1(self)[d], d);
  if (out.numel() == 0) return;
  const int64_t step = self_st[d];
  self_st[d] = 0;
  const int64_t* ip = static_cast<const int64_t*>(index.impl()->raw_data());
  dispatch_word(out.element_size(), [&](auto word) {
    using U = decltype(word);
    U* o = static_cast<U*>(out.impl()->raw_data());
    const U* s = static_cast<const U*>(self.impl()->raw_data());
    for_each_offset<3>(
        sizes1(index), {strides1(out), strides1(index), self_st}, true,
        [&](const std::array<int64_t, 3>& off) { o[off[0]] = s[off[2] + ip[off[1]] * step]; });
  });
}

// out = self, then out[p with p_d = index[p]] = src[p] (or += for scatter_add) for p over
// index's shape. Serial, so repeated indices resolve deterministically (the last one wins).
template <bool kAdd>
void scatter_cpu(const Tensor& out, const Tensor& self, int64_t dim, const Tensor& index,
                 const Tensor& src) {
  const char* op = kAdd ? "scatter_add" : "scatter";
  int64_t d = meta::wrap_dim(op, dim, self.dim());
  check_indices<int64_t>(op, index, sizes1(self)[d], d);
  if (!out.is_same(self)) out.copy_(self);
  if (index.numel() == 0) return;
  DimVector out_st = strides1(out);
  const int64_t step = out_st[d];
  out_st[d] = 0;
  const int64_t* ip = static_cast<const int64_t*>(index.impl()->raw_data());
  std::array<DimVector, 3> st{strides1(index), strides1(src), out_st};
  if constexpr (!kAdd) {
    dispatch_word(out.element_size(), [&](auto word) {
      using U = decltype(word);
      U* o = static_cast<U*>(out.impl()->raw_data());
      const U* s = static_cast<const U*>(src.impl()->raw_data());
      for_each_offset<3>(sizes1(index), st, false, [&](const std::array<int64_t, 3>& off) {
        o[off[2] + ip[off[0]] * step] = s[off[1]];
      });
    });
  } else {
    KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), op, [&] {
      using T = scalar_t;
      using A = std::conditional_t<std::is_integral_v<T>, T, acc_t<T>>;
      T* o = static_cast<T*>(out.impl()->raw_data());
      const T* s = static_cast<const T*>(src.impl()->raw_data());
      for_each_offset<3>(sizes1(index), st, false, [&](const std::array<int64_t, 3>& off) {
        T& dst = o[off[2] + ip[off[0]] * step];
        dst = static_cast<T>(static_cast<A>(dst) + static_cast<A>(s[off[1]]));
      });
    });
  }
}

// self: broadcastable to out, mask (bool): broadcastable to out -> out = mask ? value : self.
void masked_fill_cpu(const Tensor& out, const Tensor& self, const Tensor& mask,
                     const Scalar& value) {
  if (!out.is_same(self)) out.copy_(self);
  if (out.numel() == 0) return;
  StridedIter<2> it({&out, &mask});
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "masked_fill", [&] {
    scalar_t v = value.to<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, bool>) v = value.to_bool();
    it.run([v](const std::array<char*, 2>& p, const std::array<int64_t, 2>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        if (*reinterpret_cast<const bool*>(p[1] + i * s[1]))
          *reinterpret_cast<scalar_t*>(p[0] + i * s[0]) = v;
    });
  });
}

// self: (...) int64 class ids -> (..., C) int64 with a single 1 per row at the class id.
// num_classes = -1 takes C = max(self) + 1 (needs the data: the Meta backend refuses it).
Tensor one_hot_cpu(const Tensor& self, int64_t num_classes) {
  meta::one_hot(self, num_classes == -1 ? 0 : num_classes);  // dtype and argument checks
  Tensor idx = self.contiguous();
  const int64_t* p = static_cast<const int64_t*>(idx.impl()->raw_data());
  int64_t n = idx.numel();
  if (num_classes == -1) {
    KILN_CHECK(
        n > 0, Value,
        "one_hot: cannot infer the number of classes from an empty tensor; pass num_classes");
    num_classes = *std::max_element(p, p + n) + 1;
  }
  for (int64_t i = 0; i < n; ++i)
    KILN_CHECK(p[i] >= 0 && p[i] < num_classes, Index, "one_hot: class value ", p[i],
               " is out of range for num_classes ", num_classes, " (values must be in [0, ",
               num_classes, "))");
  TensorSpec spec = meta::one_hot(self, num_classes);
  Tensor out = empty_on(spec.sizes, spec.dtype, spec.device);
  int64_t* o = static_cast<int64_t*>(out.impl()->raw_data());
  std::fill(o, o + out.numel(), int64_t{0});
  for (int64_t i = 0; i < n; ++i) o[i * num_classes + p[i]] = 1;
  return out;
}

// ---- advanced indexing (Note [Advanced indexing] in tensor/src/meta/indexing.cpp)

// Runs a meta function for its checks only: one that stops at a data-dependent output shape
// (Note [Data-dependent shapes]) has passed every check the arguments allow without data.
template <typename F>
void check_without_data(const F& meta_fn) {
  try {
    meta_fn();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotImplemented) throw;
  }
}

// self: any dtype and layout -> (n, self.dim()) int64, the positions of the nonzero elements in
// row-major order.
Tensor nonzero_cpu(const Tensor& self) {
  Tensor c = self.contiguous();
  const int64_t n = c.numel(), nd = c.dim();
  std::vector<int64_t> hits;
  KILN_DISPATCH_ALL_TYPES(c.dtype(), "nonzero", [&] {
    const scalar_t* p = static_cast<const scalar_t*>(c.impl()->raw_data());
    for (int64_t i = 0; i < n; ++i)
      if (static_cast<double>(p[i]) != 0.0) hits.push_back(i);
  });
  const int64_t count = static_cast<int64_t>(hits.size());
  Tensor out = empty_on({count, nd}, kInt64, self.device());
  int64_t* o = static_cast<int64_t*>(out.impl()->raw_data());
  for (int64_t h = 0; h < count; ++h)
    for (int64_t d = nd - 1, rem = hits[h]; d >= 0; --d) {
      o[h * nd + d] = rem % c.size(d);
      rem /= c.size(d);
    }
  return out;
}

// Bool masks replaced by one int64 index per mask dim (the columns of nonzero(mask)).
std::vector<Tensor> expand_masks(TensorList indices) {
  std::vector<Tensor> out;
  for (const Tensor& idx : indices) {
    if (idx.dtype() != kBool) {
      out.push_back(idx);
      continue;
    }
    Tensor nz = nonzero_cpu(idx);
    for (int64_t j = 0; j < idx.dim(); ++j) out.push_back(nz.select(1, j));
  }
  return out;
}

// The element offset into `t` (strides of t) of every indexed position, over the broadcast
// index shape `batch` in row-major order. Negative indices wrap; IndexError outside the dim.
std::vector<int64_t> index_offsets(const char* op, const Tensor& t, const std::vector<Tensor>& ints,
                                   IntArrayRef batch) {
  std::vector<int64_t> offs(numel_of(batch), 0);
  for (size_t j = 0; j < ints.size(); ++j) {
    const Tensor e = ints[j].expand(batch);
    const int64_t size = t.size(j), stride = t.stride(j);
    const bool wide = e.dtype() == kInt64;
    const char* p = static_cast<const char*>(e.impl()->raw_data());
    int64_t b = 0;
    for_each_offset<1>(sizes1(e), {strides1(e)}, false, [&](const std::array<int64_t, 1>& off) {
      int64_t v = wide ? reinterpret_cast<const int64_t*>(p)[off[0]]
                       : reinterpret_cast<const int32_t*>(p)[off[0]];
      KILN_CHECK(v >= -size && v < size, Index, op, ": index ", v,
                 " is out of bounds for dimension ", j, " with size ", size);
      if (v < 0) v += size;
      offs[b++] += v * stride;
    });
  }
  return offs;
}

// Element offsets into `t` of the trailing dims [from, dim) in row-major order.
std::vector<int64_t> trailing_offsets(const Tensor& t, int64_t from) {
  DimVector shape, st;
  for (int64_t k = from; k < t.dim(); ++k) {
    shape.push_back(t.size(k));
    st.push_back(t.stride(k));
  }
  std::vector<int64_t> offs;
  offs.reserve(numel_of(shape));
  if (shape.empty()) return {0};
  for_each_offset<1>(shape, {st}, false,
                     [&](const std::array<int64_t, 1>& off) { offs.push_back(off[0]); });
  return offs;
}

// Whether the dims [from, dim) of t are laid out row-major without gaps.
bool trailing_dense(const Tensor& t, int64_t from) {
  int64_t expected = 1;
  for (int64_t k = t.dim() - 1; k >= from; --k) {
    if (t.size(k) != 1 && t.stride(k) != expected) return false;
    expected *= t.size(k);
  }
  return true;
}

// self: (S_0, .., S_{k-1}, *rest), k integer indices broadcasting to B -> out: (*B, *rest)
Tensor index_cpu(const Tensor& self, TensorList indices) {
  check_without_data([&] { meta::index(self, indices); });
  std::vector<Tensor> ints = expand_masks(indices);
  TensorSpec spec = meta::index(self, ints);
  Tensor out = empty_on(spec.sizes, spec.dtype, spec.device);
  const int64_t k = static_cast<int64_t>(ints.size());
  IntArrayRef batch(spec.sizes.data(), spec.sizes.size() - (self.dim() - k));
  std::vector<int64_t> offs = index_offsets("index", self, ints, batch);
  std::vector<int64_t> roffs = trailing_offsets(self, k);
  const int64_t nb = static_cast<int64_t>(offs.size()), R = static_cast<int64_t>(roffs.size());
  if (out.numel() == 0) return out;
  const bool dense = trailing_dense(self, k);
  dispatch_word(out.element_size(), [&](auto word) {
    using U = decltype(word);
    U* o = static_cast<U*>(out.impl()->raw_data());
    const U* s = static_cast<const U*>(self.impl()->raw_data());
    parallel_for(nb, std::max<int64_t>(1, kGrainSize / R), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        U* dst = o + b * R;
        const U* src = s + offs[b];
        if (dense) {
          std::memcpy(dst, src, R * sizeof(U));
        } else {
          for (int64_t r = 0; r < R; ++r) dst[r] = src[roffs[r]];
        }
      }
    });
  });
  return out;
}

// out = self, then out[indices] = values (or += with accumulate), values broadcast to the
// indexed shape. Each trailing position r is owned by one thread, which visits the indexed
// positions in order: repeated indices resolve deterministically (the last write wins, sums in
// index order).
void index_put_cpu(const Tensor& out, const Tensor& self, TensorList indices, const Tensor& values,
                   bool accumulate) {
  if (!out.is_same(self)) out.copy_(self);
  std::vector<Tensor> ints = expand_masks(indices);
  TensorSpec probe = meta::index(out, ints);  // the indexed shape (*B, *rest)
  bool fits = values.dim() <= static_cast<int64_t>(probe.sizes.size());
  for (int64_t k = 1; fits && k <= values.dim(); ++k)
    fits = values.size(-k) == 1 || values.size(-k) == probe.sizes[probe.sizes.size() - k];
  KILN_CHECK(fits, Value, "index_put: shape mismatch: values of shape ", values.sizes(),
             " cannot be broadcast to the indexing result of shape ", probe.sizes);
  const int64_t k = static_cast<int64_t>(ints.size());
  IntArrayRef batch(probe.sizes.data(), probe.sizes.size() - (out.dim() - k));
  std::vector<int64_t> offs = index_offsets("index_put", out, ints, batch);
  std::vector<int64_t> roffs = trailing_offsets(out, k);
  const int64_t nb = static_cast<int64_t>(offs.size()), R = static_cast<int64_t>(roffs.size());
  if (nb == 0 || R == 0) return;
  Tensor v = values.expand(probe.sizes).contiguous();  // (nb, R)
  auto run = [&](auto put) {
    parallel_for(R, std::max<int64_t>(1, kGrainSize / nb), [&](int64_t r0, int64_t r1) {
      for (int64_t b = 0; b < nb; ++b)
        for (int64_t r = r0; r < r1; ++r) put(offs[b] + roffs[r], b * R + r);
    });
  };
  if (!accumulate) {
    dispatch_word(out.element_size(), [&](auto word) {
      using U = decltype(word);
      U* o = static_cast<U*>(out.impl()->raw_data());
      const U* s = static_cast<const U*>(v.impl()->raw_data());
      run([&](int64_t dst, int64_t src) { o[dst] = s[src]; });
    });
    return;
  }
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "index_put", [&] {
    using T = scalar_t;
    T* o = static_cast<T*>(out.impl()->raw_data());
    const T* s = static_cast<const T*>(v.impl()->raw_data());
    if constexpr (std::is_same_v<T, bool>) {
      run([&](int64_t dst, int64_t src) { o[dst] = o[dst] || s[src]; });
    } else {
      using A = std::conditional_t<std::is_integral_v<T>, T, acc_t<T>>;
      run([&](int64_t dst, int64_t src) {
        o[dst] = static_cast<T>(static_cast<A>(o[dst]) + static_cast<A>(s[src]));
      });
    }
  });
}

// self, mask (bool): broadcastable -> (n,) the elements of self where mask is true, row-major
Tensor masked_select_cpu(const Tensor& self, const Tensor& mask) {
  check_without_data([&] { meta::masked_select(self, mask); });
  DimVector shape = meta::broadcast_shapes("masked_select", self.sizes(), mask.sizes());
  Tensor s = self.expand(shape), m = mask.expand(shape);
  std::vector<int64_t> picked;
  const bool* mp = static_cast<const bool*>(m.impl()->raw_data());
  for_each_offset<2>(sizes1(s), {strides1(s), strides1(m)}, false,
                     [&](const std::array<int64_t, 2>& off) {
                       if (mp[off[1]]) picked.push_back(off[0]);
                     });
  Tensor out = empty_on({static_cast<int64_t>(picked.size())}, self.dtype(), self.device());
  dispatch_word(out.element_size(), [&](auto word) {
    using U = decltype(word);
    U* o = static_cast<U*>(out.impl()->raw_data());
    const U* sp = static_cast<const U*>(s.impl()->raw_data());
    for (size_t i = 0; i < picked.size(); ++i) o[i] = sp[picked[i]];
  });
  return out;
}

// repeats: (n,) int64 >= 0 -> (sum repeats,) int64: i repeated repeats[i] times.
Tensor repeat_interleave_indices_cpu(const Tensor& repeats) {
  check_without_data([&] { meta::repeat_interleave_indices(repeats); });
  Tensor r = repeats.contiguous();
  const int64_t* p = static_cast<const int64_t*>(r.impl()->raw_data());
  int64_t total = 0;
  for (int64_t i = 0; i < r.numel(); ++i) {
    KILN_CHECK(p[i] >= 0, Value, "repeat_interleave: repeats must be non-negative, got ", p[i],
               " at position ", i);
    total += p[i];
  }
  Tensor out = empty_on({total}, kInt64, repeats.device());
  int64_t* o = static_cast<int64_t*>(out.impl()->raw_data());
  for (int64_t i = 0, pos = 0; i < r.numel(); ++i)
    for (int64_t j = 0; j < p[i]; ++j) o[pos++] = i;
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::index_select>(index_select_cpu);
  m.structured<ops::gather>(gather_cpu);
  m.structured<ops::scatter>(scatter_cpu<false>);
  m.structured<ops::scatter_add>(scatter_cpu<true>);
  m.structured<ops::masked_fill>(masked_fill_cpu);
  m.impl<ops::one_hot>(one_hot_cpu);
  m.impl<ops::index>(index_cpu);
  m.structured<ops::index_put>(index_put_cpu);
  m.impl<ops::masked_select>(masked_select_cpu);
  m.impl<ops::nonzero>(nonzero_cpu);
  m.impl<ops::repeat_interleave_Tensor>(repeat_interleave_indices_cpu);
}

}  // namespace
}  // namespace kiln::kernels
