// kiln::data samplers (Note [Stateless samplers] in kiln/data/sampler.h).
#include "kiln/data/sampler.h"

#include <charconv>
#include <cstdlib>
#include <numeric>
#include <string_view>

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

namespace {
// An integer from the environment variable `name`, or `fallback` where it is unset.
int64_t env_int(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (!value) return fallback;
  const std::string_view s(value);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && end == s.data() + s.size(), Value, "DistributedSampler: ", name,
             "='", s, "' is not an integer");
  return v;
}
}  // namespace

DistributedSampler::DistributedSampler(int64_t n, DistributedSamplerOptions options)
    : n_(n),
      num_replicas_(options.num_replicas ? *options.num_replicas : env_int("WORLD_SIZE", 1)),
      rank_(options.rank ? *options.rank : env_int("RANK", 0)),
      options_(options) {
  KILN_CHECK(n >= 0, Value, "DistributedSampler: expected a size >= 0, got ", n);
  KILN_CHECK(num_replicas_ >= 1, Value, "DistributedSampler: expected num_replicas >= 1, got ",
             num_replicas_);
  KILN_CHECK(rank_ >= 0 && rank_ < num_replicas_, Value, "DistributedSampler: invalid rank ", rank_,
             ", rank should be in the interval [0, ", num_replicas_ - 1, "]");
  // floor(n / R) with drop_last, else ceil(n / R)
  // (See Note [Distributed sampling] in kiln/data/sampler.h).
  num_samples_ = options.drop_last ? n / num_replicas_ : (n + num_replicas_ - 1) / num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order = options_.shuffle ? RandomSampler(n_, options_.seed).indices(epoch)
                                                : SequentialSampler(n_).indices(epoch);
  std::vector<int64_t> out(num_samples_);
  // Position rank + i R of the order, padded by wrapping around (Note [Distributed sampling]).
  for (int64_t i = 0; i < num_samples_; ++i) out[i] = order[(rank_ + i * num_replicas_) % n_];
  return out;
}

}  // namespace kiln::data
