// kiln/generator.h: counter-based random number generators (Philox 4x32-10).
//
//   kiln::manual_seed(0);                        // reseeds the default CPU generator
//   kiln::Generator g(42);                       // a private stream
//   uint64_t n = kiln::random_counters(kiln::RandomWidth::k32, numel);
//   auto [seed, offset] = g.reserve(n);          // claims n counters for one op
//   auto r = kiln::philox4x32(seed, offset + i / 4);   // r[i % 4]: element i's 32 random bits
//
// Note [Counter-based RNG]: element i of a random op depends only on (seed, offset, i). Each
// op reserves a counter range from its generator, so results are identical for any number of
// threads, on any backend, and when a recorded program is replayed on a worker.
// The layout, fixed for every backend (kernels/cpu/random_dist.h implements it):
//  - an op draws either 32 or 64 random bits per element (its RandomWidth);
//  - k32: element i reads lane i % 4 of philox4x32(seed, offset + i / 4);
//  - k64: element i reads lanes (2j, 2j + 1), j = i % 2, of philox4x32(seed, offset + i / 2),
//    as the 64-bit value (lane 2j) << 32 | lane 2j + 1;
//  - normal: elements pair up inside a counter block (i and i ^ 1) and share one Box-Muller
//    transform of their two uniforms: the even element takes r cos(t), the odd one r sin(t);
//  - the op reserves random_counters(width, numel) counters, whatever it actually reads, so a
//    recorder (tensor/ir, Remote) advances the generator exactly as an eager call does without
//    running the kernel (random_op_counters).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

#include "kiln/half.h"
#include "kiln/scalar_type.h"

namespace kiln {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // next unused counter
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull);
  void manual_seed(uint64_t seed);
  uint64_t initial_seed() const;
  GeneratorState get_state() const;
  void set_state(GeneratorState s);
  // Claims `n` consecutive counters; returns (seed, first counter).
  std::pair<uint64_t, uint64_t> reserve(uint64_t n);
  bool is_same(const Generator& o) const { return impl_ == o.impl_; }

 private:
  struct Impl {
    std::mutex mu;
    GeneratorState state;
  };
  std::shared_ptr<Impl> impl_;
};

// The process-wide default CPU generator, and torch.manual_seed.
Generator& default_generator();
void manual_seed(uint64_t seed);

// How many random bits an op draws per element (Note [Counter-based RNG]).
enum class RandomWidth { k32, k64 };
constexpr int64_t random_elems_per_counter(RandomWidth w) { return w == RandomWidth::k32 ? 4 : 2; }
constexpr uint64_t random_counters(RandomWidth w, int64_t numel) {
  int64_t per = random_elems_per_counter(w);
  return numel <= 0 ? 0 : static_cast<uint64_t>((numel + per - 1) / per);
}
// The counters a random op of the table reserves for an output of `numel` elements of `dtype`
// (rand, randn, uniform_, normal_, bernoulli: k64 for float64, else k32; randint, randperm:
// k64). ValueError for an op that is not one of the table's random ops.
uint64_t random_op_counters(std::string_view op, int64_t numel, ScalarType dtype);
RandomWidth random_op_width(std::string_view op, ScalarType dtype);

// Philox 4x32-10 (Salmon et al., SC'11; Random123's philox4x32_R(10, ctr, key)) on a 128-bit
// counter (c0 lowest word) and a 64-bit key. Checked against Random123's known-answer vectors
// in tests/kernels/random_test.cpp.
KILN_HD inline std::array<uint32_t, 4> philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2,
                                                     uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

// Four 32-bit outputs for counter `ctr` (words c0, c1; c2 = c3 = 0) under key `seed`.
KILN_HD inline std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t ctr) {
  return philox4x32_10(uint32_t(ctr), uint32_t(ctr >> 32), 0, 0, uint32_t(seed),
                       uint32_t(seed >> 32));
}

}  // namespace kiln
