// kiln._C's batch job spec writer and reader (kiln/batch.py): a step exported with
// compiler::export_step (See Note [Exported steps] in kiln/compiler/export.h) as program.proto's
// BatchJob, whose inputs name where each graph input comes from (See Note [Batch jobs] in
// worker/src/batch.h).
//
//   spec = _C._batch_job_bytes(lambda xs: [step(*xs)], [x, y], names, tensors, ["x", "y"], 0,
//                              "ckpt/init", "data.safetensors", 64, 1000, 0)
//   _C._batch_job_summary(spec)   # {"steps": 1000, "inputs": [("data", "x"), ...], "ops": {...}}
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <unordered_map>

#include "kiln/compiler/export.h"
#include "kiln/storage.h"
#include "kiln/tensor_impl.h"
#include "kiln/proto/codec.h"
#include "python_args.h"

namespace kiln::python {
namespace {

using TensorVec = std::vector<Tensor>;

// fn(list of tensors) -> list of tensors (See call_captured in python_args.h).
compiler::Fn as_step_fn(nb::handle fn) {
  return [fn](const TensorVec& xs) -> TensorVec {
    return call_captured(fn, xs, "kiln.batch.save_job: the step's outputs");
  };
}

// Finds the state entry a captured tensor is: the same TensorImpl, or else a tensor with the same
// storage, geometry and dtype (a module's state_dict() holds detached aliases of its parameters).
class StateIndex {
 public:
  StateIndex(const std::vector<std::string>& names, const TensorVec& tensors) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      by_impl_.emplace(tensors[k].impl(), k);
      by_storage_.emplace(tensors[k].impl()->storage().get(), k);
    }
    names_ = &names;
    tensors_ = &tensors;
  }
  // The name of `t` in the state, or "".
  std::string find(const Tensor& t) const {
    if (auto it = by_impl_.find(t.impl()); it != by_impl_.end()) return (*names_)[it->second];
    auto [lo, hi] = by_storage_.equal_range(t.impl()->storage().get());
    for (auto it = lo; it != hi; ++it) {
      const Tensor& s = (*tensors_)[it->second];
      if (s.sizes() == t.sizes() && s.strides() == t.strides() &&
          s.storage_offset() == t.storage_offset() && s.dtype() == t.dtype() &&
          s.device() == t.device())
        return (*names_)[it->second];
    }
    return "";
  }

 private:
  std::unordered_map<const TensorImpl*, size_t> by_impl_;  // the first entry of each
  std::unordered_multimap<const Storage*, size_t> by_storage_;
  const std::vector<std::string>* names_ = nullptr;
  const TensorVec* tensors_ = nullptr;
};

