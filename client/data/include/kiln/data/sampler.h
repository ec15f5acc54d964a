// kiln/data/sampler.h: the order in which a DataLoader visits a map-style dataset.
//
//   kiln::data::RandomSampler s(/*n=*/10, /*seed=*/42);
//   std::vector<int64_t> order = s.indices(/*epoch=*/0);   // a permutation of 0..9
//   s.indices(0) == order;                                 // always the same for (seed, epoch)
//   s.indices(1) != order;                                 // (almost surely) a new one per epoch
//   kiln::data::SequentialSampler q(10);                   // 0, 1, ..., 9 every epoch
#pragma once

#include <cstdint>
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

}  // namespace kiln::data
