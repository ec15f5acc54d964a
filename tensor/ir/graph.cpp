// The graph IR: building (Note [Graph IR] in kiln/ir.h) and printing.
#include <sstream>

#include "ir_util.h"
#include "kiln/storage.h"
#include "kiln/tensor_impl.h"

namespace kiln::ir {

std::vector<ValueId> Node::inputs() const {
  std::vector<ValueId> ids;
  for (const NodeArg& a : args) ids.insert(ids.end(), a.values().begin(), a.values().end());
  return ids;
}

std::vector<IValue> Node::attributes() const {
  std::vector<IValue> out;
  for (const NodeArg& a : args)
    if (a.is_attribute()) out.push_back(a.attribute());
  return out;
}

TensorSpec spec_of(const Tensor& t) {
  TensorSpec s;
  s.sizes = DimVector(t.sizes());
  s.strides = DimVector(t.strides());
  s.offset = t.storage_offset();
  s.dtype = t.dtype();
  s.device = t.device();
  s.wrapped_number = t.impl()->is_wrapped_number();
  return s;
}

Tensor fake_tensor(const TensorSpec& spec) {
  int64_t hi = spec.offset;
  bool empty = false;
  for (size_t i = 0; i < spec.sizes.size(); ++i) {
    if (spec.sizes[i] == 0) empty = true;
    else hi += (spec.sizes[i] - 1) * std::max<int64_t>(spec.strides[i], 0);
  }
  size_t nbytes = empty ? 0 : static_cast<size_t>(hi + 1) * element_size(spec.dtype);
  auto storage = Storage::create_dataless(nbytes, spec.device);
  auto impl = TensorImpl::make(storage, spec.dtype, spec.sizes, spec.strides, spec.offset);
  impl->set_wrapped_number(spec.wrapped_number);
  return Tensor(std::move(impl));
}

int generator_arg(const OperatorHandle& op) {
  for (int i = 0; i < op.info().num_args; ++i)
    if (op.info().args[i].arg_type == ArgType::OptionalGenerator) return i;
  return -1;
}

std::pair<int, int> seed_offset_args(const OperatorHandle& op) {
  int seed = -1, offset = -1;
  for (int i = 0; i < op.info().num_args; ++i) {
    const ArgInfo& a = op.info().args[i];
    if (a.arg_type != ArgType::Int) continue;
    if (std::string_view(a.name) == "seed") seed = i;
    if (std::string_view(a.name) == "offset") offset = i;
  }
  return seed >= 0 && offset >= 0 ? std::make_pair(seed, offset) : std::make_pair(-1, -1);
}

namespace detail {

std::string node_name(const Graph& g, size_t index) {
  const Node& n = g.nodes()[index];
  std::ostringstream os;
  os << "node " << index << " '" << n.op_name << "'";
  return os.str();
}

bool attribute_matches(std::string_view type, const IValue& v) {
  if (type.ends_with('?')) {
    if (v.is_none()) return true;
    type.remove_suffix(1);
  }
  if (type == "Scalar")
    return v.is<Scalar>() || v.is<int64_t>() || v.is<double>() || v.is<bool>();
  if (type == "int") return v.is<int64_t>() || (v.is<Scalar>() && v.get<Scalar>().is_integral());
  if (type == "float")
    return v.is<double>() || v.is<int64_t>() || (v.is<Scalar>() && !v.get<Scalar>().is_bool());
  if (type == "int[]") return v.is<std::vector<int64_t>>();
  if (type == "bool") return v.is<bool>();
  if (type == "ScalarType") return v.is<ScalarType>();
  if (type == "Device") return v.is<Device>();
  if (type == "str") return v.is<std::string>();
  if (type == "Generator") return v.is<Generator>();
  return false;  // Tensor types are never attributes
}

std::vector<std::string> check_args(const Node& node) {
  std::vector<std::string> problems;
  if (!node.op) return problems;
  const OpInfo& info = node.op->info();
  if (static_cast<int>(node.args.size()) != info.num_args) {
    problems.push_back("expects " + std::to_string(info.num_args) + " arguments (" +
                       info.schema + "), got " + std::to_string(node.args.size()));
    return problems;
  }
  for (int i = 0; i < info.num_args; ++i) {
    const ArgInfo& ai = info.args[i];
    const NodeArg& a = node.args[i];
    std::string_view type = ai.type;
    std::string where = std::string("argument '") + ai.name + "' (" + ai.type + ")";
    if (type == "Tensor" && !a.is_value()) {
      problems.push_back(where + " must be a value reference");
    } else if (type == "Tensor?" && !a.is_value() && !(a.is_attribute() && a.attribute().is_none())) {
      problems.push_back(where + " must be a value reference or None");
    } else if (type == "Tensor[]" && !a.is_value_list()) {
      problems.push_back(where + " must be a list of value references");
    } else if (!type.starts_with("Tensor")) {
      if (!a.is_attribute())
        problems.push_back(where + " must be an attribute, got a value reference");
      else if (!attribute_matches(type, a.attribute()))
        problems.push_back(where + " got an attribute of type " + a.attribute().type_name());
    }
  }
  return problems;
}

std::vector<TensorSpec> run_meta(const Graph& g, const Node& node) {
  Stack s = build_stack(node, [&](ValueId id) {
    const Value& v = g.value(id);
    return v.number ? scalar_to_tensor(*v.number) : fake_tensor(v.meta);
  });
  std::vector<TensorSpec> specs = node.op->run_meta(s);
  // An in-place or out= result is its argument, as the Meta backend returns it: that tensor's
  // layout, or contiguous strides where an out= tensor of other sizes is resized.
  for (TensorSpec& spec : specs) {
    if (spec.alias_of < 0 || node.op->info().is_view) continue;
    const NodeArg& a = node.args[spec.alias_of];
    if (!a.is_value()) continue;
    const TensorSpec& base = g.value(a.values()[0]).meta;
    if (base.sizes.ref() == spec.sizes.ref()) {
      spec.strides = base.strides;
      spec.offset = base.offset;
    }
  }
  return specs;
}

}  // namespace detail

ValueId Graph::new_value(const TensorSpec& spec) {
  ValueId id = static_cast<ValueId>(values_.size());
  values_.push_back(Value{id, spec});
  return id;
}

ValueRef Graph::add_input(const TensorSpec& spec, std::optional<Scalar> number) {
  KILN_CHECK(spec.sizes.size() == spec.strides.size(), Value, "ir: input sizes ", spec.sizes,
             " and strides ", spec.strides, " differ in length");
  TensorSpec s = spec;
  s.alias_of = -1;
  ValueId id = new_value(s);
  values_[id].number = number;
  inputs_.push_back(id);
  return ValueRef{id};
}

std::vector<ValueRef> Graph::add_node(std::string_view op_name, std::vector<NodeArg> args,
                                      std::optional<GeneratorState> rng) {
  Node node;
  node.op_name = std::string(op_name);
  node.op = Dispatcher::get().find(op_name);
  KILN_CHECK(node.op != nullptr, Value, "ir: unknown op '", op_name, "'");
  node.args = std::move(args);
  std::vector<std::string> problems = detail::check_args(node);
  for (ValueId id : node.inputs())
    if (!has_value(id)) problems.push_back("uses unknown value %" + std::to_string(id));
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += "\n  " + p;
    KILN_FAIL(Value, "ir: cannot record '", op_name, "':", msg);
  }
  std::vector<TensorSpec> specs = detail::run_meta(*this, node);
  const OpInfo& info = node.op->info();
  if (info.is_random) {
    int gi = generator_arg(*node.op);
    KILN_ASSERT(gi >= 0, "random op without a Generator? argument: ", op_name);
    KILN_ASSERT(!specs.empty());
    if (rng) {
      node.rng = *rng;
    } else {
      const IValue& ga = node.args[gi].attribute();
      Generator gen = ga.is_none() ? default_generator() : ga.get<Generator>();
      auto [seed, offset] =
          gen.reserve(random_op_counters(info.name, numel_of(specs[0].sizes), specs[0].dtype));
      node.rng = GeneratorState{seed, offset};
    }
    node.args[gi] = NodeArg(IValue());
  } else {
    KILN_CHECK(!rng, Value, "ir: '", op_name, "' is not a random op but was given a (seed, offset)");
  }
  std::vector<ValueRef> outs;
  for (const TensorSpec& s : specs) {
    ValueId id = new_value(s);
    node.outputs.push_back(id);
    outs.push_back(ValueRef{id});
  }
  nodes_.push_back(std::move(node));
  return outs;
}