nb::bytes batch_job_bytes(nb::handle fn, nb::handle args,
                          const std::vector<std::string>& state_names, nb::handle state_tensors,
                          const std::vector<std::string>& data_names, int loss_index,
                          const std::string& init_checkpoint, const std::string& data_path,
                          int64_t batch_size, int64_t steps, uint64_t seed) {
  const char* what = "kiln.batch.save_job";
  TensorVec arg_tensors = tensors_of(args, what), state = tensors_of(state_tensors, what);
  KILN_CHECK(state.size() == state_names.size(), Value, what, ": ", state_names.size(),
             " state names for ", state.size(), " tensors");
  KILN_CHECK(data_names.size() == arg_tensors.size(), Value, what, ": ", data_names.size(),
             " data names for ", arg_tensors.size(), " data tensors");
  KILN_CHECK(batch_size > 0 && steps > 0, Value, what, ": batch_size (", batch_size,
             ") and steps (", steps, ") must be positive");
  compiler::ExportedStep s = compiler::export_step(as_step_fn(fn), arg_tensors);
  KILN_CHECK(loss_index >= -1 && loss_index < static_cast<int>(s.outputs.size()), Value, what,
             ": loss index ", loss_index, " of a step with ", s.outputs.size(), " outputs");

  proto::BatchJob job;
  const StateIndex index(state_names, state);
  const auto& inputs = s.graph.inputs();
  std::unordered_map<const Storage*, std::string> storages;  // of the state inputs
  for (size_t i = 0; i < inputs.size(); ++i) {
    proto::BatchInput* in = job.add_inputs();
    if (s.arg_of_input[i] >= 0) {
      in->set_data(data_names[s.arg_of_input[i]]);
      continue;
    }
    if (compiler::constant_input(s.graph, i).defined()) continue;  // neither: a wrapped number
    std::string name = index.find(s.captured[i]);
    KILN_CHECK(!name.empty(), Value, what, ": the step reads a tensor that is not in `state`: ",
               ir::spec_str(s.graph.value(inputs[i]).meta),
               " (a parameter, buffer or optimizer state missing from `state`, or a tensor made "
               "outside the step); every tensor the step reads must be in `state` or `data`");
    // The workers make each state tensor on its own (empty_strided of its spec, offset 0): a
    // view into a larger tensor, or two inputs on one storage, would replay differently.
    const Tensor& t = s.captured[i];
    KILN_CHECK(t.storage_offset() == 0, Value, what, ": state '", name, "' (",
               ir::spec_str(s.graph.value(inputs[i]).meta), ") is a view at offset ",
               t.storage_offset(),
               " into a larger tensor; a batch job's state tensors must own "
               "their memory (clone it)");
    auto [seen, fresh] = storages.emplace(t.impl()->storage().get(), name);
    KILN_CHECK(fresh, Value, what, ": state '", name, "' and state '", seen->second,
               "' share memory; a batch job's state tensors must own their memory (clone one)");
    in->set_state(std::move(name));
  }
  *job.mutable_step() = proto::encode_graph(s.graph);
  job.set_loss(loss_index < 0 ? -1 : s.outputs[loss_index]);
  job.set_init_checkpoint(init_checkpoint);
  job.set_data(data_path);
  job.set_batch_size(batch_size);
  job.set_steps(steps);
  job.set_seed(seed);
  job.set_rng_seed(s.rng_seed);
  job.set_rng_offset(s.rng_offset);
  job.set_rng_count(s.rng_count);
  std::string bytes = job.SerializeAsString();
  return nb::bytes(bytes.data(), bytes.size());
}

nb::dict batch_job_summary(nb::bytes spec) {
  proto::BatchJob job;
  KILN_CHECK(job.ParseFromArray(spec.c_str(), static_cast<int>(spec.size())), Value,
             "kiln.batch.load_job: the file is not a BatchJob spec");
  nb::list inputs;
  for (const proto::BatchInput& in : job.inputs()) {
    if (in.has_state())
      inputs.append(nb::make_tuple("state", in.state()));
    else if (in.has_data())
      inputs.append(nb::make_tuple("data", in.data()));
    else
      inputs.append(nb::make_tuple("constant", nb::none()));
  }
  nb::dict ops;
  for (const proto::Instruction& n : job.step().nodes()) {
    nb::str op(n.op().c_str(), n.op().size());
    ops[op] = nb::cast<int64_t>(ops.get(op, nb::int_(0))) + 1;
  }
  nb::dict d;
  d["steps"] = job.steps();
  d["batch_size"] = job.batch_size();
  d["seed"] = job.seed();
  d["rng_count"] = job.rng_count();
  d["loss"] = job.loss();
  d["init_checkpoint"] = job.init_checkpoint();
  d["data"] = job.data();
  d["inputs"] = inputs;
  d["nodes"] = job.step().nodes_size();
  d["ops"] = ops;
  d["outputs"] = job.step().outputs_size();
  return d;
}

}  // namespace

void bind_batch(nb::module_& m) {
  m.def("_batch_job_bytes", &batch_job_bytes);
  m.def("_batch_job_summary", &batch_job_summary);
}

}  // namespace kiln::python
