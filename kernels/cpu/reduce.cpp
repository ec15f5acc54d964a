// Reductions on the CPU (tensor/ops/reduction.toml): sum, mean, prod, max/min (all and .dim),
// argmax/argmin, var/std, norm, logsumexp, any/all. The engine and its determinism rules are in
// reduce.h (Note [Deterministic reductions], Note [Reduction layouts]).
#include "reduce.h"

#include "kiln/generated/meta/reduction.h"
#include "kiln/generated/ops/reduction.h"
#include "kiln/meta.h"
#include "kiln/scalar_math.h"

namespace kiln::kernels {
namespace {

Tensor alloc(const TensorSpec& s) { return empty_strided_on(s.sizes, s.strides, s.dtype, s.device); }

template <typename T>
const T* data_of(const Tensor& x) {
  return static_cast<const T*>(x.impl()->raw_data());
}

// out (contiguous, any dtype) [o] = f(o) for o in [0, out.numel()).
template <typename F>
void write_out(const Tensor& out, const F& f) {
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "reduce", [&] {
    auto* po = static_cast<scalar_t*>(out.impl()->raw_data());
    for (int64_t o = 0; o < out.numel(); ++o) po[o] = convert<scalar_t>(f(o));
  });
}

Tensor cast_if(const Tensor& x, std::optional<ScalarType> dtype) {
  return dtype && *dtype != x.dtype() ? x.to(*dtype) : x;
}

ReducePlan plan_for(const char* op, const Tensor& x, OptionalIntArrayRef dim) {
  return make_plan(x, meta::dim_mask(op, dim, x.dim()), /*logical_order=*/false);
}

// Per-output sums of map(x, o) in the accumulation type A.
template <typename T, typename A, typename Map>
std::vector<A> sums(const ReducePlan& p, const Tensor& x, const Map& map) {
  std::vector<A> acc(p.num_out);
  reduce(p, data_of<T>(x), SumReducer<T, A, Map>{map}, acc.data());
  return acc;
}

// x: (..., reduced dims, ...) -> kept dims (keepdim keeps them as 1)
Tensor sum_cpu(const Tensor& self, OptionalIntArrayRef dim, bool keepdim, std::optional<ScalarType> dtype) {
  Tensor out = alloc(meta::sum(self, dim, keepdim, dtype));
  Tensor x = cast_if(self, dtype);
  ReducePlan p = plan_for("sum", x, dim);
  KILN_DISPATCH_ALL_TYPES(x.dtype(), "sum", [&] {
    using A = acc_t<scalar_t>;
    auto acc = sums<scalar_t, A>(p, x, CastMap<A>{});
    write_out(out, [&](int64_t o) { return acc[o]; });
  });
  return out;
}

Tensor mean_cpu(const Tensor& self, OptionalIntArrayRef dim, bool keepdim, std::optional<ScalarType> dtype) {
  Tensor out = alloc(meta::mean(self, dim, keepdim, dtype));
  Tensor x = cast_if(self, dtype);
  ReducePlan p = plan_for("mean", x, dim);
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "mean", [&] {
    using A = acc_t<scalar_t>;
    auto acc = sums<scalar_t, A>(p, x, CastMap<A>{});
    A n = static_cast<A>(p.red_numel);
    write_out(out, [&](int64_t o) { return acc[o] / n; });  // 0 / 0 = nan for an empty mean
  });
  return out;
}

Tensor prod_cpu(const Tensor& self, OptionalIntArrayRef dim, bool keepdim, std::optional<ScalarType> dtype) {
  Tensor out = alloc(meta::prod(self, dim, keepdim, dtype));
  Tensor x = cast_if(self, dtype);
  ReducePlan p = plan_for("prod", x, dim);
  KILN_DISPATCH_ALL_TYPES(x.dtype(), "prod", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    std::vector<A> acc(p.num_out);
    reduce(p, data_of<T>(x), ProdReducer<T, A, CastMap<A>>{}, acc.data());
    write_out(out, [&](int64_t o) { return acc[o]; });
  });
  return out;
}

template <bool kMax>
Tensor minmax_all_cpu(const Tensor& self) {
  Tensor out = alloc(kMax ? meta::max_all(self) : meta::min_all(self));
  ReducePlan p = plan_for(kMax ? "max" : "min", self, std::nullopt);
  KILN_DISPATCH_ALL_TYPES(self.dtype(), kMax ? "max" : "min", [&] {
    using T = scalar_t;
    using V = value_t<T>;
    V v;
    reduce(p, data_of<T>(self), MinMaxReducer<T, V, kMax, CastMap<V>>{}, &v);
    write_out(out, [&](int64_t) { return v; });
  });
  return out;
}