void Graph::set_outputs(const std::vector<ValueRef>& outputs) {
  outputs_.clear();
  for (ValueRef v : outputs) {
    KILN_CHECK(has_value(v.id), Value, "ir: graph output %", v.id, " is not a value of the graph");
    outputs_.push_back(v.id);
  }
}

const Value& Graph::value(ValueId id) const {
  KILN_CHECK(has_value(id), Index, "ir: no value %", id, " in a graph of ", values_.size(),
             " values");
  return values_[id];
}

Value& Graph::value(ValueId id) {
  KILN_CHECK(has_value(id), Index, "ir: no value %", id, " in a graph of ", values_.size(),
             " values");
  return values_[id];
}

// ---- Printing ------------------------------------------------------------------------------

std::string spec_str(const TensorSpec& spec) {
  std::ostringstream os;
  os << spec.dtype << spec.sizes.ref();
  if (spec.strides.ref() != contiguous_strides(spec.sizes).ref())
    os << " strides=" << spec.strides.ref();
  if (spec.offset != 0) os << " offset=" << spec.offset;
  if (!spec.device.is_cpu()) os << " " << spec.device;
  return os.str();
}

namespace {

std::string value_str(const Graph& g, ValueId id) {
  std::string s = "%" + std::to_string(id);
  if (g.has_value(id)) s += " : " + spec_str(g.value(id).meta);
  return s;
}

void print_node(std::ostream& os, const Graph& g, const Node& n) {
  os << "  ";
  for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << value_str(g, n.outputs[i]);
  os << (n.outputs.empty() ? "" : " = ") << n.op_name << "(";
  for (size_t i = 0; i < n.args.size(); ++i) {
    const NodeArg& a = n.args[i];
    os << (i ? ", " : "");
    const ArgInfo* ai = n.op && static_cast<int>(i) < n.op->info().num_args ? &n.op->info().args[i] : nullptr;
    if (ai && ai->kwarg_only) os << ai->name << "=";
    if (a.is_value()) {
      os << "%" << a.values()[0];
    } else if (a.is_value_list()) {
      os << "[";
      for (size_t k = 0; k < a.values().size(); ++k) os << (k ? ", " : "") << "%" << a.values()[k];
      os << "]";
    } else if (ai && ai->arg_type == ArgType::OptionalGenerator && n.rng) {
      os << "Philox(seed=" << n.rng->seed << ", offset=" << n.rng->offset << ")";
    } else {
      os << a.attribute().repr();
    }
  }
  os << ")\n";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Graph& g) {
  os << "graph(";
  for (size_t i = 0; i < g.inputs().size(); ++i) os << (i ? ", " : "") << value_str(g, g.inputs()[i]);
  os << "):\n";
  for (const Node& n : g.nodes()) print_node(os, g, n);
  os << "  return (";
  for (size_t i = 0; i < g.outputs().size(); ++i) os << (i ? ", " : "") << "%" << g.outputs()[i];
  return os << ")\n";
}

std::string Graph::str() const {
  std::ostringstream os;
  os << *this;
  return os.str();
}

}  // namespace kiln::ir
