// kiln/data/dataset.h: map-style and iterable datasets (torch.utils.data's Dataset,
// IterableDataset, TensorDataset), the things a DataLoader batches.
//
//   auto ds = std::make_shared<kiln::data::TensorDataset>(std::vector<Tensor>{x, y});
//   kiln::data::Example e = ds->get(3);                 // {x[3], y[3]}
//   kiln::data::Example b = ds->get_batch({0, 5, 2});   // {x[[0,5,2]], y[[0,5,2]]}
//   int64_t n = ds->size();
//   kiln::data::Example s = kiln::data::collate_stack({e, e});   // {stack, stack}
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::data {

// One example (or one collated batch): its fields, e.g. {input, target}.
using Example = std::vector<Tensor>;

// Stacks field i of every example along a new dim 0. ValueError when the examples have different
// field counts (stack itself names mismatched shapes).
Example collate_stack(const std::vector<Example>& examples);

// A map-style dataset: `size()` examples addressed by index.
//
// Note [Dataset threads]: a DataLoader with workers calls get()/get_batch() from several threads
// at once, so they must not mutate shared state (read-only tensors and memory-mapped files are
// fine).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // The examples at `indices`, collated. Default: get() each and collate_stack; override it
  // where one gather is cheaper (TensorDataset does).
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
};

// A stream of examples with no random access (torch IterableDataset). Only one thread reads
// it at a time: a DataLoader with workers reads it from one background thread.
class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  virtual void reset() = 0;                   // back to the first example
  virtual std::optional<Example> next() = 0;  // nullopt at the end
};

// Examples are slices along dim 0 of equally long tensors (torch TensorDataset).
class TensorDataset : public Dataset {
 public:
  // ValueError for no tensors, a 0-dim tensor, or tensors whose size(0) differ.
  explicit TensorDataset(std::vector<Tensor> tensors);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;  // IndexError out of [-size, size)
  Example get_batch(const std::vector<int64_t>& indices) const override;  // one index_select
  const std::vector<Tensor>& tensors() const { return tensors_; }

 private:
  std::vector<Tensor> tensors_;
  int64_t size_;
};

}  // namespace kiln::data
