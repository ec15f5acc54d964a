// kiln._C's batch job spec writer and reader (kiln/batch.py): a step exported with
// compiler::export_step (See Note [Exported steps] in kiln/compiler/export.h) as program.proto's
// BatchJob, whose inputs name where each graph input comes from (See Note [Batch jobs] in
// worker/src/batch.h).
//
//   spec = _C._batch_job_bytes(lambda xs: [step(*xs)], [x, y], names, tensors, ["x", "y"], 0,
//                              "ckpt/init", "data.safetensors", 64, 1000, 0)
//   _C._batch_job_summary(spec)   # {"steps": 1000, "inputs": [("data", "x"), ...], "ops": {...}}
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "kiln/compiler/export.h"
#include "kiln/dist/dtensor.h"
#include "kiln/proto/codec.h"
#include "kiln/storage.h"
#include "kiln/tensor_impl.h"
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
// A DTensor entry is found by its local shard, which is what the step reads.
class StateIndex {
 public:
  StateIndex(const std::vector<std::string>& names, const TensorVec& tensors) : names_(names) {
    for (size_t k = 0; k < tensors.size(); ++k) {
      const Tensor& t =
          dist::is_dtensor(tensors[k]) ? dist::detail::local_of(tensors[k]) : tensors[k];
      locals_.push_back(t);
      by_impl_.emplace(t.impl(), k);
      by_storage_.emplace(t.impl()->storage().get(), k);
    }
  }
  // The index of `t` in the state, or -1.
  int find(const Tensor& t) const {
    if (auto it = by_impl_.find(t.impl()); it != by_impl_.end())
      return static_cast<int>(it->second);
    auto [lo, hi] = by_storage_.equal_range(t.impl()->storage().get());
    for (auto it = lo; it != hi; ++it) {
      const Tensor& s = locals_[it->second];
      if (s.sizes() == t.sizes() && s.strides() == t.strides() &&
          s.storage_offset() == t.storage_offset() && s.dtype() == t.dtype() &&
          s.device() == t.device())
        return static_cast<int>(it->second);
    }
    return -1;
  }
  const std::string& name(int k) const { return names_[k]; }

 private:
  const std::vector<std::string>& names_;
  TensorVec locals_;
  std::unordered_map<const TensorImpl*, size_t> by_impl_;  // the first entry of each
  std::unordered_multimap<const Storage*, size_t> by_storage_;
};

// Where a DTensor state entry lies on the job's mesh (Note [Batch jobs on a mesh]).
void describe_dtensor(const Tensor& t, const std::string& name,
                      const std::vector<std::string>& mesh_names, proto::BatchInput* in) {
  const dist::DTensorSpec& spec = dist::detail::spec_of(t);
  KILN_CHECK(!mesh_names.empty(), Value, "kiln.batch.save_job: state '", name,
             "' is a DTensor; pass the step's device mesh as `mesh`");
  for (size_t d = 0; d < spec.mesh.dim_names().size(); ++d) {
    const std::string& dim = spec.mesh.dim_names()[d];
    KILN_CHECK(std::find(mesh_names.begin(), mesh_names.end(), dim) != mesh_names.end() &&
                   spec.mesh.root_dims()[d].size() == 1,
               Value, "kiln.batch.save_job: state '", name, "' lies on ", spec.mesh.str(),
               ", which is not a sub-mesh of the job's mesh by dim names");
    in->add_mesh_dims(dim);
  }
  for (const dist::Placement& p : spec.placements) {
    KILN_CHECK(p.kind != dist::Placement::Kind::Partial, Value, "kiln.batch.save_job: state '",
               name, "' is Partial (", p.str(), "); a state tensor must be Shard or Replicate");
    proto::PlacementSpec* e = in->add_placements();
    e->set_kind(static_cast<int32_t>(p.kind));
    e->set_dim(p.dim);
  }
  for (int64_t d : spec.shape) in->add_shape(d);
}

