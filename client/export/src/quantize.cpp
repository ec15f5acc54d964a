// Static post-training quantization of an exported program. See Note [Post-training
// quantization] in kiln/quantization.h.
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "file_format.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compiler/export.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"
#include "kiln/proto/codec.h"
#include "kiln/qparams.h"
#include "kiln/quantization.h"
#include "kiln/safetensors.h"
#include "symbolic.h"

namespace kiln::quantization {

using ir::ValueId;
using ir::ValueRef;

namespace {

enum class Affine { Add, Sub, Mul, Div, Same };

struct ChainStep {
  size_t node;
  Affine kind;
  ValueId k;     // the constant operand (-1: Same, a view that changes nothing)
  double alpha;  // add/sub's alpha
};

struct Layer {
  bool conv = false;
  size_t node = 0;    // the convolution / addmm / mm
  ValueId x = -1;     // its float input
  ValueId w = -1;     // its constant weight (mm's mat2 is W transposed)
  ValueId bias = -1;  // addmm's bias, or -1
  std::vector<ChainStep> chain;
  std::optional<size_t> relu;  // the relu node
  ValueId out = -1;            // the layer's output
  size_t last = 0;             // the node that makes `out`
  std::string name;
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
};

// The range of a value over calibration.
struct Range {
  float lo = std::numeric_limits<float>::infinity();
  float hi = -std::numeric_limits<float>::infinity();
  bool seen() const { return lo <= hi; }
};

// The parameters of an observed range (kiln/qparams.h).
QParams qparams_of(const Range& r) { return choose_qparams_u8(r.lo, r.hi); }

bool is_float(const TensorSpec& s) { return s.dtype == kFloat32; }

std::vector<int64_t> ints(const IValue& v) { return v.get<std::vector<int64_t>>("int[]"); }

}  // namespace

struct Calibrator::State {
  std::string what;
  proto::ExportedProgram msg;
  TensorMap weights;
  std::unique_ptr<ExportedProgram> program;
  ir::Graph g;                            // at the example sizes
  std::vector<bool> is_const;             // per value
  std::vector<std::vector<size_t>> uses;  // per value: the nodes reading it
  std::set<ValueId> graph_outputs;
  std::vector<std::string> weight_of_input;  // per graph input: its weight name, or ""
  std::set<size_t> symbolic_nodes;           // nodes holding a symbolic integer
  std::vector<Layer> layers;
  std::vector<Range> range;  // per value
  int64_t batches = 0;

  void find_layers();
  bool per_channel(ValueId k, ValueId y, int channel_dim) const;
  std::string layer_name(ValueId w) const;
  // The constant values `ids`, computed from the weights.
  std::vector<Tensor> constants(const std::vector<ValueId>& ids) const;
  // The quantized program's bytes; *layer_nodes: per layer, its node in the new graph.
  std::string rewrite(std::vector<size_t>* layer_nodes) const;
};

Calibrator::Calibrator(const ExportedProgram& program) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.what = "kiln.quantization";
  s.program =
      std::make_unique<ExportedProgram>(ExportedProgram::from_bytes(program.bytes(), s.what));
  const exporting::Parts parts = exporting::unpack(s.program->bytes(), s.what);
  KILN_CHECK(s.msg.ParseFromArray(parts.program.data(), static_cast<int>(parts.program.size())),
             Value, s.what, ": the program part does not parse");
  s.weights = safetensors_from_bytes(parts.weights).tensors;
  s.g = proto::decode_graph(s.msg.graph());
  const ir::Graph& g = s.g;
  s.is_const.assign(static_cast<size_t>(g.num_values()), false);
  s.uses.assign(static_cast<size_t>(g.num_values()), {});
  s.range.assign(static_cast<size_t>(g.num_values()), Range{});
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const proto::ExportedInput& in = s.msg.inputs(static_cast<int>(i));
    s.is_const[g.inputs()[i]] = !in.has_argument();
    s.weight_of_input.push_back(in.has_weight() ? in.weight() : "");
  }
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const ir::Node& node = g.nodes()[n];
    bool c = !node.rng && !node.op->info().is_inplace;
    for (ValueId v : node.inputs()) {
      c = c && s.is_const[v];
      s.uses[v].push_back(n);
    }
    for (ValueId v : node.outputs) s.is_const[v] = c;
  }
  for (ValueId v : g.outputs()) s.graph_outputs.insert(v);
  for (const proto::SymbolicInt& si : s.msg.symbolic())
    if (si.path_size() >= 4 && si.path(0) == 1 && si.path(2) == 3)
      s.symbolic_nodes.insert(static_cast<size_t>(si.path(3)));
  s.find_layers();
  KILN_CHECK(!s.layers.empty(), Value, s.what,
             ": the program has no layer to quantize (a 2-d convolution, or a linear / addmm / mm, "
             "whose weight comes from the program's weights)");
}

