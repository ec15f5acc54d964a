// kiln::data: datasets, samplers and the DataLoader (ordering, workers, resume).
#include "kiln/data/dataloader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::data {
namespace {

using kiln::testing::from_vector;
using kiln::testing::to_doubles;

// x[i] = {i, 10 i} (float), y[i] = i (int64): every batch says which examples it holds.
std::shared_ptr<TensorDataset> numbered(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(i);
    x.push_back(10 * i);
    y.push_back(i);
  }
  return std::make_shared<TensorDataset>(
      std::vector<Tensor>{from_vector<float>(x, {n, 2}), from_vector<int64_t>(y, {n})});
}

std::vector<int64_t> ids(const Example& b) {
  std::vector<int64_t> out;
  for (double v : to_doubles(b[1])) out.push_back(static_cast<int64_t>(v));
  return out;
}

// Every batch of one epoch, as lists of example ids.
std::vector<std::vector<int64_t>> epoch(DataLoader& l) {
  std::vector<std::vector<int64_t>> out;
  for (const Example& b : l) out.push_back(ids(b));
  return out;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DataTensorDataset, GetAndBatch) {
  auto ds = numbered(5);
  EXPECT_EQ(ds->size(), 5);
  Example e = ds->get(3);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(to_doubles(e[0]), (std::vector<double>{3, 30}));
  EXPECT_EQ(e[1].dim(), 0);
  Example b = ds->get_batch({4, 0, 2});
  EXPECT_EQ(b[0].sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(to_doubles(b[0]), (std::vector<double>{4, 40, 0, 0, 2, 20}));
  EXPECT_EQ(ids(b), (std::vector<int64_t>{4, 0, 2}));
  // The base class's default: get() each, then stack.
  Example d = ds->Dataset::get_batch({4, 0, 2});
  EXPECT_EQ(to_doubles(d[0]), to_doubles(b[0]));
  EXPECT_EQ(d[1].dtype(), kInt64);
}

TEST(DataTensorDataset, Errors) {
  EXPECT_NE(error_of([] {
              TensorDataset({ones({3, 2}), ones({4})});
            }).find("[3, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([] { TensorDataset(std::vector<Tensor>{}); }).find("at least one"),
            std::string::npos);
  EXPECT_NE(error_of([] { TensorDataset({scalar_tensor_of(1, kFloat32)}); }).find("0-dim"),
            std::string::npos);
  auto ds = numbered(3);
  EXPECT_NE(error_of([&] { ds->get(3); }).find("index 3 is out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { ds->get_batch({0, -1}); }).find("index -1"), std::string::npos);
  EXPECT_NE(error_of([] {
              collate_stack({{ones({2})}, {ones({2}), ones({2})}});
            }).find("fields"),
            std::string::npos);
}

TEST(DataSampler, SequentialAndSeededRandom) {
  EXPECT_EQ(SequentialSampler(4).indices(7), (std::vector<int64_t>{0, 1, 2, 3}));
  RandomSampler s(50, 42);
  std::vector<int64_t> e0 = s.indices(0);
  EXPECT_EQ(std::set<int64_t>(e0.begin(), e0.end()).size(), 50u);
  EXPECT_EQ(*std::max_element(e0.begin(), e0.end()), 49);
  EXPECT_EQ(s.indices(0), e0);  // a pure function of (seed, epoch)
  EXPECT_EQ(RandomSampler(50, 42).indices(0), e0);
  EXPECT_NE(s.indices(1), e0);  // a new order every epoch
  EXPECT_NE(RandomSampler(50, 43).indices(0), e0);
  EXPECT_TRUE(RandomSampler(0, 1).indices(0).empty());
  EXPECT_NE(error_of([] { RandomSampler(-1, 0); }).find("-1"), std::string::npos);
}

TEST(DataLoader, SequentialBatchingAndDropLast) {
  DataLoader keep(numbered(7), {.batch_size = 3});
  EXPECT_EQ(keep.size(), 3);
  EXPECT_EQ(epoch(keep), (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {6}}));
  EXPECT_EQ(keep.position(), (LoaderPosition{1, 0}));
  DataLoader drop(numbered(7), {.batch_size = 3, .drop_last = true});
  EXPECT_EQ(drop.size(), 2);
  EXPECT_EQ(epoch(drop), (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}}));
  DataLoader empty(numbered(2), {.batch_size = 3, .drop_last = true});
  EXPECT_TRUE(epoch(empty).empty());
  // Field shapes of a batch: (B, 2) and (B,).
  DataLoader one(numbered(4), {.batch_size = 4});
  Example b = *one.next();
  EXPECT_EQ(b[0].sizes(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(b[1].sizes(), (std::vector<int64_t>{4}));
}

TEST(DataLoader, SeededShuffleIsReproducibleAndNewEachEpoch) {
  DataLoader a(numbered(20), {.batch_size = 6, .shuffle = true, .seed = 5});
  DataLoader b(numbered(20), {.batch_size = 6, .shuffle = true, .seed = 5});
  auto a0 = epoch(a), a1 = epoch(a);
  EXPECT_EQ(epoch(b), a0);
  EXPECT_EQ(epoch(b), a1);
  EXPECT_NE(a0, a1);
  std::set<int64_t> seen;
  for (const auto& batch : a0) seen.insert(batch.begin(), batch.end());
  EXPECT_EQ(seen.size(), 20u);
  EXPECT_EQ(a0.back().size(), 2u);
  // The order is the sampler's for that epoch.
  std::vector<int64_t> flat;
  for (const auto& batch : a1) flat.insert(flat.end(), batch.begin(), batch.end());
  EXPECT_EQ(flat, RandomSampler(20, 5).indices(1));
  DataLoader c(numbered(20), {.batch_size = 6, .shuffle = true, .seed = 6});
  EXPECT_NE(epoch(c), a0);
}

TEST(DataLoader, WorkersGiveTheSameBatchesInOrder) {
  DataLoader ref(numbered(37), {.batch_size = 4, .shuffle = true, .seed = 9});
  auto want0 = epoch(ref), want1 = epoch(ref);
  for (int workers : {1, 2, 3})
    for (int prefetch : {1, 4}) {
      DataLoader l(numbered(37), {.batch_size = 4,
                                  .shuffle = true,
                                  .seed = 9,
                                  .num_workers = workers,
                                  .prefetch_factor = prefetch});
      EXPECT_EQ(epoch(l), want0) << workers << " workers, prefetch " << prefetch;
      EXPECT_EQ(epoch(l), want1) << workers << " workers, prefetch " << prefetch;
    }
}

TEST(DataLoader, CustomSamplerAndCollate) {
  DataLoaderOptions o{.batch_size = 2};
  o.sampler = std::make_shared<SequentialSampler>(3);  // only the first 3 examples
  o.collate = [](const std::vector<Example>& ex) {
    Example s = collate_stack(ex);
    return Example{s[1] * 100};
  };
  DataLoader l(numbered(10), o);
  EXPECT_EQ(l.size(), 2);
  Example b = *l.next();
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(to_doubles(b[0]), (std::vector<double>{0, 100}));
  EXPECT_EQ(to_doubles(l.next()->at(0)), (std::vector<double>{200}));
  EXPECT_FALSE(l.next().has_value());
}

// Resuming from a saved position reproduces the uninterrupted run, with and without workers.
TEST(DataLoader, ResumeMidEpochEqualsUninterruptedRun) {
  DataLoaderOptions o{.batch_size = 3, .shuffle = true, .seed = 11, .drop_last = true};
  DataLoader ref(numbered(20), o);
  std::vector<std::vector<int64_t>> want;
  for (int e = 0; e < 3; ++e)
    for (auto& b : epoch(ref)) want.push_back(b);
  for (int workers : {0, 2}) {
    o.num_workers = workers;
    std::vector<std::vector<int64_t>> got;
    std::string saved;
    {
      DataLoader first(numbered(20), o);
      for (auto& b : epoch(first)) got.push_back(b);
      for (int i = 0; i < 4; ++i) got.push_back(ids(*first.next()));  // stops mid-epoch 1
      saved = first.position().to_json();
    }
    EXPECT_EQ(saved, "{\"batch\":4,\"epoch\":1}");
    DataLoader second(numbered(20), o);
    second.set_position(LoaderPosition::from_json(saved));
    for (int e = 0; e < 2; ++e)
      for (auto& b : epoch(second)) got.push_back(b);
    EXPECT_EQ(got, want) << workers << " workers";
  }
}

TEST(DataLoader, LeavingALoopEarlyKeepsThePlace) {
  DataLoader l(numbered(10), {.batch_size = 2, .num_workers = 2});
  for (const Example& b : l) {
    EXPECT_EQ(ids(b), (std::vector<int64_t>{0, 1}));
    break;
  }
  EXPECT_EQ(l.position(), (LoaderPosition{0, 1}));
  EXPECT_EQ(epoch(l), (std::vector<std::vector<int64_t>>{{2, 3}, {4, 5}, {6, 7}, {8, 9}}));
  EXPECT_EQ(l.position(), (LoaderPosition{1, 0}));
}

TEST(DataLoader, PositionErrors) {
  DataLoader l(numbered(10), {.batch_size = 4});
  EXPECT_NE(error_of([&] {
              l.set_position({0, 4});
            }).find("past the end of an epoch of 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { l.set_position({-1, 0}); }).find("negative"), std::string::npos);
  l.set_position({2, 3});  // the end of epoch 2: the next call closes it
  EXPECT_FALSE(l.next().has_value());
  EXPECT_EQ(l.position(), (LoaderPosition{3, 0}));
  EXPECT_NE(error_of([] { LoaderPosition::from_json("{\"epoch\":1}"); }).find("expected"),
            std::string::npos);
  EXPECT_NE(error_of([] { LoaderPosition::from_json("not json"); }).find("expected"),
            std::string::npos);
  EXPECT_NE(error_of([] { DataLoader(numbered(3), {.batch_size = 0}); }).find("batch_size"),
            std::string::npos);
  EXPECT_NE(error_of([] { DataLoader(numbered(3), {.num_workers = -1}); }).find("num_workers"),
            std::string::npos);
}

// Says it has 3 indices, gives 2.
class ShortSampler : public Sampler {
 public:
  int64_t size() const override { return 3; }
  std::vector<int64_t> indices(int64_t) const override { return {0, 1}; }
};

TEST(DataLoader, SamplerThatBreaksItsSizeIsRejected) {
  DataLoaderOptions o{.batch_size = 2};
  o.sampler = std::make_shared<ShortSampler>();
  DataLoader l(numbered(5), o);
  EXPECT_NE(error_of([&] { l.next(); }).find("sampler's size() is 3 but epoch 0 has 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { l.next(); }).find("sampler's size()"), std::string::npos);
  EXPECT_EQ(l.position(), (LoaderPosition{0, 0}));
}

// Fails on one index, and counts the batches it made.
class Flaky : public Dataset {
 public:
  int64_t size() const override { return 12; }
  Example get(int64_t i) const override {
    KILN_CHECK(i != bad, Value, "Flaky: example ", i, " is broken");
    ++made;
    return {scalar_tensor_of(i, kInt64), scalar_tensor_of(i, kInt64)};
  }
  int64_t bad = -1;
  mutable std::atomic<int> made{0};
};

TEST(DataLoader, WorkerErrorIsRethrownAtItsBatch) {
  for (int workers : {0, 2}) {
    auto ds = std::make_shared<Flaky>();
    ds->bad = 7;
    DataLoader l(ds, {.batch_size = 3, .num_workers = workers});
    EXPECT_EQ(ids(*l.next()), (std::vector<int64_t>{0, 1, 2}));
    EXPECT_EQ(ids(*l.next()), (std::vector<int64_t>{3, 4, 5}));
    EXPECT_NE(error_of([&] { l.next(); }).find("example 7 is broken"), std::string::npos);
    EXPECT_EQ(l.position(), (LoaderPosition{0, 2}));
    ds->bad = -1;  // fixed: the loader retries that batch
    EXPECT_EQ(ids(*l.next()), (std::vector<int64_t>{6, 7, 8}));
    EXPECT_EQ(ids(*l.next()), (std::vector<int64_t>{9, 10, 11}));
    EXPECT_FALSE(l.next().has_value());
  }
}

TEST(DataLoader, PrefetchStaysWithinItsWindow) {
  auto ds = std::make_shared<Flaky>();
  DataLoader l(ds, {.batch_size = 1, .num_workers = 2, .prefetch_factor = 2});
  l.next();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // One batch taken, and at most 2 * 2 ahead of the caller; all of those are made by now.
  EXPECT_EQ(ds->made.load(), 1 + 4);
}

// 0, 1, ..., n-1 as one-field examples; counts resets.
class Counter : public IterableDataset {
 public:
  explicit Counter(int64_t n) : n_(n) {}
  void reset() override {
    i_ = 0;
    ++resets;
  }
  std::optional<Example> next() override {
    if (i_ >= n_) return std::nullopt;
    int64_t v = i_++;
    return Example{scalar_tensor_of(v, kInt64), scalar_tensor_of(v, kInt64)};
  }
  int resets = 0;

 private:
  int64_t n_, i_ = 0;
};

TEST(DataIterableLoader, BatchesDropLastWorkersAndResume) {
  using Batches = std::vector<std::vector<int64_t>>;
  for (int workers : {0, 1, 3}) {
    auto s = std::make_shared<Counter>(7);
    DataLoader keep(s, {.batch_size = 3, .num_workers = workers});
    EXPECT_EQ(epoch(keep), (Batches{{0, 1, 2}, {3, 4, 5}, {6}}));
    EXPECT_EQ(epoch(keep), (Batches{{0, 1, 2}, {3, 4, 5}, {6}}));  // reset each epoch
    EXPECT_EQ(s->resets, 2);
    DataLoader drop(std::make_shared<Counter>(7),
                    {.batch_size = 3, .drop_last = true, .num_workers = workers});
    EXPECT_EQ(epoch(drop), (Batches{{0, 1, 2}, {3, 4, 5}}));
    DataLoader resumed(std::make_shared<Counter>(7), {.batch_size = 2, .num_workers = workers});
    resumed.set_position({4, 2});
    EXPECT_EQ(epoch(resumed), (Batches{{4, 5}, {6}}));
    EXPECT_EQ(resumed.position(), (LoaderPosition{5, 0}));
    resumed.set_position({0, 9});
    EXPECT_NE(error_of([&] { resumed.next(); }).find("the stream ended after 7"),
              std::string::npos);
  }
  EXPECT_NE(error_of([] {
              DataLoader(std::make_shared<Counter>(1), {.shuffle = true});
            }).find("IterableDataset"),
            std::string::npos);
  EXPECT_NE(error_of([] { DataLoader(std::make_shared<Counter>(1)).size(); }).find("no length"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::data
