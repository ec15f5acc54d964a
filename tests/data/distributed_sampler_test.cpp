// kiln::data::DistributedSampler against PyTorch's documented behaviour (Note [Distributed
// sampling]): disjoint shares that cover the epoch, wrap-around padding or drop_last, one
// permutation per epoch shared by every rank, and the WORLD_SIZE / RANK defaults.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <optional>
#include <string>

#include "kiln/data/dataloader.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using Ids = std::vector<int64_t>;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    return e.what();
  }
  ADD_FAILURE() << "expected a kiln::Error";
  return "";
}

// Every rank's indices for one epoch.
std::vector<Ids> shares(int64_t n, int64_t replicas, int64_t epoch, DistributedSamplerOptions o) {
  std::vector<Ids> out;
  for (int64_t r = 0; r < replicas; ++r) {
    o.num_replicas = replicas;
    o.rank = r;
    DistributedSampler s(n, o);
    out.push_back(s.indices(epoch));
    EXPECT_EQ(static_cast<int64_t>(out.back().size()), s.size());
  }
  return out;
}

// The epoch's order as the ranks saw it: position i is rank i % R's (i / R)-th index.
Ids interleave(const std::vector<Ids>& per_rank) {
  Ids out;
  for (size_t i = 0; i < per_rank[0].size(); ++i)
    for (const Ids& share : per_rank) out.push_back(share[i]);
  return out;
}

Ids sorted(Ids v) {
  std::sort(v.begin(), v.end());
  return v;
}

Ids iota(int64_t n) {
  Ids v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

TEST(DistributedSampler, DivisibleSharesCoverEveryIndexOnce) {
  EXPECT_EQ(shares(12, 3, 0, {.shuffle = false}),
            (std::vector<Ids>{{0, 3, 6, 9}, {1, 4, 7, 10}, {2, 5, 8, 11}}));
  for (int64_t replicas : {1, 2, 4, 5}) {
    auto per_rank = shares(20, replicas, 3, {.seed = 7});
    EXPECT_EQ(sorted(interleave(per_rank)), iota(20)) << replicas << " replicas";
  }
}

TEST(DistributedSampler, SamePermutationOnEveryRankNewEachEpoch) {
  const int64_t n = 40, replicas = 4;
  for (int64_t epoch : {0, 1, 5}) {
    // Each rank's sampler is built on its own, as in separate processes.
    Ids order = interleave(shares(n, replicas, epoch, {.seed = 11}));
    EXPECT_EQ(order, RandomSampler(n, 11).indices(epoch)) << "epoch " << epoch;
    EXPECT_NE(order, iota(n));
  }
  DistributedSampler s(n, {.num_replicas = replicas, .rank = 1, .seed = 11});
  EXPECT_EQ(s.indices(2), s.indices(2));  // a pure function of (seed, epoch)
  EXPECT_NE(s.indices(2), s.indices(3));
  EXPECT_NE(s.indices(2),
            DistributedSampler(n, {.num_replicas = replicas, .rank = 1, .seed = 12}).indices(2));
}

// The expected shares are list(torch.utils.data.DistributedSampler(range(n), R, r,
// shuffle=False, drop_last=...)) for each rank r, as PyTorch 2.15 printed them.
TEST(DistributedSampler, PadsByWrappingAround) {
  EXPECT_EQ(shares(10, 3, 0, {.shuffle = false}),
            (std::vector<Ids>{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}));
  EXPECT_EQ(shares(10, 4, 0, {.shuffle = false}),
            (std::vector<Ids>{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}));
  // More padding than examples: the order repeats.
  EXPECT_EQ(shares(3, 8, 0, {.shuffle = false}),
            (std::vector<Ids>{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}}));
  // Shuffled: the padding is the epoch's permutation wrapped.
  Ids perm = RandomSampler(10, 3).indices(4);
  Ids padded = perm;
  padded.push_back(perm[0]);
  padded.push_back(perm[1]);
  EXPECT_EQ(interleave(shares(10, 4, 4, {.seed = 3})), padded);
}