Calibrator::~Calibrator() = default;
Calibrator::Calibrator(Calibrator&&) noexcept = default;

bool Calibrator::State::per_channel(ValueId k, ValueId y, int channel_dim) const {
  const TensorSpec& ks = g.value(k).meta;
  const TensorSpec& ys = g.value(y).meta;
  if (!is_const[k] || ks.dtype != ys.dtype || ks.sizes.size() > ys.sizes.size()) return false;
  const size_t pad = ys.sizes.size() - ks.sizes.size();
  for (size_t d = 0; d < ks.sizes.size(); ++d) {
    const int64_t n = ks.sizes[d];
    const bool channel = static_cast<int>(d + pad) == channel_dim;
    if (n != 1 && !(channel && n == ys.sizes[d + pad])) return false;
  }
  return true;
}

std::string Calibrator::State::layer_name(ValueId w) const {
  // Back through the constant nodes (t, view) to the weight they read.
  for (int hops = 0; hops < 8; ++hops) {
    for (size_t i = 0; i < g.inputs().size(); ++i) {
      if (g.inputs()[i] != w || weight_of_input[i].empty()) continue;
      std::string name = weight_of_input[i];
      const std::string suffix = ".weight";
      if (name.size() > suffix.size() && name.ends_with(suffix))
        name.resize(name.size() - suffix.size());
      return name;
    }
    bool moved = false;
    for (const ir::Node& n : g.nodes()) {
      if (std::find(n.outputs.begin(), n.outputs.end(), w) == n.outputs.end()) continue;
      const std::vector<ValueId> in = n.inputs();
      if (in.size() == 1) w = in[0], moved = true;
      break;
    }
    if (!moved) break;
  }
  return "layer" + std::to_string(layers.size());
}

void Calibrator::State::find_layers() {
  std::set<size_t> taken;
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const ir::Node& node = g.nodes()[n];
    const std::string& op = node.op_name;
    Layer L;
    L.node = n;
    auto value = [&](int a) { return node.args[a].is_value() ? node.args[a].values()[0] : -1; };
    if (op == "convolution") {
      L.conv = true;
      L.x = value(0), L.w = value(1);
      if (L.x < 0 || L.w < 0 || g.value(L.w).meta.sizes.size() != 4 ||
          node.args[5].attribute().get<bool>("bool"))
        continue;
      L.stride = ints(node.args[2].attribute());
      L.padding = ints(node.args[3].attribute());
      L.dilation = ints(node.args[4].attribute());
      L.groups = node.args[7].attribute().to_int();
    } else if (op == "addmm") {
      L.bias = value(0), L.x = value(1), L.w = value(2);
      if (L.bias < 0 || L.x < 0 || L.w < 0 ||
          node.args[3].attribute().to_scalar().to<double>() != 1 ||
          node.args[4].attribute().to_scalar().to<double>() != 1 || !is_const[L.bias] ||
          g.value(L.bias).meta.sizes.size() > 1)
        continue;
    } else if (op == "mm") {
      L.x = value(0), L.w = value(1);
      if (L.x < 0 || L.w < 0) continue;
    } else {
      continue;
    }
    if (is_const[L.x] || !is_const[L.w] || !is_float(g.value(L.x).meta) ||
        !is_float(g.value(L.w).meta) || symbolic_nodes.count(n))
      continue;
    const int channel_dim = 1;  // NCHW's C; an [M, N] matrix's N
    ValueId y = node.outputs[0];
    size_t last = n;
    std::set<size_t> nodes{n};
    while (uses[y].size() == 1 && !graph_outputs.count(y)) {
      const size_t j = uses[y][0];
      const ir::Node& u = g.nodes()[j];
      if (taken.count(j)) break;
      // A view to the same sizes (linear's reshape back to its output's shape) changes nothing;
      // its sizes may be symbolic.
      if (u.op->info().is_view && u.inputs() == std::vector<ValueId>{y} && u.outputs.size() == 1 &&
          g.value(u.outputs[0]).meta.sizes == g.value(y).meta.sizes) {
        L.chain.push_back({j, Affine::Same, -1, 1});
        y = u.outputs[0], last = j;
        continue;
      }
      if (symbolic_nodes.count(j)) break;
      if (u.op_name == "relu") {
        L.relu = j;
        y = u.outputs[0], last = j;
        break;
      }
      std::optional<Affine> kind;
      if (u.op_name == "add") kind = Affine::Add;
      if (u.op_name == "sub") kind = Affine::Sub;
      if (u.op_name == "mul") kind = Affine::Mul;
      if (u.op_name == "div") kind = Affine::Div;
      if (!kind || !u.args[0].is_value() || !u.args[1].is_value()) break;
      ValueId a = u.args[0].values()[0], b = u.args[1].values()[0];
      const bool commutes = *kind == Affine::Add || *kind == Affine::Mul;
      if (a != y && !(commutes && b == y)) break;
      const ValueId k = a == y ? b : a;
      if (k == y || !per_channel(k, y, channel_dim)) break;
      double alpha = 1;
      if (*kind == Affine::Add || *kind == Affine::Sub)
        alpha = u.args[2].attribute().to_scalar().to<double>();
      L.chain.push_back({j, *kind, k, alpha});
      y = u.outputs[0], last = j;
    }
    L.out = y, L.last = last;
    L.name = layer_name(L.w);
    taken.insert(n);
    for (const ChainStep& c : L.chain) taken.insert(c.node);
    if (L.relu) taken.insert(*L.relu);
    layers.push_back(std::move(L));
  }
}

