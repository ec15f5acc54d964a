// kiln/dist/tensor_parallel.h: tensor parallelism for the C++ nn::Module (PyTorch's
// torch.distributed.tensor.parallel): parallelize_module with ColwiseParallel, RowwiseParallel
// and SequenceParallel, and the vocab-parallel cross entropy of loss_parallel.
//
//   auto tp = kiln::dist::init_device_mesh("cpu", {2});
//   TensorParallel par = parallelize_module(*mlp, tp, {{"fc1", ColwiseParallel()},
//                                                      {"fc2", RowwiseParallel()}});
//   mlp->fc1->weight;                             // a DTensor, Shard(0)
//   // Mlp::forward calls its children through the plan (See Note [C++ tensor parallel]):
//   Tensor h = par.forward("fc1", x);             // x: plain, the same on every rank
//   Tensor y = par.forward("fc2", kiln::relu(h)); // plain, the same on every rank
//   Tensor loss = vocab_parallel_cross_entropy(logits, target);  // logits: DTensor, Shard(-1)
//
// Note [C++ tensor parallel]: a style does what the Python styles do (Note [Tensor parallel
// styles] in kiln/distributed/tensor/parallel/style.py): it replaces the module's parameters by
// DTensors (in their slots, Note [Parameter slots]) and converts the module's input and output.
// The C++ nn::Module has no forward hooks: a parent calls its children's virtual forward
// directly (`fc1->forward(x)`), so nothing can run around that call. The conversions are
// therefore explicit: TensorParallel::forward(name, x) is prepare_input, the child's forward,
// prepare_output; a model's forward calls it where it called the child. parallelize_module
// itself needs no change to the model.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dist/dtensor.h"
#include "kiln/nn/module.h"

namespace kiln::dist {

struct ParallelStyle {
  enum class Kind : uint8_t { Colwise, Rowwise, Sequence };
  Kind kind = Kind::Colwise;
  std::optional<Placement> input_layout;   // nullopt: the style's default for the module
  std::optional<Placement> output_layout;  // nullopt: the style's default
  bool use_local_output = true;
  int64_t sequence_dim = 1;  // Sequence
  std::string name() const;  // "ColwiseParallel"
};

// nn::Linear: weight and bias Shard(0); nn::Embedding: weight Shard(1). Input default
// Replicate(), output default Shard(-1).
ParallelStyle ColwiseParallel(std::optional<Placement> input_layouts = std::nullopt,
                              std::optional<Placement> output_layouts = std::nullopt,
                              bool use_local_output = true);
// nn::Linear: weight Shard(1), bias Replicate(), input default Shard(-1); nn::Embedding: weight
// Shard(0) (the vocabulary), input default Replicate(). Output default Replicate() (the partial
// sums all-reduced).
ParallelStyle RowwiseParallel(std::optional<Placement> input_layouts = std::nullopt,
                              std::optional<Placement> output_layouts = std::nullopt,
                              bool use_local_output = true);
// nn::LayerNorm, nn::RMSNorm, nn::Dropout: parameters Replicate(), input and output
// Shard(sequence_dim).
ParallelStyle SequenceParallel(int64_t sequence_dim = 1, bool use_local_output = false);

// One parallelized submodule: its style as applied, and the conversions around its forward.
class ParallelModule {
 public:
  // input_features: the global size of the input's last dim where the module tells it (a
  // RowwiseParallel Linear's in_features), so uneven shards of it need no communication.
  ParallelModule(nn::ModulePtr module, DeviceMesh mesh, ParallelStyle style, Placement input,
                 Placement desired_input, Placement output,
                 std::optional<int64_t> input_features = std::nullopt);
  nn::Module& module() const { return *module_; }
  const ParallelStyle& style() const { return style_; }
  // A plain tensor becomes a DTensor with the input layout (this rank's piece; even shards
  // assumed unless input_features gives the global size); then it is redistributed to the
  // layout the module's ops want.
  Tensor prepare_input(const Tensor& x) const;
  // The output redistributed to the output layout; its local shard with use_local_output.
  Tensor prepare_output(const Tensor& y) const;
  Tensor forward(const Tensor& x) const {
    return prepare_output(module_->forward(prepare_input(x)));
  }

 private:
  nn::ModulePtr module_;
  DeviceMesh mesh_;
  ParallelStyle style_;
  Placement input_, desired_input_, output_;
  std::optional<int64_t> input_features_;
};

// What parallelize_module did, by dotted submodule name.
class TensorParallel {
 public:
  // IndexError naming `name` when parallelize_module did not parallelize it.
  const ParallelModule& operator[](std::string_view name) const;
  Tensor forward(std::string_view name, const Tensor& x) const { return (*this)[name].forward(x); }
  const std::vector<std::pair<std::string, ParallelModule>>& modules() const { return modules_; }

 private:
  friend TensorParallel parallelize_module(
      nn::Module&, const DeviceMesh&, const std::vector<std::pair<std::string, ParallelStyle>>&,
      std::optional<int>);
  std::vector<std::pair<std::string, ParallelModule>> modules_;
};

using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Applies each style of `plan` to the submodules its key names: a dotted path whose parts may be
// fnmatch patterns ("blocks.*.fc"); "" is `module` itself. `mesh` must be 1-d. Every key is
// resolved and every module type checked before anything changes: a key naming no submodule is a
// ValueError naming the key, a style on a type it does not support a NotImplementedError, a
// parameter that is already a DTensor a ValueError. With src_data_rank, that mesh rank's values
// are broadcast before sharding; std::nullopt shards each rank's own (equal) values.
TensorParallel parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                                  const ParallelizePlan& plan,
                                  std::optional<int> src_data_rank = 0);

// loss_parallel's cross entropy (Note [Vocab-parallel cross entropy] in
// kiln/distributed/tensor/parallel/loss.py): `logits` an (N, C) or (C,) DTensor sharded on the
// class dim along one mesh dim and replicated along the others; `target` class indices (plain,
// or a Replicate() DTensor) of shape (N,) or (); `weight` optional (C,) class weights (plain).
// The logits are never gathered: two all-reduces of O(N) values. The loss is a Replicate()
// DTensor; the logits' gradient has the logits' placements. reduction "mean", "sum" or "none";
// label_smoothing with weights is NotImplementedError.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target,
                                    const Tensor& weight = Tensor(),
                                    std::string_view reduction = "mean",
                                    int64_t ignore_index = -100, double label_smoothing = 0.0);

}  // namespace kiln::dist
