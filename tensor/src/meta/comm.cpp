// Meta functions of the collectives (tensor/ops/comm.toml): output shapes from the input and
// the group's size, without a group, so tracing and fake process groups see the same shapes and
// errors as a real group (Note [Functional collectives]).
#include <numeric>
#include <string>

#include "kiln/generated/meta/comm.h"
#include "kiln/generated/meta/creation.h"
#include "kiln/meta.h"

namespace kiln::meta {
namespace {

void check_reduce_op(const char* op, std::string_view reduce_op) {
  const bool known = reduce_op == "sum" || reduce_op == "avg" || reduce_op == "max" ||
                     reduce_op == "min" || reduce_op == "product";
  KILN_CHECK(known, Value, op, ": reduce_op must be 'sum', 'avg', 'max', 'min' or 'product', got '",
             reduce_op, "'");
}

void check_group(const char* op, std::string_view group) {
  KILN_CHECK(!group.empty(), Value, op, ": expected a group name, got ''");
}

void check_group_size(const char* op, int64_t group_size) {
  KILN_CHECK(group_size >= 1, Value, op, ": group_size must be >= 1, got ", group_size);
}

}  // namespace

TensorSpec all_reduce(const Tensor& self, std::string_view reduce_op, std::string_view group) {
  check_reduce_op("all_reduce", reduce_op);
  check_group("all_reduce", group);
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

// self: (N, ...) -> (group_size * N, ...); a 0-d input gives (group_size,).
TensorSpec all_gather_into_tensor(const Tensor& self, int64_t group_size, std::string_view group) {
  check_group_size("all_gather_into_tensor", group_size);
  check_group("all_gather_into_tensor", group);
  DimVector sizes(self.sizes());
  if (sizes.empty()) sizes.push_back(1);
  sizes[0] *= group_size;
  return contiguous_spec(sizes, self.dtype(), self.device());
}

// self: (group_size * N, ...) -> (N, ...).
TensorSpec reduce_scatter_tensor(const Tensor& self, std::string_view reduce_op, int64_t group_size,
                                 std::string_view group) {
  check_reduce_op("reduce_scatter_tensor", reduce_op);
  check_group_size("reduce_scatter_tensor", group_size);
  check_group("reduce_scatter_tensor", group);
  KILN_CHECK(self.dim() >= 1 && self.size(0) % group_size == 0, Value,
             "reduce_scatter_tensor: dim 0 of the input must be divisible by the group size ",
             group_size, ", got shape ", self.sizes());
  DimVector sizes(self.sizes());
  sizes[0] /= group_size;
  return contiguous_spec(sizes, self.dtype(), self.device());
}

TensorSpec broadcast(const Tensor& self, int64_t src, std::string_view group) {
  KILN_CHECK(src >= 0, Value, "broadcast: src must be a rank >= 0, got ", src);
  check_group("broadcast", group);
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

// self: (sum(input_split_sizes), ...) -> (sum(output_split_sizes), ...).
TensorSpec all_to_all_single(const Tensor& self, IntArrayRef output_split_sizes,
                             IntArrayRef input_split_sizes, std::string_view group) {
  const char* op = "all_to_all_single";
  check_group(op, group);
  KILN_CHECK(self.dim() >= 1, Value, op, ": expected an input with at least one dim, got shape ",
             self.sizes());
  KILN_CHECK(output_split_sizes.size() == input_split_sizes.size(), Value, op,
             ": output_split_sizes ", output_split_sizes, " and input_split_sizes ",
             input_split_sizes, " must have one entry per rank");
  DimVector sizes(self.sizes());
  if (input_split_sizes.empty()) return contiguous_spec(sizes, self.dtype(), self.device());
  for (size_t i = 0; i < input_split_sizes.size(); ++i)
    KILN_CHECK(input_split_sizes[i] >= 0 && output_split_sizes[i] >= 0, Value, op,
               ": split sizes must be >= 0, got ", input_split_sizes, " and ", output_split_sizes);
  const int64_t in_total =
      std::accumulate(input_split_sizes.begin(), input_split_sizes.end(), int64_t{0});
  KILN_CHECK(in_total == self.size(0), Value, op, ": input_split_sizes ", input_split_sizes,
             " must sum to dim 0 of the input, shape ", self.sizes());
  sizes[0] = std::accumulate(output_split_sizes.begin(), output_split_sizes.end(), int64_t{0});
  return contiguous_spec(sizes, self.dtype(), self.device());
}

TensorSpec wait_tensor(const Tensor& self) {
  return view_spec(self, self.sizes(), self.strides(), self.storage_offset());
}

}  // namespace kiln::meta