std::vector<Tensor> Calibrator::State::constants(const std::vector<ValueId>& ids) const {
  ir::Graph cg;
  std::map<ValueId, ValueRef> to;
  std::vector<Tensor> in;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ValueId id = g.inputs()[i];
    if (!is_const[id]) continue;
    const ir::Value& v = g.value(id);
    to[id] = cg.add_input(v.meta, v.number);
    if (!weight_of_input[i].empty())
      in.push_back(
          exporting::weight_for(what, weight_of_input[i], weights.at(weight_of_input[i]), v.meta));
    else
      in.push_back(compiler::constant_input(g, i));
  }
  for (const ir::Node& n : g.nodes()) {
    if (n.outputs.empty() || !is_const[n.outputs[0]]) continue;
    std::vector<ir::NodeArg> args;
    for (const ir::NodeArg& a : n.args) {
      if (a.is_attribute()) {
        args.push_back(a);
      } else {
        std::vector<ValueRef> vs;
        for (ValueId v : a.values()) vs.push_back(to.at(v));
        if (a.is_value())
          args.emplace_back(vs[0]);
        else
          args.emplace_back(vs);
      }
    }
    std::vector<ValueRef> outs = cg.add_node(n.op_name, std::move(args), n.rng);
    for (size_t k = 0; k < outs.size(); ++k) to[n.outputs[k]] = outs[k];
  }
  std::vector<ValueRef> want;
  for (ValueId id : ids) want.push_back(to.at(id));
  cg.set_outputs(want);
  autograd::NoGradGuard no_grad;
  return ir::run(cg, in);
}

std::vector<Tensor> Calibrator::observe(const std::vector<Tensor>& inputs) {
  State& s = *s_;
  const ir::Graph& g = s.g;
  std::vector<Range> range = s.range;
  auto widen = [&](ValueId v, const Tensor& t, const std::string& where) {
    if (!is_float(g.value(v).meta) || s.is_const[v] || t.numel() == 0) return;
    const float lo = t.min().item<float>(), hi = t.max().item<float>();
    KILN_CHECK(std::isfinite(lo) && std::isfinite(hi), Value, s.what, ": calibration: ", where,
               " made a NaN or infinite value; its range cannot be observed");
    range[v].lo = std::min(range[v].lo, lo);
    range[v].hi = std::max(range[v].hi, hi);
  };
  std::vector<Tensor> out = s.program->run_observed(inputs, [&](size_t n, const auto& outs) {
    const ir::Node& node = g.nodes()[n];
    for (size_t k = 0; k < outs.size() && k < node.outputs.size(); ++k)
      widen(node.outputs[k], outs[k], "node " + std::to_string(n) + " '" + node.op_name + "'");
  });
  // The arguments themselves (a first layer's input).
  size_t a = 0;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    if (s.msg.inputs(static_cast<int>(i)).has_argument() && a < inputs.size())
      widen(g.inputs()[i], inputs[a++].to(kFloat32), "input " + std::to_string(i));
  s.range = std::move(range);  // only a batch that ran through counts
  ++s.batches;
  return out;
}

