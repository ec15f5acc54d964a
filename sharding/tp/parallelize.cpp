// parallelize_module and the parallel styles for the C++ nn::Module (Note [C++ tensor parallel]).
#include <fnmatch.h>

#include <tuple>

#include "kiln/dist/tensor_parallel.h"
#include "kiln/kiln.h"
#include "kiln/nn/layers.h"

namespace kiln::dist {

std::string ParallelStyle::name() const {
  switch (kind) {
    case Kind::Colwise:
      return "ColwiseParallel";
    case Kind::Rowwise:
      return "RowwiseParallel";
    case Kind::Sequence:
      return "SequenceParallel";
  }
  return "ParallelStyle";
}

ParallelStyle ColwiseParallel(std::optional<Placement> input_layouts,
                              std::optional<Placement> output_layouts, bool use_local_output) {
  return {ParallelStyle::Kind::Colwise, input_layouts, output_layouts, use_local_output, 1};
}

ParallelStyle RowwiseParallel(std::optional<Placement> input_layouts,
                              std::optional<Placement> output_layouts, bool use_local_output) {
  return {ParallelStyle::Kind::Rowwise, input_layouts, output_layouts, use_local_output, 1};
}

ParallelStyle SequenceParallel(int64_t sequence_dim, bool use_local_output) {
  return {ParallelStyle::Kind::Sequence, std::nullopt, std::nullopt, use_local_output,
          sequence_dim};
}

namespace {

// Placements hold non-negative dims.
Placement normalized(Placement p, int64_t ndim) {
  if (p.is_shard() && p.dim < 0) p.dim += ndim;
  return p;
}

Tensor place(const Tensor& x, const DeviceMesh& mesh, const Placement& layout) {
  const Placement want = normalized(layout, x.dim());
  DTensor d(x);
  if (d.placements() == Placements{want}) return x;
  return d.redistribute(mesh, {want});
}

bool is_linear(const nn::Module& m) { return dynamic_cast<const nn::Linear*>(&m) != nullptr; }
bool is_embedding(const nn::Module& m) { return dynamic_cast<const nn::Embedding*>(&m) != nullptr; }
bool is_positionwise(const nn::Module& m) {
  return dynamic_cast<const nn::LayerNorm*>(&m) || dynamic_cast<const nn::RMSNorm*>(&m) ||
         dynamic_cast<const nn::Dropout*>(&m);
}

void check_module(const ParallelStyle& s, const nn::Module& m, const std::string& where) {
  if (s.kind == ParallelStyle::Kind::Sequence) {
    KILN_CHECK(is_positionwise(m), NotImplemented, "parallelize_module: SequenceParallel on '",
               where,
               "': SequenceParallel supports nn::LayerNorm, nn::RMSNorm and nn::Dropout "
               "(modules that act on each position alone), got ",
               m.type_name());
    return;
  }
  KILN_CHECK(is_linear(m) || is_embedding(m), NotImplemented, "parallelize_module: ", s.name(),
             " on '", where, "': ", s.name(), " supports nn::Linear and nn::Embedding only, got ",
             m.type_name());
}

// Replaces parameter `name` of `m` (when defined) by a DTensor placed by `p` (Note [C++ tensor
// parallel]).
void shard_param(nn::Module& m, const std::string& where, const std::string& name,
                 const DeviceMesh& mesh, Placement p, std::optional<int> src) {
  Tensor& slot = m.param(name);
  if (!slot.defined()) return;
  KILN_CHECK(!is_dtensor(slot), Value, "parallelize_module: ", where, ".", name,
             " is already a DTensor; a module can be parallelized once");
  Tensor full = slot.detach();
  if (src && !mesh.device_type().starts_with("remote")) {  // a gang's: one value already
    full = full.contiguous().clone();
    mesh.group(0)->broadcast(full, *src)->wait();
  }
  const bool grad = slot.requires_grad();
  Tensor d = distribute_tensor(full, mesh, {p});
  if (grad) d.requires_grad_();
  slot = d;
}

// The (dotted name, module) pairs `path` names under `m` (See parallelize_module).
void targets(const nn::ModulePtr& m, const std::string& path, const std::string& where,
             std::vector<std::pair<std::string, nn::ModulePtr>>& out) {
  if (path.empty()) {
    out.emplace_back(where, m);
    return;
  }
  const size_t dot = path.find('.');
  const std::string atom = path.substr(0, dot);
  const std::string rest = dot == std::string::npos ? "" : path.substr(dot + 1);
  KILN_CHECK(!atom.empty() && (dot == std::string::npos || !rest.empty()), Value,
             "parallelize_module: the plan key '", where.empty() ? "" : where + ".", path,
             "' has an empty part");
  bool any = false;
  std::string kids;
  for (const auto& [name, child] : m->named_children()) {
    kids += (kids.empty() ? "" : ", ") + name;
    if (fnmatch(atom.c_str(), name.c_str(), 0) != 0) continue;
    any = true;
    targets(child, rest, where.empty() ? name : where + "." + name, out);
  }
  KILN_CHECK(any, Value, "parallelize_module: the plan names a missing submodule: ", m->type_name(),
             " at '", where.empty() ? "<root>" : where, "' has no child matching '", atom,
             "' (its children: [", kids, "])");
}

}  // namespace

ParallelModule::ParallelModule(nn::ModulePtr module, DeviceMesh mesh, ParallelStyle style,
                               Placement input, Placement desired_input, Placement output,
                               std::optional<int64_t> input_features)
    : module_(std::move(module)),
      mesh_(std::move(mesh)),
      style_(std::move(style)),
      input_(input),
      desired_input_(desired_input),
      output_(output),
      input_features_(input_features) {}

Tensor ParallelModule::prepare_input(const Tensor& x) const {
  Tensor d = x;
  if (!is_dtensor(x)) {
    std::optional<DimVector> shape;
    if (input_features_ && x.dim() > 0 && normalized(input_, x.dim()).is_shard(x.dim() - 1)) {
      shape = DimVector(x.sizes());
      shape->back() = *input_features_;
    }
    d = DTensor::from_local(x, mesh_, {input_}, shape);
  }
  return style_.kind == ParallelStyle::Kind::Sequence ? d : place(d, mesh_, desired_input_);
}

Tensor ParallelModule::prepare_output(const Tensor& y) const {
  KILN_CHECK(is_dtensor(y), Type, style_.name(), "(", module_->type_name(),
             "): expected the module's output to be a DTensor");
  Tensor out = place(y, mesh_, output_);
  return style_.use_local_output ? DTensor(out).to_local() : out;
}

const ParallelModule& TensorParallel::operator[](std::string_view name) const {
  for (const auto& [n, m] : modules_)
    if (n == name) return m;
  KILN_FAIL(Index, "TensorParallel: '", name, "' was not parallelized by parallelize_module");
}

TensorParallel parallelize_module(nn::Module& module, const DeviceMesh& mesh,
                                  const ParallelizePlan& plan, std::optional<int> src_data_rank) {
  KILN_CHECK(mesh.ndim() == 1, Value, "parallelize_module: expected a 1-d DeviceMesh, got ",
             mesh.str(), "; pass the tensor-parallel dim (mesh[\"tp\"])");
  KILN_CHECK(!src_data_rank || (*src_data_rank >= 0 && *src_data_rank < mesh.size()), Value,
             "parallelize_module: src_data_rank ", src_data_rank.value_or(-1),
             " is not a rank of a mesh of size ", mesh.size());
  // Resolve every key and check every type before changing anything.
  nn::ModulePtr root = module.weak_from_this().lock();
  KILN_CHECK(root != nullptr, Value,
             "parallelize_module: the module must be owned by a std::shared_ptr (make_shared)");
  std::vector<std::tuple<std::string, nn::ModulePtr, ParallelStyle>> work;
  for (const auto& [path, style] : plan) {
    std::vector<std::pair<std::string, nn::ModulePtr>> found;
    targets(root, path, "", found);
    for (auto& [name, m] : found) {
      check_module(style, *m, name.empty() ? "<root>" : name);
      work.emplace_back(name, m, style);
    }
  }
  TensorParallel out;
  for (auto& [name, m, style] : work) {
    const std::string where = name.empty() ? "<root>" : name;
    Placement in = Replicate(), want = Replicate(), result = Shard(-1);
    switch (style.kind) {
      case ParallelStyle::Kind::Colwise:
        if (is_linear(*m)) {
          shard_param(*m, where, "weight", mesh, Shard(0), src_data_rank);
          shard_param(*m, where, "bias", mesh, Shard(0), src_data_rank);
        } else {
          shard_param(*m, where, "weight", mesh, Shard(1), src_data_rank);
        }
        break;
      case ParallelStyle::Kind::Rowwise:
        result = Replicate();
        if (is_linear(*m)) {
          shard_param(*m, where, "weight", mesh, Shard(1), src_data_rank);
          shard_param(*m, where, "bias", mesh, Replicate(), src_data_rank);
          in = want = Shard(-1);
        } else {
          shard_param(*m, where, "weight", mesh, Shard(0), src_data_rank);
        }
        break;
      case ParallelStyle::Kind::Sequence:
        for (auto& [pname, p] : m->named_parameters(false))
          shard_param(*m, where, pname, mesh, Replicate(), src_data_rank);
        in = want = result = Shard(style.sequence_dim);
        break;
    }
    if (style.input_layout) in = *style.input_layout;
    if (style.output_layout) result = *style.output_layout;
    std::optional<int64_t> features;
    if (style.kind == ParallelStyle::Kind::Rowwise && is_linear(*m))
      features = dynamic_cast<nn::Linear&>(*m).in_features;
    out.modules_.emplace_back(name, ParallelModule(m, mesh, style, in, want, result, features));
  }
  return out;
}

}  // namespace kiln::dist