// amax/amin: x (..., reduced dims, ...) -> kept dims; the reduced dims are never empty (meta).
template <bool kMax>
Tensor amax_amin_cpu(const Tensor& self, IntArrayRef dim, bool keepdim) {
  const char* op = kMax ? "amax" : "amin";
  Tensor out = alloc(kMax ? meta::amax(self, dim, keepdim) : meta::amin(self, dim, keepdim));
  if (out.numel() == 0) return out;
  ReducePlan p = plan_for(op, self, dim);
  KILN_DISPATCH_ALL_TYPES(self.dtype(), op, [&] {
    using T = scalar_t;
    using V = value_t<T>;
    std::vector<V> acc(p.num_out);
    reduce(p, data_of<T>(self), MinMaxReducer<T, V, kMax, CastMap<V>>{}, acc.data());
    write_out(out, [&](int64_t o) { return acc[o]; });
  });
  return out;
}

// Flat indices of one reduced dim, or of all dims (in row-major order) when dim is absent.
template <bool kMax>
void arg_reduce(const Tensor& self, std::optional<int64_t> dim, const Tensor* values,
                const Tensor& indices) {
  std::vector<bool> mask(self.dim(), !dim.has_value());
  if (dim && self.dim() > 0) mask[meta::wrap_dim(kMax ? "max" : "min", *dim, self.dim())] = true;
  ReducePlan p = make_plan(self, mask, /*logical_order=*/true);
  KILN_DISPATCH_ALL_TYPES(self.dtype(), kMax ? "max" : "min", [&] {
    using T = scalar_t;
    using R = ArgReducer<T, kMax>;
    std::vector<typename R::Acc> acc(p.num_out);
    reduce(p, data_of<T>(self), R{}, acc.data());
    if (values) write_out(*values, [&](int64_t o) { return acc[o].v; });
    write_out(indices, [&](int64_t o) { return acc[o].i; });
  });
}

template <bool kMax>
std::tuple<Tensor, Tensor> minmax_dim_cpu(const Tensor& self, int64_t dim, bool keepdim) {
  auto specs = kMax ? meta::max_dim(self, dim, keepdim) : meta::min_dim(self, dim, keepdim);
  Tensor values = alloc(specs[0]), indices = alloc(specs[1]);
  arg_reduce<kMax>(self, dim, &values, indices);
  return {values, indices};
}

template <bool kMax>
Tensor arg_cpu(const Tensor& self, std::optional<int64_t> dim, bool keepdim) {
  Tensor out = alloc(kMax ? meta::argmax(self, dim, keepdim) : meta::argmin(self, dim, keepdim));
  arg_reduce<kMax>(self, dim, nullptr, out);
  return out;
}

// Two passes (mean, then the sum of squared deviations), each a cascade sum: accurate even when
// the mean is large compared with the spread, unlike sum(x^2) - n mean^2.
template <bool kStd>
Tensor var_std_cpu(const Tensor& self, OptionalIntArrayRef dim, double correction, bool keepdim) {
  Tensor out = alloc(kStd ? meta::std_dev(self, dim, correction, keepdim)
                          : meta::var(self, dim, correction, keepdim));
  ReducePlan p = plan_for(kStd ? "std" : "var", self, dim);
  KILN_DISPATCH_FLOAT_TYPES(self.dtype(), kStd ? "std" : "var", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    A n = static_cast<A>(p.red_numel);
    std::vector<A> mean = sums<T, A>(p, self, CastMap<A>{});
    for (A& m : mean) m /= n;
    const A* mp = mean.data();
    auto sq = [mp](T x, int64_t o) {
      A d = static_cast<A>(x) - mp[o];
      return d * d;
    };
    std::vector<A> m2 = sums<T, A>(p, self, sq);
    A denom = static_cast<A>(std::max(0.0, static_cast<double>(p.red_numel) - correction));
    write_out(out, [&](int64_t o) {
      A v = m2[o] / denom;
      return kStd ? std::sqrt(v) : v;
    });
  });
  return out;
}

