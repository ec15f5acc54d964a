// kiln/data/sampler.h: the order in which a DataLoader visits a map-style dataset.
//
//   kiln::data::RandomSampler s(/*n=*/10, /*seed=*/42);
//   std::vector<int64_t> order = s.indices(/*epoch=*/0);   // a permutation of 0..9
//   s.indices(0) == order;                                 // always the same for (seed, epoch)
//   s.indices(1) != order;                                 // (almost surely) a new one per epoch
//   kiln::data::SequentialSampler q(10);                   // 0, 1, ..., 9 every epoch
//   kiln::data::DistributedSampler d(10, {.seed = 42});    // this rank's share ($RANK,
//   $WORLD_SIZE)
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kiln::data {

// Note [Stateless samplers]: a sampler's order is a pure function of the epoch number and its
// settings, never of how many times it was asked. A loader's position (epoch, batch) then pins
// down exactly which examples come next, so a restored loader resumes mid-epoch bit for bit.
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual int64_t size() const = 0;  // indices per epoch
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);  // ValueError for n < 0
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A fresh permutation per epoch, from kiln::randperm with a Generator seeded by a mix of
// (seed, epoch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);  // ValueError for n < 0
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

struct DistributedSamplerOptions {
  std::optional<int64_t> num_replicas;  // default: $WORLD_SIZE, or 1 where it is unset
  std::optional<int64_t> rank;          // default: $RANK, or 0 where it is unset
  bool shuffle = true;
  uint64_t seed = 0;  // every rank must use the same seed
  bool drop_last = false;
};

// Note [Distributed sampling]: PyTorch's DistributedSampler. Each epoch's order (the
// RandomSampler(n, seed) permutation for that epoch, or 0..n-1 without shuffle) is the same on
// every rank; rank r takes its positions r, r + R, r + 2R, ... (R = num_replicas), so the ranks'
// shares are disjoint and together cover the order. When R does not divide n, drop_last drops
// the order's tail so that every rank gets floor(n / R) indices; otherwise the order is padded by
// wrapping around to its start until every rank gets ceil(n / R), so a few indices appear twice
// in the epoch. PyTorch's sampler.set_epoch(e) has no counterpart here (Note [Stateless
// samplers]): the loader passes its epoch to indices(), so loader.set_epoch(e) does it.
class DistributedSampler : public Sampler {
 public:
  // ValueError for n < 0, num_replicas < 1, a rank outside [0, num_replicas), or a WORLD_SIZE or
  // RANK variable that is not an integer.
  explicit DistributedSampler(int64_t n, DistributedSamplerOptions options = {});
  int64_t size() const override { return num_samples_; }  // this rank's indices per epoch
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }

 private:
  int64_t n_;
  int64_t num_replicas_;
  int64_t rank_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
};

}  // namespace kiln::data
