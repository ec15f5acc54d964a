// CPU kernels of the functional collectives (tensor/ops/comm.toml, Note [Functional
// collectives]): each looks its group up by name, runs the collective into a new tensor and waits
// for it, so eager callers get finished values and wait_tensor is an alias. The meta function runs
// first, so argument errors read as they do on Meta.
#include "kiln/dist/process_group.h"
#include "kiln/generated/meta/comm.h"
#include "kiln/generated/ops/comm.h"
#include "kiln/kiln.h"

namespace kiln::dist {
namespace {

ProcessGroupPtr group_of(const char* op, std::string_view name, std::optional<int64_t> size = {}) {
  ProcessGroupPtr pg = find_group(name);
  KILN_CHECK(!size || *size == pg->size(), Value, op, ": group_size ", *size,
             " does not match group '", name, "' of size ", pg->size());
  return pg;
}

Tensor new_output(const TensorSpec& spec) { return empty(spec.sizes, spec.dtype, spec.device); }

Tensor all_reduce_cpu(const Tensor& self, std::string_view reduce_op, std::string_view group) {
  Tensor out = new_output(meta::all_reduce(self, reduce_op, group));
  auto pg = group_of("all_reduce", group);
  out.copy_(self);
  pg->all_reduce(out, parse_reduce_op(reduce_op))->wait();
  return out;
}

Tensor all_gather_cpu(const Tensor& self, int64_t group_size, std::string_view group) {
  Tensor out = new_output(meta::all_gather_into_tensor(self, group_size, group));
  auto pg = group_of("all_gather_into_tensor", group, group_size);
  pg->all_gather_into_tensor(out, self.contiguous())->wait();
  return out;
}

Tensor reduce_scatter_cpu(const Tensor& self, std::string_view reduce_op, int64_t group_size,
                          std::string_view group) {
  Tensor out = new_output(meta::reduce_scatter_tensor(self, reduce_op, group_size, group));
  auto pg = group_of("reduce_scatter_tensor", group, group_size);
  pg->reduce_scatter_tensor(out, self.contiguous(), parse_reduce_op(reduce_op))->wait();
  return out;
}

Tensor broadcast_cpu(const Tensor& self, int64_t src, std::string_view group) {
  Tensor out = new_output(meta::broadcast(self, src, group));
  auto pg = group_of("broadcast", group);
  out.copy_(self);
  pg->broadcast(out, static_cast<int>(src))->wait();
  return out;
}

Tensor all_to_all_cpu(const Tensor& self, IntArrayRef output_split_sizes,
                      IntArrayRef input_split_sizes, std::string_view group) {
  Tensor out =
      new_output(meta::all_to_all_single(self, output_split_sizes, input_split_sizes, group));
  auto pg = group_of("all_to_all_single", group);
  pg->all_to_all_single(out, self.contiguous(), output_split_sizes.vec(), input_split_sizes.vec())
      ->wait();
  return out;
}

}  // namespace

KILN_LIBRARY(CPU, m) {
  m.impl<ops::all_reduce>(all_reduce_cpu);
  m.impl<ops::all_gather_into_tensor>(all_gather_cpu);
  m.impl<ops::reduce_scatter_tensor>(reduce_scatter_cpu);
  m.impl<ops::broadcast>(broadcast_cpu);
  m.impl<ops::all_to_all_single>(all_to_all_cpu);
}

}  // namespace kiln::dist