nb::bytes batch_job_bytes(nb::handle fn, nb::handle args,
                          const std::vector<std::string>& state_names, nb::handle state_tensors,
                          const std::vector<std::string>& data_names, int loss_index,
                          const std::string& init_checkpoint, const std::string& data_path,
                          int64_t batch_size, int64_t steps, uint64_t seed,
                          const std::vector<std::string>& mesh_names,
                          const std::vector<int64_t>& mesh_shape,
                          const std::map<std::string, std::string>& groups, int64_t world_size) {
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
    const int k = index.find(s.captured[i]);
    KILN_CHECK(k >= 0, Value, what, ": the step reads a tensor that is not in `state`: ",
               ir::spec_str(s.graph.value(inputs[i]).meta),
               " (a parameter, buffer or optimizer state missing from `state`, or a tensor made "
               "outside the step); every tensor the step reads must be in `state` or `data`");
    std::string name = index.name(k);
    if (dist::is_dtensor(state[k])) describe_dtensor(state[k], name, mesh_names, in);
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
  KILN_CHECK(mesh_names.size() == mesh_shape.size(), Value, what, ": ", mesh_names.size(),
             " mesh dim names for ", mesh_shape.size(), " sizes");
  *job.mutable_step() = proto::encode_graph(s.graph);
  // This rank's group names differ from other ranks': name them by mesh dim (Note [Batch jobs on
  // a mesh]).
  if (!mesh_names.empty())
    proto::rename_collective_groups(
        *job.mutable_step(), [&](const std::string& op, const std::string& group) {
          auto it = groups.find(group);
          KILN_CHECK(it != groups.end(), Value, "kiln.batch.save_job: the step's '", op,
                     "' runs over group '", group,
                     "', which is the group of no single dim of `mesh`; a step on a mesh may use "
                     "its dims' groups only");
          return "@" + it->second;
        });
  for (size_t d = 0; d < mesh_names.size(); ++d) {
    job.add_mesh_names(mesh_names[d]);
    job.add_mesh_shape(mesh_shape[d]);
  }
  job.set_loss(loss_index < 0 ? -1 : s.outputs[loss_index]);
  job.set_init_checkpoint(init_checkpoint);
  job.set_data(data_path);
  job.set_batch_size(batch_size);
  job.set_steps(steps);
  job.set_world_size(world_size);
  job.set_seed(seed);
  job.set_rng_seed(s.rng_seed);
  job.set_rng_offset(s.rng_offset);
  job.set_rng_count(s.rng_count);
  std::string bytes = job.SerializeAsString();
  return nb::bytes(bytes.data(), bytes.size());
}

// One spec from the specs every rank of a mesh captured, in rank order (Note [Batch jobs on a
// mesh]): the first when all are the same, else the first with every distinct step in programs.
nb::bytes batch_job_merge(const std::vector<nb::bytes>& specs) {
  KILN_CHECK(!specs.empty(), Value, "kiln.batch.save_job: no ranks' specs to merge");
  std::vector<proto::BatchJob> jobs(specs.size());
  for (size_t r = 0; r < specs.size(); ++r)
    KILN_CHECK(jobs[r].ParseFromArray(specs[r].c_str(), static_cast<int>(specs[r].size())), Value,
               "kiln.batch.save_job: rank ", r, "'s spec does not parse");
  auto rest = [](proto::BatchJob j) {  // everything but the rank's program
    j.clear_step();
    j.clear_inputs();
    j.clear_loss();
    return j.SerializeAsString();
  };
  const std::string common = rest(jobs[0]);
  bool same = true;
  for (size_t r = 1; r < jobs.size(); ++r) {
    KILN_CHECK(rest(jobs[r]) == common, Value, "kiln.batch.save_job: rank ", r,
               " captured the step with other settings than rank 0 (data, sizes, seeds, random "
               "counters or mesh)");
    same = same && std::string_view(specs[r].c_str(), specs[r].size()) ==
                       std::string_view(specs[0].c_str(), specs[0].size());
  }
  if (same) return specs[0];
  proto::BatchJob out = jobs[0];
  std::vector<std::string> seen;
  for (const proto::BatchJob& j : jobs) {
    proto::BatchProgram p;
    *p.mutable_step() = j.step();
    *p.mutable_inputs() = j.inputs();
    p.set_loss(j.loss());
    std::string bytes = p.SerializeAsString();
    auto it = std::find(seen.begin(), seen.end(), bytes);
    if (it == seen.end()) {
      seen.push_back(std::move(bytes));
      *out.add_programs() = std::move(p);
      it = seen.end() - 1;
    }
    out.add_program_of_rank(static_cast<int32_t>(it - seen.begin()));
  }
  std::string bytes = out.SerializeAsString();
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
  nb::list mesh;
  for (int k = 0; k < job.mesh_names_size() && k < job.mesh_shape_size(); ++k)
    mesh.append(nb::make_tuple(job.mesh_names(k), job.mesh_shape(k)));
  d["mesh"] = mesh;
  d["programs"] = std::max(1, job.programs_size());
  return d;
}

}  // namespace

void bind_batch(nb::module_& m) {
  m.def("_batch_job_bytes", &batch_job_bytes);
  m.def("_batch_job_summary", &batch_job_summary);
  m.def("_batch_job_merge", &batch_job_merge);
}

}  // namespace kiln::python