int64_t Calibrator::batches_observed() const { return s_->batches; }

std::vector<std::string> Calibrator::layers() const {
  std::vector<std::string> out;
  for (const Layer& L : s_->layers) {
    std::string line =
        std::string(L.conv ? "conv2d " : "linear ") + L.name + ": " + s_->g.nodes()[L.node].op_name;
    for (const ChainStep& c : L.chain)
      if (c.kind != Affine::Same) line += " + " + s_->g.nodes()[c.node].op_name;
    if (L.relu) line += " + relu";
    out.push_back(line);
  }
  return out;
}

std::string Calibrator::State::rewrite(std::vector<size_t>* layer_nodes) const {
  KILN_CHECK(batches > 0, Value, what,
             ": convert before any calibration: run observe() on representative inputs first");
  // Folded weights, per layer: a * op(x, W) + b = op(x, a * W) + b.
  std::vector<ValueId> need;
  for (const Layer& L : layers) {
    need.push_back(L.w);
    if (L.bias >= 0) need.push_back(L.bias);
    for (const ChainStep& c : L.chain)
      if (c.k >= 0) need.push_back(c.k);
  }
  const std::vector<Tensor> cv = constants(need);
  std::map<ValueId, Tensor> value_of;
  for (size_t i = 0; i < need.size(); ++i) value_of[need[i]] = cv[i];
  struct Folded {
    Tensor wq, scale, bias;
  };
  std::vector<Folded> folded;
  for (const Layer& L : layers) {
    Tensor w = value_of.at(L.w).to(kFloat64);
    if (!L.conv) w = w.t();  // mm/addmm read W^T
    const int64_t C = w.size(0);
    auto channel = [&](const Tensor& k) { return k.to(kFloat64).reshape({-1}).expand({C}); };
    Tensor a = kiln::ones({C}, kFloat64), b = kiln::zeros({C}, kFloat64);
    if (L.bias >= 0) b = channel(value_of.at(L.bias)).clone();
    for (const ChainStep& c : L.chain) {
      if (c.kind == Affine::Same) continue;
      const Tensor k = channel(value_of.at(c.k));
      switch (c.kind) {
        case Affine::Same:
          break;
        case Affine::Add:
          b = b + k * c.alpha;
          break;
        case Affine::Sub:
          b = b - k * c.alpha;
          break;
        case Affine::Mul:
          a = a * k, b = b * k;
          break;
        case Affine::Div:
          a = a / k, b = b / k;
          break;
      }
    }
    std::vector<int64_t> shape(static_cast<size_t>(w.dim()), 1);
    shape[0] = C;
    const Tensor wf = (w * a.reshape(shape)).to(kFloat32).contiguous();
    auto [wq, ws] = kiln::quantize_weight_per_channel(wf, 0);
    folded.push_back({wq, ws, b.to(kFloat32).contiguous()});
  }
  // Which nodes and inputs the new graph keeps: the layers' nodes go, and so do constant nodes
  // (and weights) read by nothing that stays.
  std::vector<bool> absorbed(g.nodes().size(), false), live(g.nodes().size(), false);
  std::map<size_t, size_t> layer_at;  // a layer's op node -> the layer
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& L = layers[l];
    absorbed[L.node] = true;
    layer_at[L.node] = l;
    for (const ChainStep& c : L.chain) absorbed[c.node] = true;
    if (L.relu) absorbed[*L.relu] = true;
  }
  std::vector<bool> used(static_cast<size_t>(g.num_values()), false);
  for (ValueId v : g.outputs()) used[v] = true;
  for (const Layer& L : layers) used[L.x] = true;
  for (size_t n = g.nodes().size(); n-- > 0;) {
    const ir::Node& node = g.nodes()[n];
    if (absorbed[n]) continue;
    bool keep = node.outputs.empty() || !is_const[node.outputs[0]];
    for (ValueId v : node.outputs) keep = keep || used[v];
    live[n] = keep;
    if (keep)
      for (ValueId v : node.inputs()) used[v] = true;
  }
  // Inputs: the kept ones in their order, then each layer's new weights.
  ir::Graph ng;
  std::map<ValueId, ValueRef> fl;  // old value -> its float value in ng
  struct Quant {
    ValueRef v;
    QParams q;
  };
  std::map<ValueId, Quant> qv;  // old value -> its uint8 value in ng
  std::vector<int> input_at(g.inputs().size(), -1);
  proto::ExportedProgram out;
  TensorMap new_weights;
  int next_input = 0;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const ValueId id = g.inputs()[i];
    const proto::ExportedInput& in = msg.inputs(static_cast<int>(i));
    if (!in.has_argument() && !used[id]) continue;
    const ir::Value& v = g.value(id);
    fl[id] = ng.add_input(v.meta, v.number);
    input_at[i] = next_input++;
    *out.add_inputs() = in;
    if (in.has_weight()) new_weights[in.weight()] = weights.at(in.weight());
  }
  std::vector<std::array<ValueRef, 3>> layer_inputs;
  for (size_t l = 0; l < layers.size(); ++l) {
    std::string base = layers[l].name;
    while (new_weights.count(base + ".weight_int8")) base += "_";
    const std::array<std::pair<std::string, Tensor>, 3> ws = {
        std::pair{base + ".weight_int8", folded[l].wq},
        std::pair{base + ".weight_scale", folded[l].scale},
        std::pair{base + ".bias_folded", folded[l].bias}};
    std::array<ValueRef, 3> refs;
    for (size_t k = 0; k < 3; ++k) {
      refs[k] = ng.add_input(ir::spec_of(ws[k].second));
      out.add_inputs()->set_weight(ws[k].first);
      new_weights[ws[k].first] = ws[k].second;
    }
    layer_inputs.push_back(refs);
  }
  auto floatv = [&](ValueId v) -> ValueRef {
    if (auto it = fl.find(v); it != fl.end()) return it->second;
    const Quant& q = qv.at(v);
    ValueRef d = ng.add_node("dequantize_per_tensor", {q.v, q.q.scale, q.q.zero_point})[0];
    fl[v] = d;
    return d;
  };
  auto quantv = [&](ValueId v) -> Quant {
    if (auto it = qv.find(v); it != qv.end()) return it->second;
    KILN_CHECK(range[v].seen(), Value, what, ": no range was observed for value %", v);
    const QParams q = qparams_of(range[v]);
    Quant r{ng.add_node("quantize_per_tensor", {floatv(v), q.scale, q.zero_point})[0], q};
    qv[v] = r;
    return r;
  };
  std::vector<int> node_at(g.nodes().size(), -1);
  layer_nodes->assign(layers.size(), 0);
  for (size_t n = 0; n < g.nodes().size(); ++n) {
    const ir::Node& node = g.nodes()[n];
    if (auto it = layer_at.find(n); it != layer_at.end()) {
      const Layer& L = layers[it->second];
      const auto& [wq, ws, bias] = layer_inputs[it->second];
      const Quant x = quantv(L.x);
      KILN_CHECK(range[L.out].seen(), Value, what, ": no range was observed for ", L.name);
      const QParams q = qparams_of(range[L.out]);
      std::vector<ir::NodeArg> args{x.v, x.q.scale, x.q.zero_point, wq, ws, bias};
      if (L.conv) {
        args.insert(args.end(), {ir::NodeArg(L.stride), ir::NodeArg(L.padding),
                                 ir::NodeArg(L.dilation), ir::NodeArg(L.groups)});
      }
      args.insert(args.end(), {ir::NodeArg(q.scale), ir::NodeArg(q.zero_point),
                               ir::NodeArg(L.relu.has_value())});
      qv[L.out] = {ng.add_node(L.conv ? "conv2d_int8" : "linear_int8", std::move(args))[0], q};
      (*layer_nodes)[it->second] = ng.nodes().size() - 1;
      continue;
    }
    if (absorbed[n] || !live[n]) continue;
    const std::vector<ValueId> in = node.inputs();
    // A view of a layer's uint8 output stays uint8, with the same parameters.
    if (node.op->info().is_view && in.size() == 1 && node.args[0].is_value() && qv.count(in[0]) &&
        !fl.count(in[0]) && node.outputs.size() == 1) {
      std::vector<ir::NodeArg> args = node.args;
      args[0] = ir::NodeArg(qv.at(in[0]).v);
      qv[node.outputs[0]] = {ng.add_node(node.op_name, std::move(args), node.rng)[0],
                             qv.at(in[0]).q};
      node_at[n] = static_cast<int>(ng.nodes().size()) - 1;
      continue;
    }
    std::vector<ir::NodeArg> args;
    for (const ir::NodeArg& a : node.args) {
      if (a.is_attribute()) {
        args.push_back(a);
        continue;
      }
      std::vector<ValueRef> vs;
      for (ValueId v : a.values()) vs.push_back(floatv(v));
      if (a.is_value())
        args.emplace_back(vs[0]);
      else
        args.emplace_back(vs);
    }
    std::vector<ValueRef> outs = ng.add_node(node.op_name, std::move(args), node.rng);
    node_at[n] = static_cast<int>(ng.nodes().size()) - 1;
    for (size_t k = 0; k < outs.size(); ++k) fl[node.outputs[k]] = outs[k];
  }
  std::vector<ValueRef> outputs;
  for (ValueId v : g.outputs()) outputs.push_back(floatv(v));
  ng.set_outputs(outputs);
  ir::verify_or_throw(ng);
  // The message: the new graph; symbols and symbolic integers renumbered to it.
  *out.mutable_graph() = proto::encode_graph(ng);
  *out.mutable_output_names() = msg.output_names();
  *out.mutable_output_specs() = msg.output_specs();
  out.set_producer(msg.producer());
  for (const proto::SymbolicDim& d : msg.dims()) {
    proto::SymbolicDim* nd = out.add_dims();
    *nd = d;
    nd->set_input(input_at.at(static_cast<size_t>(d.input())));
  }
  for (const proto::SymbolicInt& si : msg.symbolic()) {
    proto::SymbolicInt ns = si;
    const bool in_graph = si.path_size() >= 4 && si.path(0) == 1;
    if (in_graph && si.path(2) == 2) {  // graph.input_specs[i]
      const int i = input_at.at(static_cast<size_t>(si.path(3)));
      if (i < 0) continue;  // a weight the new graph no longer reads
      ns.set_path(3, i);
    } else if (in_graph && si.path(2) == 3) {  // graph.nodes[n]
      const int n = node_at.at(static_cast<size_t>(si.path(3)));
      if (n < 0) continue;  // a constant node that went with its layer
      ns.set_path(3, n);
    } else {
      KILN_CHECK(si.path(0) == 7, Value, what, ": a symbolic integer at ",
                 exporting::slot_str(msg, {si.path().begin(), si.path().end()}),
                 " that quantization cannot carry over");
    }
    *out.add_symbolic() = ns;
  }
  return exporting::pack(out.SerializeAsString(), safetensors_to_bytes(new_weights));
}

