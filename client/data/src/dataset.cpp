// kiln::data datasets: collation by stacking, TensorDataset.
#include "kiln/data/dataset.h"

#include "kiln/kiln.h"

namespace kiln::data {

Example collate_stack(const std::vector<Example>& examples) {
  KILN_CHECK(!examples.empty(), Value, "collate_stack: expected at least one example");
  const size_t fields = examples[0].size();
  Example out;
  out.reserve(fields);
  std::vector<Tensor> column(examples.size());
  for (size_t f = 0; f < fields; ++f) {
    for (size_t i = 0; i < examples.size(); ++i) {
      KILN_CHECK(examples[i].size() == fields, Value, "collate_stack: example 0 has ", fields,
                 " fields but example ", i, " has ", examples[i].size());
      column[i] = examples[i][f];
    }
    out.push_back(stack(column, 0));
  }
  return out;
}

Example Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (int64_t i : indices) examples.push_back(get(i));
  return collate_stack(examples);
}

TensorDataset::TensorDataset(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
  KILN_CHECK(!tensors_.empty(), Value, "TensorDataset: expected at least one tensor");
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensors_[i].check_defined("TensorDataset tensor");
    KILN_CHECK(tensors_[i].dim() >= 1, Value, "TensorDataset: tensor ", i,
               " is 0-dim; every tensor needs a dim 0 to index examples along");
    KILN_CHECK(tensors_[i].size(0) == tensors_[0].size(0), Value,
               "TensorDataset: size mismatch between tensors: tensor 0 has shape ",
               tensors_[0].sizes(), " but tensor ", i, " has shape ", tensors_[i].sizes());
  }
  size_ = tensors_[0].size(0);
}

Example TensorDataset::get(int64_t index) const {
  KILN_CHECK(index >= -size_ && index < size_, Index, "TensorDataset: index ", index,
             " is out of range for a dataset of size ", size_);
  Example out;
  out.reserve(tensors_.size());
  for (const Tensor& t : tensors_) out.push_back(t.select(0, index));
  return out;
}

Example TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t i : indices)
    KILN_CHECK(i >= 0 && i < size_, Index, "TensorDataset: index ", i,
               " is out of range for a dataset of size ", size_);
  Tensor index = empty_on({static_cast<int64_t>(indices.size())}, kInt64, kCPU);
  std::copy(indices.begin(), indices.end(), index.data_ptr<int64_t>());
  Example out;
  out.reserve(tensors_.size());
  for (const Tensor& t : tensors_) {
    Tensor idx = t.device() == index.device() ? index : index.to(std::nullopt, t.device());
    out.push_back(index_select(t, 0, idx));
  }
  return out;
}

}  // namespace kiln::data
