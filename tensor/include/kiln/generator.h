// kiln/generator.h: counter-based random number generators (Philox 4x32-10).
//
//   kiln::manual_seed(0);                        // reseeds the default CPU generator
//   kiln::Generator g(42);                       // a private stream
//   auto [seed, offset] = g.reserve(n);          // claims n counter values for one op
//   kiln::philox_uniform(seed, offset + i);      // element i, independent of thread count
//
// Note [Counter-based RNG]: element i of a random op depends only on (seed, offset, i). Each
// op reserves a counter range from its generator, so results are identical for any number of
// threads, on any backend, and when a recorded program is replayed on a worker.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "kiln/half.h"

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

// Philox 4x32-10: four 32-bit outputs for counter `ctr` under key `seed`.
KILN_HD inline std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t ctr) {
  uint32_t c0 = uint32_t(ctr), c1 = uint32_t(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
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

// A float in [0, 1) from 24 random bits (never 1.0 after rounding).
KILN_HD inline float uint_to_unit_float(uint32_t x) { return float(x >> 8) * (1.0f / 16777216.0f); }
// A double in [0, 1) from 53 random bits.
KILN_HD inline double uints_to_unit_double(uint32_t hi, uint32_t lo) {
  return double(((uint64_t(hi) << 32) | lo) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace kiln
