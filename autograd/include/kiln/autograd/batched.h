// kiln/autograd/batched.h: BatchedTensor, the wrapper vmap hands to the function it maps, and
// the Batched dispatch key's kernels (one boxed kernel per batching rule of the op table).
//
//   Tensor x = kiln::randn({5, 3});                          // 5 examples of shape (3,)
//   Tensor w = kiln::autograd::make_batched(x, /*bdim=*/0, /*level=*/1);
//   w.sizes();                                               // [3]: the logical shape
//   kiln::autograd::batched_value(w);                        // x again
//   kiln::func::vmap_fallback_ops();                         // ops that used the slow loop
//
// Note [BatchedTensor]: a BatchedTensor is a storage-less TensorImpl (Note [Data-less tensors])
// whose key set is {Batched, the value's backend key} and whose backend handle holds
// (value, bdim, level). Its sizes and strides are the value's without bdim (the logical
// shape each example has); reading its data is a RuntimeError. It has no autograd state of its
// own: requires_grad() answers for the innermost value, requires_grad_() sets it there, and
// detach() detaches the value. The value may itself be a
// BatchedTensor of a lower level (vmap of vmap): levels nest with the highest outermost. A
// level is the depth of the vmap that made it (func::vmap pushes one per call).
//
// Note [Batching rules]: every op row names a rule (`batching` in tensor/ops/*.toml) and the
// Batched kernel of the row is the boxed kernel of that rule: it peels the wrappers of the
// highest level among the arguments (moving their bdim to the front with permute, which
// autograd records), rewrites the other arguments for the leading batch dim (dims shifted by
// one, sizes prefixed with B, broadcasting ranks padded after the batch dim), calls the op on
// the values from the top of the dispatcher (lower-level wrappers hit Batched again, plain
// tensors reach Autograd and the backends) and wraps the outputs at that level with bdim 0.
// Rule `fallback`, and any argument combination a rule does not handle, runs the op once per
// example and stacks the results (correct, slow; warned once per op on stderr and listed by
// func::vmap_fallback_ops()).
//
// Note [vmap and autograd]: Batched is above Autograd, so autograd only ever records plain
// tensors (the innermost values). func::grad/vjp make their leaves from those values and
// autograd::grad translates wrapper outputs, inputs and cotangents to them (and the gradients
// back): Note [Batched gradients] in batched.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::autograd {

// A BatchedTensor at `level` over `value`, whose examples run along value's dim `bdim`.
Tensor make_batched(const Tensor& value, int64_t bdim, int64_t level);
bool is_batched(const Tensor& t);
// The level of a BatchedTensor, 0 for any other tensor.
int64_t batched_level(const Tensor& t);
// The wrapped value and batch dim of a BatchedTensor (ValueError for other tensors).
const Tensor& batched_value(const Tensor& t);
int64_t batched_bdim(const Tensor& t);

// A tensor as the plain tensor at the bottom of its wrappers and, per level (ascending), the
// dim of that base tensor the level's examples run along. Plain tensors have no levels.
struct PhysicalView {
  Tensor base;
  std::vector<std::pair<int64_t, int64_t>> levels;  // (level, base dim), ascending levels
};
PhysicalView to_physical(const Tensor& t);
// The inverse: wraps `base` at each (level, base dim), lowest level innermost.
Tensor from_physical(const Tensor& base, const std::vector<std::pair<int64_t, int64_t>>& levels);

// The vmap levels running on this thread (innermost last) with their batch sizes.
struct VmapLevel {
  int64_t level;
  int64_t batch_size;
};
const std::vector<VmapLevel>& active_vmap_levels();
class VmapLevelGuard {
 public:
  explicit VmapLevelGuard(int64_t batch_size);  // pushes level depth+1
  ~VmapLevelGuard();
  int64_t level() const { return level_; }
  VmapLevelGuard(const VmapLevelGuard&) = delete;
  VmapLevelGuard& operator=(const VmapLevelGuard&) = delete;

 private:
  int64_t level_;
};

// `t` batched at every active vmap level it is not batched at yet (its value expanded along a
// new leading dim). func::grad/vjp do this to their primals so that each example gets its own
// gradient (Note [vmap and autograd]).
Tensor promote_to_active_levels(const Tensor& t);

}  // namespace kiln::autograd

namespace kiln::func {
// Names of the ops that ran the per-example loop (Note [Batching rules]) in this process.
std::vector<std::string> vmap_fallback_ops();
void clear_vmap_fallback_ops();  // for tests
}  // namespace kiln::func
