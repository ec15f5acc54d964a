// Random ops on the CPU: rand, randn, randint, normal_, uniform_, bernoulli, randperm.
// Note [Counter-based RNG] (kiln/generator.h) fixes which counter each element reads;
// Note [Random transforms] (random_dist.h) fixes how words become values.
#include <omp.h>

#include <algorithm>
#include <numeric>

#include "kiln/generated/meta/random.h"
#include "kiln/generated/ops/random.h"
#include "loops.h"
#include "random_dist.h"

namespace kiln::kernels {
namespace {

// Elements per parallel chunk: a multiple of every block width, so chunks start on a block.
constexpr int64_t kRandomGrain = 1 << 16;

// Runs f(begin, end) over fixed chunks of [0, n). Unlike parallel_for, a single thread walks
// the very same chunks, so each element is computed by the same code path (the same
// vectorization and FMA contraction) whatever the thread count: results are bit-identical.
template <typename F>
void parallel_chunks(int64_t n, int64_t grain, const F& f) {
  int64_t chunks = (n + grain - 1) / grain;
  int threads = get_num_threads();
  if (threads == 1 || chunks <= 1 || omp_in_parallel()) {
    for (int64_t c = 0; c < chunks; ++c) f(c * grain, std::min(n, (c + 1) * grain));
    return;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) f(c * grain, std::min(n, (c + 1) * grain));
}

// For every block k of elements [0, n): block(philox(seed, offset + k), vals) fills kPer
// values, and store(i, vals[i % kPer]) consumes those of elements that exist.
// out: (n,) elements -> ceil(n / kPer) blocks
template <int kPer, typename V, typename Block, typename Store>
void generate(int64_t n, uint64_t seed, uint64_t offset, const Block& block, const Store& store) {
  static_assert(kRandomGrain % kPer == 0);
  parallel_chunks(n, kRandomGrain, [&](int64_t b, int64_t e) {
    V vals[kPer];
    for (int64_t first = b; first < e; first += kPer) {
      block(philox4x32(seed, offset + static_cast<uint64_t>(first / kPer)), vals);
      int64_t cnt = std::min<int64_t>(kPer, e - first);
      for (int64_t j = 0; j < cnt; ++j) store(first + j, vals[j]);
    }
  });
}

// Reserves the op's counters from `gen` (the default generator when absent).
std::pair<uint64_t, uint64_t> reserve(std::optional<Generator> gen, const char* op, int64_t numel,
                                      ScalarType dtype) {
  Generator& g = gen ? *gen : default_generator();
  return g.reserve(random_op_counters(op, numel, dtype));
}

// Runs fill(contiguous out) into `self`, through a contiguous buffer when self is strided.
template <typename Fill>
void fill_in_place(const Tensor& self, const Fill& fill) {
  if (self.is_contiguous()) {
    fill(self);
    return;
  }
  Tensor tmp = empty_on(self.sizes(), self.dtype(), self.device());
  fill(tmp);
  self.copy_(tmp);
}

// Writes uniforms in [from, to) into contiguous `out`.
void uniform_fill(const Tensor& out, double from, double to, uint64_t seed, uint64_t offset) {
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "uniform_", [&] {
    using Tr = RandomTraits<scalar_t>;
    using A = typename Tr::acc;
    auto* o = static_cast<scalar_t*>(out.impl()->raw_data());
    A lo = static_cast<A>(from), hi = static_cast<A>(to);
    generate<Tr::kPer, scalar_t>(
        out.numel(), seed, offset,
        [&](const PhiloxBlock& r, scalar_t* v) { uniform_block<scalar_t>(r, lo, hi, v); },
        [&](int64_t i, scalar_t v) { o[i] = v; });
  });
}

// Writes normals N(mean, std^2) into contiguous `out`.
void normal_fill(const Tensor& out, double mean, double stddev, uint64_t seed, uint64_t offset) {
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "normal_", [&] {
    using Tr = RandomTraits<scalar_t>;
    using A = typename Tr::acc;
    auto* o = static_cast<scalar_t*>(out.impl()->raw_data());
    A m = static_cast<A>(mean), s = static_cast<A>(stddev);
    generate<Tr::kPer, scalar_t>(
        out.numel(), seed, offset,
        [&](const PhiloxBlock& r, scalar_t* v) { normal_block<scalar_t>(r, m, s, v); },
        [&](int64_t i, scalar_t v) { o[i] = v; });
  });
}

// size -> (size...) uniforms in [0, 1)
Tensor rand_cpu(IntArrayRef size, std::optional<Generator> gen, std::optional<ScalarType> dtype,
                std::optional<Device> device) {
  TensorSpec s = meta::rand(size, gen, dtype, device);
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  auto [seed, offset] = reserve(gen, "rand", out.numel(), s.dtype);
  uniform_fill(out, 0.0, 1.0, seed, offset);
  return out;
}