std::string Calibrator::convert() const {
  std::vector<size_t> nodes;
  return s_->rewrite(&nodes);
}

std::vector<LayerError> Calibrator::error_report(const std::vector<Tensor>& inputs) const {
  const State& s = *s_;
  std::vector<size_t> qnodes;
  const ExportedProgram q = ExportedProgram::from_bytes(s.rewrite(&qnodes), s.what);
  std::map<size_t, size_t> at_float, at_quant;  // node -> layer
  for (size_t l = 0; l < s.layers.size(); ++l) {
    at_float[s.layers[l].last] = l;
    at_quant[qnodes[l]] = l;
  }
  std::vector<Tensor> ref(s.layers.size()), got(s.layers.size());
  auto keep = [](const std::map<size_t, size_t>& at, std::vector<Tensor>* into) {
    return [&at, into](size_t n, const std::vector<Tensor>& outs) {
      if (auto it = at.find(n); it != at.end()) (*into)[it->second] = outs[0].clone();
    };
  };
  s.program->run_observed(inputs, keep(at_float, &ref));
  q.run_observed(inputs, keep(at_quant, &got));
  std::vector<LayerError> report;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const Layer& L = s.layers[l];
    const QParams qp = qparams_of(s.range[L.out]);
    const Tensor r = ref[l].to(kFloat64);
    const Tensor err = kiln::dequantize_per_tensor(got[l], qp.scale, qp.zero_point)
                           .to(kFloat64)
                           .reshape(r.sizes()) -
                       r;
    LayerError e;
    e.layer = L.name;
    e.op = L.conv ? "conv2d_int8" : "linear_int8";
    if (err.numel() > 0) {
      e.max_abs = err.abs().max().item<double>();
      e.mean_abs = err.abs().mean().item<double>();
    }
    const double signal = (r * r).sum().item<double>(), noise = (err * err).sum().item<double>();
    e.sqnr_db = noise > 0 ? 10 * std::log10(signal / noise) : 300;
    report.push_back(e);
  }
  return report;
}

}  // namespace kiln::quantization
