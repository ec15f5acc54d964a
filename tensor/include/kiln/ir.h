// kiln/ir.h: the graph IR that the Tracing key and the Remote backend record into, with a
// printer, a verifier and an interpreter that replays a graph through the dispatcher.
//
//   kiln::ir::Graph g;
//   auto x = g.add_input(kiln::meta::contiguous_spec({2, 3}, kiln::kFloat32, kiln::kCPU));
//   auto y = g.add_node("add", {x, x, kiln::Scalar(1)})[0];   // meta only: no data needed
//   g.set_outputs({y});
//   std::cout << g;    // graph(%0 : float32[2, 3]):\n  %1 : float32[2, 3] = add(%0, %0, alpha=1) ...
//   std::vector<kiln::Tensor> out = kiln::ir::run(g, {kiln::ones({2, 3})});
//
// Note [Graph IR]: a Graph is SSA over tensor Values. Each Node names an op of the op table and
// holds its arguments in schema order: Tensor arguments are references to Values, every other
// argument is an attribute (an IValue; None for an absent optional). Output metas (sizes,
// strides, offset, dtype, device) come from the op's meta function run on data-less stand-ins
// of the inputs, so recording never touches data and a recorded graph knows every shape. An
// in-place or view op gets a new Value too; its meta's alias_of names the argument it aliases.
// The IR knows nothing of autograd: a traced backward is just more nodes.
//
// Note [Random ops in the IR]: a random node records the (seed, offset) it uses instead of a
// Generator: add_node reserves random_op_counters(...) from the node's generator (the default
// one when absent), exactly as the eager call would, and stores the generator attribute as None.
// The interpreter passes a fresh Generator at that state, so a replay (here, on a worker, or on
// another backend) draws the same counters as the eager call (Note [Counter-based RNG]).
#pragma once

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dispatcher.h"
#include "kiln/generator.h"

namespace kiln::ir {

using ValueId = int64_t;

// A reference to a Value of a Graph (what a Tensor argument becomes in the IR).
struct ValueRef {
  ValueId id = -1;
  friend bool operator==(ValueRef a, ValueRef b) { return a.id == b.id; }
};

struct Value {
  ValueId id = -1;
  TensorSpec meta;  // alias_of: the node argument this output aliases (-1: fresh storage)
  // A wrapped number's value (an input whose meta has wrapped_number): meta functions that
  // read it (pow's integer exponents) get a real 0-d tensor instead of a data-less one.
  std::optional<Scalar> number;
};

// One node argument in schema order: a Value (Tensor, Tensor?), a list of Values (Tensor[]) or
// an attribute (everything else, and None for an absent Tensor?).
class NodeArg {
 public:
  enum class Kind { Value, ValueList, Attribute };
  NodeArg(ValueRef v) : kind_(Kind::Value), values_{v.id} {}  // NOLINT
  NodeArg(const std::vector<ValueRef>& vs) : kind_(Kind::ValueList) {  // NOLINT
    for (ValueRef v : vs) values_.push_back(v.id);
  }
  template <typename T>
    requires std::is_constructible_v<IValue, T>
  NodeArg(T&& v) : kind_(Kind::Attribute), attr_(std::forward<T>(v)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_value() const { return kind_ == Kind::Value; }
  bool is_value_list() const { return kind_ == Kind::ValueList; }
  bool is_attribute() const { return kind_ == Kind::Attribute; }
  // The referenced value ids (one for Value, any number for ValueList, none for Attribute).
  const std::vector<ValueId>& values() const { return values_; }
  std::vector<ValueId>& values() { return values_; }
  const IValue& attribute() const { return attr_; }

 private:
  Kind kind_;
  std::vector<ValueId> values_;
  IValue attr_;
};

struct Node {
  const OperatorHandle* op = nullptr;  // nullptr when the op table has no `op_name`
  std::string op_name;
  std::vector<NodeArg> args;           // schema order
  std::vector<ValueId> outputs;
  std::optional<GeneratorState> rng;   // random ops only (Note [Random ops in the IR])