// size -> (size...) standard normals
Tensor randn_cpu(IntArrayRef size, std::optional<Generator> gen, std::optional<ScalarType> dtype,
                 std::optional<Device> device) {
  TensorSpec s = meta::randn(size, gen, dtype, device);
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  auto [seed, offset] = reserve(gen, "randn", out.numel(), s.dtype);
  normal_fill(out, 0.0, 1.0, seed, offset);
  return out;
}

// size -> (size...) integers in [low, high)
Tensor randint_cpu(int64_t low, int64_t high, IntArrayRef size, std::optional<Generator> gen,
                   std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::randint(low, high, size, gen, dtype, device);
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  auto [seed, offset] = reserve(gen, "randint", out.numel(), s.dtype);
  uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  KILN_DISPATCH_NUMERIC_TYPES(s.dtype, "randint", [&] {
    auto* o = static_cast<scalar_t*>(out.impl()->raw_data());
    generate<2, uint64_t>(
        out.numel(), seed, offset,
        [](const PhiloxBlock& r, uint64_t* w) { w[0] = block_word64(r, 0), w[1] = block_word64(r, 1); },
        [&](int64_t i, uint64_t w) {
          int64_t v = static_cast<int64_t>(static_cast<uint64_t>(low) + bounded64(w, range));
          o[i] = static_cast<scalar_t>(v);
        });
  });
  return out;
}

// self: (...) -> self, filled with N(mean, std^2)
Tensor normal_cpu(const Tensor& self, double mean, double stddev, std::optional<Generator> gen) {
  meta::normal_(self, mean, stddev, gen);
  auto [seed, offset] = reserve(gen, "normal_", self.numel(), self.dtype());
  fill_in_place(self, [&](const Tensor& out) { normal_fill(out, mean, stddev, seed, offset); });
  return self;
}

// self: (...) -> self, filled with U[from, to)
Tensor uniform_cpu(const Tensor& self, double from, double to, std::optional<Generator> gen) {
  meta::uniform_(self, from, to, gen);
  auto [seed, offset] = reserve(gen, "uniform_", self.numel(), self.dtype());
  fill_in_place(self, [&](const Tensor& out) { uniform_fill(out, from, to, seed, offset); });
  return self;
}

// p: (...) probabilities -> (...) of 0/1 in p's dtype, 1 with probability p[i]
Tensor bernoulli_cpu(const Tensor& self, std::optional<Generator> gen) {
  TensorSpec s = meta::bernoulli(self, gen);
  Tensor p = self.contiguous();
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  KILN_DISPATCH_FLOAT_TYPES(s.dtype, "bernoulli", [&] {
    using Tr = RandomTraits<scalar_t>;
    using A = typename Tr::acc;
    const auto* pp = static_cast<const scalar_t*>(p.impl()->raw_data());
    for (int64_t i = 0; i < p.numel(); ++i) {
      A v = static_cast<A>(pp[i]);
      KILN_CHECK(v >= A(0) && v <= A(1), Value,
                 "bernoulli: expected all probabilities in [0, 1], but got ", v, " at index ", i,
                 " of a tensor of shape ", self.sizes());
    }
    auto [seed, offset] = reserve(gen, "bernoulli", out.numel(), s.dtype);
    auto* o = static_cast<scalar_t*>(out.impl()->raw_data());
    generate<Tr::kPer, A>(
        out.numel(), seed, offset,
        [](const PhiloxBlock& r, A* u) { fine_unit_block<scalar_t>(r, u); },
        [&](int64_t i, A u) { o[i] = static_cast<scalar_t>(u < static_cast<A>(pp[i]) ? 1 : 0); });
  });
  return out;
}

// n -> (n,) a random permutation of 0..n-1 (sequential Fisher-Yates over counter words; the
// result does not depend on the thread count by construction).
Tensor randperm_cpu(int64_t n, std::optional<Generator> gen, std::optional<ScalarType> dtype,
                    std::optional<Device> device) {
  TensorSpec s = meta::randperm(n, gen, dtype, device);
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  auto [seed, offset] = reserve(gen, "randperm", n, s.dtype);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  for (int64_t i = n - 1; i >= 1; --i) {
    PhiloxBlock r = philox4x32(seed, offset + static_cast<uint64_t>(i / 2));
    uint64_t j = bounded64(block_word64(r, static_cast<int>(i % 2)), static_cast<uint64_t>(i + 1));
    std::swap(perm[i], perm[j]);
  }
  KILN_DISPATCH_NUMERIC_TYPES(s.dtype, "randperm", [&] {
    auto* o = static_cast<scalar_t*>(out.impl()->raw_data());
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<scalar_t>(perm[i]);
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::rand>(rand_cpu);
  m.impl<ops::randn>(randn_cpu);
  m.impl<ops::randint>(randint_cpu);
  m.impl<ops::normal_>(normal_cpu);
  m.impl<ops::uniform_>(uniform_cpu);
  m.impl<ops::bernoulli>(bernoulli_cpu);
  m.impl<ops::randperm>(randperm_cpu);
}

}  // namespace
}  // namespace kiln::kernels