Tensor norm_cpu(const Tensor& self, const Scalar& p_, OptionalIntArrayRef dim, bool keepdim) {
  Tensor out = alloc(meta::norm(self, p_, dim, keepdim));
  ReducePlan p = plan_for("norm", self, dim);
  double pv = p_.to_double();
  KILN_DISPATCH_FLOAT_TYPES(self.dtype(), "norm", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    auto absval = [](T x, int64_t) { return std::abs(static_cast<A>(x)); };
    std::vector<A> acc(p.num_out);
    if (std::isinf(pv)) {
      if (pv > 0) reduce(p, data_of<T>(self), MinMaxReducer<T, A, true, decltype(absval)>{absval}, acc.data());
      else reduce(p, data_of<T>(self), MinMaxReducer<T, A, false, decltype(absval)>{absval}, acc.data());
      write_out(out, [&](int64_t o) { return acc[o]; });
    } else if (pv == 0) {
      acc = sums<T, A>(p, self, [](T x, int64_t) { return static_cast<A>(static_cast<A>(x) != A(0)); });
      write_out(out, [&](int64_t o) { return acc[o]; });
    } else if (pv == 1) {
      acc = sums<T, A>(p, self, absval);
      write_out(out, [&](int64_t o) { return acc[o]; });
    } else if (pv == 2) {
      acc = sums<T, A>(p, self, [](T x, int64_t) {
        A v = static_cast<A>(x);
        return v * v;
      });
      write_out(out, [&](int64_t o) { return std::sqrt(acc[o]); });
    } else {
      A pa = static_cast<A>(pv);
      acc = sums<T, A>(p, self, [pa](T x, int64_t) { return std::pow(std::abs(static_cast<A>(x)), pa); });
      write_out(out, [&](int64_t o) { return std::pow(acc[o], A(1) / pa); });
    }
  });
  return out;
}

// log(sum(exp(x - m))) + m with m the max of each output (0 where it is infinite, so rows of
// -inf give -inf and rows containing +inf give +inf instead of nan).
Tensor logsumexp_cpu(const Tensor& self, IntArrayRef dim, bool keepdim) {
  TensorSpec spec = meta::logsumexp(self, dim, keepdim);
  Tensor out = alloc(spec);
  Tensor x = cast_if(self, spec.dtype);
  ReducePlan p = plan_for("logsumexp", x, dim);
  KILN_DISPATCH_FLOAT_TYPES(x.dtype(), "logsumexp", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    std::vector<A> shift(p.num_out);
    reduce(p, data_of<T>(x), MinMaxReducer<T, A, true, CastMap<A>>{}, shift.data());
    for (A& m : shift)
      if (std::isinf(m)) m = 0;
    const A* sp = shift.data();
    auto acc = sums<T, A>(p, x, [sp](T v, int64_t o) { return std::exp(static_cast<A>(v) - sp[o]); });
    write_out(out, [&](int64_t o) { return std::log(acc[o]) + shift[o]; });
  });
  return out;
}

template <bool kAll>
Tensor any_all_cpu(const Tensor& self, OptionalIntArrayRef dim, bool keepdim) {
  Tensor out = alloc(kAll ? meta::all(self, dim, keepdim) : meta::any(self, dim, keepdim));
  ReducePlan p = plan_for(kAll ? "all" : "any", self, dim);
  KILN_DISPATCH_ALL_TYPES(self.dtype(), kAll ? "all" : "any", [&] {
    using T = scalar_t;
    std::vector<uint8_t> acc(p.num_out);
    reduce(p, data_of<T>(self), AnyAllReducer<T, kAll>{}, acc.data());
    write_out(out, [&](int64_t o) { return acc[o]; });
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::sum>(sum_cpu);
  m.impl<ops::mean>(mean_cpu);
  m.impl<ops::prod>(prod_cpu);
  m.impl<ops::max>(minmax_all_cpu<true>);
  m.impl<ops::min>(minmax_all_cpu<false>);
  m.impl<ops::max_dim>(minmax_dim_cpu<true>);
  m.impl<ops::min_dim>(minmax_dim_cpu<false>);
  m.impl<ops::amax>(amax_amin_cpu<true>);
  m.impl<ops::amin>(amax_amin_cpu<false>);
  m.impl<ops::argmax>(arg_cpu<true>);
  m.impl<ops::argmin>(arg_cpu<false>);
  m.impl<ops::var>(var_std_cpu<false>);
  m.impl<ops::std>(var_std_cpu<true>);
  m.impl<ops::norm>(norm_cpu);
  m.impl<ops::logsumexp>(logsumexp_cpu);
  m.impl<ops::any>(any_all_cpu<false>);
  m.impl<ops::all>(any_all_cpu<true>);
}

}  // namespace
}  // namespace kiln::kernels