  // The value ids the node reads, in argument order.
  std::vector<ValueId> inputs() const;
  // The attributes (non-Tensor arguments) in schema order.
  std::vector<IValue> attributes() const;
};

class Graph {
 public:
  // A placeholder for a graph input with the given geometry.
  ValueRef add_input(const TensorSpec& spec, std::optional<Scalar> number = std::nullopt);
  // Records `op_name` on `args` (schema order, defaults included). ValueError for an unknown op
  // or arguments that do not fit the schema; the op's meta function raises its own errors.
  // `rng` overrides the (seed, offset) of a random op instead of reserving from its generator.
  std::vector<ValueRef> add_node(std::string_view op_name, std::vector<NodeArg> args,
                                 std::optional<GeneratorState> rng = std::nullopt);
  // ValueError for an id that is not a value of the graph.
  void set_outputs(const std::vector<ValueRef>& outputs);

  const Value& value(ValueId id) const;  // IndexError for an unknown id
  Value& value(ValueId id);
  bool has_value(ValueId id) const { return id >= 0 && id < static_cast<ValueId>(values_.size()); }
  int64_t num_values() const { return static_cast<int64_t>(values_.size()); }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  // Mutable access for passes (and tests); run verify() after editing.
  std::vector<Node>& nodes() { return nodes_; }
  std::vector<ValueId>& outputs() { return outputs_; }

  std::string str() const;

 private:
  ValueId new_value(const TensorSpec& spec);
  std::vector<Value> values_;  // values_[id].id == id
  std::vector<ValueId> inputs_;
  std::vector<ValueId> outputs_;
  std::vector<Node> nodes_;
};

std::ostream& operator<<(std::ostream& os, const Graph& g);
// "float32[2, 3]", plus " strides=[...]", " offset=N" and the device where not the defaults.
std::string spec_str(const TensorSpec& spec);

// Every problem of the graph, each naming the node ("node 2 'add': ..."); empty when valid.
std::vector<std::string> verify(const Graph& g);
// As verify, but throws one ValueError listing every problem.
void verify_or_throw(const Graph& g);

// Executes the graph on `inputs` through the dispatcher (Note [Graph IR]); returns the graph
// outputs. ValueError when the inputs do not match the graph's input specs.
std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs);
// As run, calling on_node(i, outputs) once node i has run (calibration observers, per-layer
// error reports); the interpreter keeps every value until the end, so nothing is freed meanwhile.
using NodeObserver = std::function<void(size_t node, const std::vector<Tensor>& outputs)>;
std::vector<Tensor> run(const Graph& g, const std::vector<Tensor>& inputs,
                        const NodeObserver& on_node);

// The node's arguments as a Stack, with `tensor(id)` for each referenced value (the
// interpreter and the compiler's programs build their calls with it).
template <typename F>
Stack build_stack(const Node& node, const F& tensor) {
  Stack s;
  s.reserve(node.args.size());
  for (const NodeArg& a : node.args) {
    if (a.is_attribute()) {
      s.push_back(a.attribute());
    } else if (a.is_value()) {
      s.emplace_back(tensor(a.values()[0]));
    } else {
      std::vector<Tensor> ts;
      for (ValueId id : a.values()) ts.push_back(tensor(id));
      s.emplace_back(std::move(ts));
    }
  }
  return s;
}
// Index of the node's `Generator?` argument, or -1.
int generator_arg(const OperatorHandle& op);
// A seeded op's `seed` and `offset` int arguments (dropout_seeded, _fused_attention: random
// draws whose counters the caller reserved and passes), or {-1, -1}.
std::pair<int, int> seed_offset_args(const OperatorHandle& op);
// A real tensor's geometry, dtype, device and wrapped-number flag, as the IR records it.
TensorSpec spec_of(const Tensor& t);

// Data-less stand-in with `spec`'s geometry, dtype and device, for running meta functions.
Tensor fake_tensor(const TensorSpec& spec);

}  // namespace kiln::ir
