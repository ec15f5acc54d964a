// kiln/data/dataloader.h: batches from a dataset, optionally shuffled and prefetched by
// background threads, with a position that a checkpoint can save and restore.
//
//   kiln::data::DataLoader loader(dataset, {.batch_size = 32, .shuffle = true, .seed = 1,
//                                          .drop_last = true, .num_workers = 2});
//   for (int epoch = 0; epoch < 3; ++epoch)
//     for (const kiln::data::Example& batch : loader) step(batch[0], batch[1]);
//   std::string saved = loader.position().to_json();   // into the checkpoint's metadata
//   loader.set_position(kiln::data::LoaderPosition::from_json(saved));   // resume exactly there
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/sampler.h"

namespace kiln::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;  // a RandomSampler(size, seed); map-style datasets only
  uint64_t seed = 0;
  bool drop_last = false;                  // drop the last, short batch of an epoch
  int num_workers = 0;                     // 0: batches are made on the calling thread
  int prefetch_factor = 2;                 // batches in flight per worker, ahead of the consumer
  std::shared_ptr<const Sampler> sampler;  // overrides shuffle; map-style datasets only
  // Builds a batch from its examples. Default: the dataset's get_batch (stacks each field).
  std::function<Example(const std::vector<Example>&)> collate;
};

// Where a loader stands: the epoch, and how many of its batches the caller has received.
// Batches prefetched but not yet handed out do not count (Note [Stateless samplers]).
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  std::string to_json() const;                             // {"epoch":E,"batch":B}
  static LoaderPosition from_json(std::string_view json);  // ValueError for anything else
  bool operator==(const LoaderPosition&) const = default;
};

// Note [Loader epochs]: the loader is a cursor over epoch after epoch. next() hands out the
// batches of the current epoch, in order even with workers; at the epoch's end it returns
// nullopt once and the position becomes (epoch + 1, 0). A range-for runs next() to that end,
// so each loop is one epoch. A loop left early keeps its place: the next loop (or a loader
// restored with set_position) continues with the first batch the caller has not received.
// A worker's exception is rethrown by next() at that batch, whose position it keeps.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  // Iterable datasets: no sampler or shuffle (ValueError); workers > 0 means one background
  // thread reads the stream ahead (Note [Dataset threads]).
  DataLoader(std::shared_ptr<IterableDataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch of a map-style dataset; TypeError for an iterable one.
  int64_t size() const;
  std::optional<Example> next();
  LoaderPosition position() const { return pos_; }
  // Stops the workers and moves to `p`; the next next() returns batch p.batch of epoch p.epoch.
  // IndexError for a batch past the epoch's end (map-style) or a negative field.
  void set_position(LoaderPosition p);
  void set_epoch(int64_t epoch) { set_position({epoch, 0}); }

  class Iterator {
   public:
    Iterator() = default;
    explicit Iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    const Example& operator*() const { return *batch_; }
    const Example* operator->() const { return &*batch_; }
    Iterator& operator++() {
      batch_ = loader_->next();
      return *this;
    }
    bool operator==(const Iterator& o) const { return batch_.has_value() == o.batch_.has_value(); }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Example> batch_;
  };
  Iterator begin() { return Iterator(this); }
  Iterator end() { return Iterator(); }

 private:
  struct Run;  // one epoch's worker threads and prefetched batches
  Example make_batch(const std::vector<int64_t>& indices) const;
  std::optional<Example> next_iterable();

  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<IterableDataset> stream_;
  DataLoaderOptions options_;
  LoaderPosition pos_;
  std::unique_ptr<Run> run_;
};

}  // namespace kiln::data
