// The graph IR to and from program.proto's Graph (kiln/proto/codec.h).
#include <string_view>
#include <unordered_map>

#include "kiln/dispatcher.h"
#include "kiln/error.h"
#include "kiln/proto/codec.h"
#include "kiln/scalar_type.h"

namespace kiln::proto {
namespace {

proto::TensorSpec encode_spec(const ir::Value& v) {
  proto::TensorSpec p;
  p.set_dtype(scalar_type_name(v.meta.dtype));
  for (int64_t s : v.meta.sizes) p.add_sizes(s);
  for (int64_t s : v.meta.strides) p.add_strides(s);
  p.set_offset(v.meta.offset);
  p.set_device(v.meta.device.str());
  p.set_wrapped_number(v.meta.wrapped_number);
  if (v.number) *p.mutable_number() = encode_attribute(IValue(*v.number));
  return p;
}

}  // namespace

proto::Graph encode_graph(const ir::Graph& g) {
  proto::Graph p;
  for (ir::ValueId id : g.inputs()) {
    p.add_inputs(id);
    *p.add_input_specs() = encode_spec(g.value(id));
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const ir::Node& n = g.nodes()[i];
    proto::Instruction* ins = p.add_nodes();
    ins->set_seq(i);
    ins->set_op(n.op_name);
    for (const ir::NodeArg& a : n.args) {
      proto::Argument* arg = ins->add_args();
      if (a.is_value()) {
        arg->set_value(a.values()[0]);
      } else if (a.is_value_list()) {
        auto* ids = arg->mutable_values();  // set even when empty (no AMSGrad buffers)
        for (ir::ValueId v : a.values()) ids->add_ids(v);
      } else {
        *arg->mutable_attribute() = encode_attribute(a.attribute());
      }
    }
    for (ir::ValueId o : n.outputs) ins->add_outputs(o);
    if (n.rng) {
      ins->mutable_rng()->set_seed(n.rng->seed);
      ins->mutable_rng()->set_offset(n.rng->offset);
    }
  }
  for (ir::ValueId id : g.outputs()) p.add_outputs(id);
  return p;
}

ir::Graph decode_graph(const proto::Graph& p) {
  KILN_CHECK(p.inputs_size() == p.input_specs_size(), Value, "graph: ", p.inputs_size(),
             " inputs but ", p.input_specs_size(), " input specs");
  ir::Graph g;
  std::unordered_map<int64_t, ir::ValueId> ids;
  auto bind = [&](int64_t wire, ir::ValueId id, const std::string& where) {
    KILN_CHECK(ids.emplace(wire, id).second, Value, "graph: ", where, " defines value ", wire,
               " a second time");
  };
  auto lookup = [&](int64_t wire, const std::string& where) {
    auto it = ids.find(wire);
    KILN_CHECK(it != ids.end(), Value, "graph: ", where, " uses unknown value ", wire);
    return it->second;
  };
  for (int i = 0; i < p.inputs_size(); ++i) {
    const proto::TensorSpec& s = p.input_specs(i);
    const std::string where = "input " + std::to_string(i);
    kiln::TensorSpec spec;  // the IR's, not the message
    spec.dtype = scalar_type_from_name(s.dtype().c_str());
    for (int64_t v : s.sizes()) spec.sizes.push_back(v);
    for (int64_t v : s.strides()) spec.strides.push_back(v);
    spec.offset = s.offset();
    spec.device = s.device().empty() ? Device(kCPU) : Device(s.device());
    spec.wrapped_number = s.wrapped_number();
    for (int64_t v : spec.sizes) KILN_CHECK(v >= 0, Value, "graph: ", where, " has a negative size");
    KILN_CHECK(spec.offset >= 0, Value, "graph: ", where, " has a negative offset");
    std::optional<Scalar> number;
    if (s.has_number()) number = decode_attribute(s.number()).to_scalar();
    bind(p.inputs(i), g.add_input(spec, number).id, where);
  }
  for (int i = 0; i < p.nodes_size(); ++i) {
    const proto::Instruction& ins = p.nodes(i);
    const std::string where = "node " + std::to_string(i) + " '" + ins.op() + "'";
    std::vector<ir::NodeArg> args;
    for (const proto::Argument& a : ins.args()) {
      switch (a.kind_case()) {
        case proto::Argument::kValue:
          args.emplace_back(ir::ValueRef{lookup(a.value(), where)});
          break;
        case proto::Argument::kValues: {
          std::vector<ir::ValueRef> vs;
          for (int64_t v : a.values().ids()) vs.push_back(ir::ValueRef{lookup(v, where)});
          args.emplace_back(vs);
          break;
        }
        case proto::Argument::kAttribute:
          args.emplace_back(decode_attribute(a.attribute()));
          break;
        default:
          KILN_FAIL(Value, "graph: ", where, " has an empty argument");
      }
    }
    std::optional<GeneratorState> rng;
    if (ins.has_rng()) rng = GeneratorState{ins.rng().seed(), ins.rng().offset()};
    std::vector<ir::ValueRef> outs;
    try {
      outs = g.add_node(ins.op(), std::move(args), rng);
    } catch (const Error& e) {
      KILN_FAIL(Value, "graph: ", where, ": ", e.what());
    }
    KILN_CHECK(static_cast<int>(outs.size()) == ins.outputs_size(), Value, "graph: ", where,
               " names ", ins.outputs_size(), " outputs; the op makes ", outs.size());
    for (size_t k = 0; k < outs.size(); ++k) bind(ins.outputs(static_cast<int>(k)), outs[k].id, where);
  }
  std::vector<ir::ValueRef> outs;
  for (int64_t o : p.outputs()) outs.push_back(ir::ValueRef{lookup(o, "the graph's outputs")});
  g.set_outputs(outs);
  return g;
}

void rename_collective_groups(
    proto::Graph& g, const std::function<std::string(const std::string&, const std::string&)>& to) {
  for (proto::Instruction& n : *g.mutable_nodes()) {
    const OperatorHandle* op = Dispatcher::get().find(n.op());
    if (op == nullptr || !op->info().tags.has(OpTag::Collective)) continue;
    for (int a = 0; a < op->info().num_args && a < n.args_size(); ++a) {
      if (std::string_view(op->info().args[a].name) != "group") continue;
      proto::Attribute* at = n.mutable_args(a)->mutable_attribute();
      at->set_string_value(to(n.op(), at->string_value()));
    }
  }
}

}  // namespace kiln::proto
