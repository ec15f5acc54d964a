// index_select, gather, scatter(_add), masked_fill and one_hot on the CPU
// (tensor/ops/indexing.toml). Index values are checked in a serial pass before any parallel
// work (exceptions must not leave an OpenMP region).
#include <algorithm>

#include "kiln/generated/meta_decls.h"
#include "kiln/generated/op_handles.h"
#include "kiln/meta.h"
#include "loops.h"

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

// Elements are moved as unsigned words of the dtype's size (index_select, gather, scatter).
template <typename F>
void dispatch_word(size_t element_size, const F& f) {
  switch (element_size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      KILN_ASSERT(false, "unexpected element size ", element_size);
  }
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

KILN_LIBRARY(CPU, m) {
  m.structured<ops::index_select>(index_select_cpu);
  m.structured<ops::gather>(gather_cpu);
  m.structured<ops::scatter>(scatter_cpu<false>);
  m.structured<ops::scatter_add>(scatter_cpu<true>);
  m.structured<ops::masked_fill>(masked_fill_cpu);
  m.impl<ops::one_hot>(one_hot_cpu);
}

}  // namespace
}  // namespace kiln::kernels