TEST(DistributedSampler, DropLastDropsTheTail) {
  EXPECT_EQ(shares(10, 4, 0, {.shuffle = false, .drop_last = true}),
            (std::vector<Ids>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  Ids perm = RandomSampler(10, 3).indices(1);
  EXPECT_EQ(interleave(shares(10, 4, 1, {.seed = 3, .drop_last = true})),
            Ids(perm.begin(), perm.begin() + 8));
  // Divisible: nothing to drop.
  EXPECT_EQ(sorted(interleave(shares(12, 4, 0, {.drop_last = true}))), iota(12));
  // Fewer examples than ranks: nothing for anyone.
  EXPECT_EQ(shares(3, 4, 0, {.drop_last = true}), std::vector<Ids>(4));
}

TEST(DistributedSampler, EmptyDataset) {
  EXPECT_EQ(shares(0, 3, 0, {}), std::vector<Ids>(3));
  EXPECT_EQ(shares(0, 3, 0, {.drop_last = true}), std::vector<Ids>(3));
}

TEST(DistributedSampler, BadArguments) {
  EXPECT_NE(error_of([] {
              DistributedSampler(10, {.num_replicas = 4, .rank = 4});
            }).find("DistributedSampler: invalid rank 4, rank should be in the interval [0, 3]"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              DistributedSampler(10, {.num_replicas = 4, .rank = -1});
            }).find("invalid rank -1"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              DistributedSampler(10, {.num_replicas = 0, .rank = 0});
            }).find("expected num_replicas >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              DistributedSampler(-1, {.num_replicas = 1, .rank = 0});
            }).find("expected a size >= 0, got -1"),
            std::string::npos);
}

// Sets (or unsets, for nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    value ? setenv(name, value->c_str(), 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(DistributedSampler, DefaultsFromTheLaunchEnvironment) {
  {
    ScopedEnv world("WORLD_SIZE", "4"), rank("RANK", "2");
    DistributedSampler s(10, {.shuffle = false});
    EXPECT_EQ(s.num_replicas(), 4);
    EXPECT_EQ(s.rank(), 2);
    EXPECT_EQ(s.indices(0), (Ids{2, 6, 0}));
    DistributedSampler given(10, {.num_replicas = 2, .rank = 1});  // arguments win
    EXPECT_EQ(given.num_replicas(), 2);
    EXPECT_EQ(given.rank(), 1);
    EXPECT_NE(error_of([] {
                DistributedSampler(10, {.num_replicas = 2});
              }).find("invalid rank 2, rank should be in the interval [0, 1]"),
              std::string::npos);
  }
  {
    ScopedEnv world("WORLD_SIZE", std::nullopt), rank("RANK", std::nullopt);
    DistributedSampler s(5, {.shuffle = false});  // not launched: one process has it all
    EXPECT_EQ(s.num_replicas(), 1);
    EXPECT_EQ(s.rank(), 0);
    EXPECT_EQ(s.indices(0), iota(5));
  }
  {
    ScopedEnv world("WORLD_SIZE", "two"), rank("RANK", "0");
    EXPECT_NE(error_of([] {
                DistributedSampler(5);
              }).find("DistributedSampler: WORLD_SIZE='two' is not an integer"),
              std::string::npos);
  }
  {
    ScopedEnv world("WORLD_SIZE", "2"), rank("RANK", "1x");
    EXPECT_NE(error_of([] { DistributedSampler(5); }).find("RANK='1x' is not an integer"),
              std::string::npos);
  }
}

// In a DataLoader: batches of this rank's share, a new shuffle per loader epoch.
TEST(DistributedSampler, InADataLoader) {
  auto ds = std::make_shared<TensorDataset>(std::vector<Tensor>{arange(0, 10, 1, kInt64)});
  auto ids = [](const Example& b) {
    Ids out;
    for (double v : testing::to_doubles(b[0])) out.push_back(static_cast<int64_t>(v));
    return out;
  };
  DataLoader plain(
      ds, {.batch_size = 2,
           .sampler = std::make_shared<DistributedSampler>(
               10, DistributedSamplerOptions{.num_replicas = 2, .rank = 1, .shuffle = false})});
  EXPECT_EQ(plain.size(), 3);
  std::vector<Ids> batches;
  for (const Example& b : plain) batches.push_back(ids(b));
  EXPECT_EQ(batches, (std::vector<Ids>{{1, 3}, {5, 7}, {9}}));

  auto sampler = std::make_shared<DistributedSampler>(
      10, DistributedSamplerOptions{.num_replicas = 2, .rank = 0, .seed = 5});
  DataLoader shuffled(ds, {.batch_size = 5, .sampler = sampler});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::optional<Example> b = shuffled.next();
    ASSERT_TRUE(b);
    EXPECT_EQ(ids(*b), sampler->indices(epoch)) << "epoch " << epoch;
    EXPECT_FALSE(shuffled.next());  // one batch per epoch
  }
  EXPECT_NE(sampler->indices(0), sampler->indices(1));
}

}  // namespace
}  // namespace kiln::data
