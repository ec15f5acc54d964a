// kiln::data samplers (Note [Stateless samplers] in kiln/data/sampler.h).
#include "kiln/data/sampler.h"

#include <numeric>

#include "kiln/kiln.h"

namespace kiln::data {

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  KILN_CHECK(n >= 0, Value, "SequentialSampler: expected a size >= 0, got ", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> out(n_);
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  KILN_CHECK(n >= 0, Value, "RandomSampler: expected a size >= 0, got ", n);
}

namespace {
// splitmix64's finalizer: nearby (seed, epoch) pairs give unrelated generator seeds.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
}  // namespace

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  Generator g(mix(seed_ ^ mix(static_cast<uint64_t>(epoch))));
  Tensor perm = randperm(n_, g, kInt64);
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n_);
}

}  // namespace kiln::data
