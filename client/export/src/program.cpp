// kiln::ExportedProgram: an exported program file loaded, checked and run. See Note [Exported
// programs] and Note [Exported program file] in kiln/exported_program.h.
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "file_format.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compiler/export.h"
#include "kiln/exported_program.h"
#include "kiln/proto/codec.h"
#include "kiln/scalar_type.h"
#include "symbolic.h"

namespace kiln {

using exporting::Poly;

struct ExportedProgram::State {
  std::string what;  // the file, for messages
  std::string bytes;  // the file
  proto::ExportedProgram msg;
  TensorMap weights;
  std::vector<Port> inputs, outputs;
  std::vector<int> arg_input;  // per argument: its graph input
  std::vector<std::string> symbol_names;
  std::vector<exporting::SlotPath> paths;  // per symbolic integer
  std::vector<Poly> polys;
  // Per graph input and dim: the size as a polynomial of the symbols (arguments only).
  std::vector<std::vector<Poly>> arg_dims;

  struct Instance {
    ir::Graph graph;
    std::vector<Tensor> fixed;  // per graph input: its weight or constant (undefined: an argument)
  };
  mutable std::mutex mu;
  mutable std::map<std::vector<int64_t>, std::shared_ptr<const Instance>> instances;

  // The polynomial that the integer at `path` is: its symbolic form, or the number msg holds.
  Poly poly_at(const exporting::SlotPath& path) const {
    for (size_t k = 0; k < paths.size(); ++k)
      if (paths[k] == path) return polys[k];
    Poly p;
    p.constant = exporting::get_int_slot(msg, path);
    return p;
  }
  // The graph with the symbols at `at`, rebuilt through the meta functions.
  std::shared_ptr<const Instance> instance(const std::vector<int64_t>& at) const;
  std::string at_str(const std::vector<int64_t>& at) const {
    std::string s;
    for (size_t i = 0; i < at.size(); ++i)
      s += (i ? ", " : "") + symbol_names[i] + "=" + std::to_string(at[i]);
    return s;
  }
};

namespace {

std::vector<std::string> dims_of(const std::vector<Poly>& dims,
                                 const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const Poly& p : dims) out.push_back(p.str(names));
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), Value, path, ": cannot open the exported program");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

}  // namespace

std::shared_ptr<const ExportedProgram::State::Instance> ExportedProgram::State::instance(
    const std::vector<int64_t>& at) const {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = instances.find(at); it != instances.end()) return it->second;
  }
  proto::ExportedProgram m = msg;
  for (size_t k = 0; k < paths.size(); ++k)
    exporting::set_int_slot(&m, paths[k], polys[k].eval(at));
  auto inst = std::make_shared<Instance>();
  try {
    inst->graph = proto::decode_graph(m.graph());
  } catch (const Error& e) {
    KILN_FAIL(Value, what, ": the program does not hold at ", at_str(at), ": ", e.what());
  }
  const auto& gin = inst->graph.inputs();
  for (size_t i = 0; i < gin.size(); ++i) {
    const proto::ExportedInput& in = m.inputs(static_cast<int>(i));
    if (in.has_weight()) {
      inst->fixed.push_back(exporting::weight_for(what, in.weight(), weights.at(in.weight()),
                                                  inst->graph.value(gin[i]).meta));
    } else if (in.has_constant()) {
      Tensor c = compiler::constant_input(inst->graph, i);
      KILN_CHECK(c.defined(), Value, what, ": graph input ", i,
                 " is marked a constant but holds no number");
      inst->fixed.push_back(c);
    } else {
      inst->fixed.emplace_back();
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  return instances.emplace(at, std::move(inst)).first->second;
}

ExportedProgram::ExportedProgram(std::unique_ptr<State> s) : s_(std::move(s)) {}
ExportedProgram::ExportedProgram(ExportedProgram&&) noexcept = default;
ExportedProgram& ExportedProgram::operator=(ExportedProgram&&) noexcept = default;
ExportedProgram::~ExportedProgram() = default;

ExportedProgram ExportedProgram::load(const std::string& path) {
  return from_bytes(read_file(path), path);
}

ExportedProgram ExportedProgram::from_bytes(std::string_view bytes, const std::string& what) {
  auto s = std::make_unique<State>();
  s->bytes = std::string(bytes);
  const exporting::Parts parts = exporting::unpack(s->bytes, what);
  s->what = what;
  proto::ExportedProgram& m = s->msg;
  KILN_CHECK(m.ParseFromArray(parts.program.data(), static_cast<int>(parts.program.size())), Value,
             what, ": the program part is not a kiln.proto.ExportedProgram message");
  try {
    s->weights = safetensors_from_bytes(parts.weights).tensors;
  } catch (const Error& e) {
    KILN_FAIL(Value, what, ": the weights part: ", e.what());
  }
  const proto::Graph& g = m.graph();
  // Every op first, so that a program for another build names all it lacks at once.
  std::set<std::string> missing;
  for (const proto::Instruction& n : g.nodes())
    if (Dispatcher::get().find(n.op()) == nullptr) missing.insert(n.op());
  if (!missing.empty()) {
    std::string list;
    for (const std::string& op : missing) list += (list.empty() ? "'" : ", '") + op + "'";
    KILN_FAIL(Value, what, ": the program uses ops this build of Kiln lacks: ", list,
              " (written by ", m.producer().empty() ? "an unknown producer" : m.producer(), ")");
  }
  KILN_CHECK(m.inputs_size() == g.inputs_size(), Value, what, ": ", m.inputs_size(),
             " input descriptions for a graph of ", g.inputs_size(), " inputs");
  KILN_CHECK(m.output_names_size() == g.outputs_size() && m.output_specs_size() == g.outputs_size(),
             Value, what, ": ", m.output_names_size(), " output names and ", m.output_specs_size(),
             " output specs for a graph of ", g.outputs_size(), " outputs");
  for (int i = 0; i < m.inputs_size(); ++i) {
    const proto::ExportedInput& in = m.inputs(i);
    KILN_CHECK(in.kind_case() != proto::ExportedInput::KIND_NOT_SET, Value, what, ": graph input ",
               i, " is neither an argument, a weight nor a constant");
    if (in.has_argument()) s->arg_input.push_back(i);
    KILN_CHECK(!in.has_weight() || s->weights.count(in.weight()), Value, what, ": weight '",
               in.weight(), "' is missing from the weights");
  }
  for (const proto::SymbolicDim& d : m.dims()) {
    KILN_CHECK(d.input() >= 0 && d.input() < g.inputs_size() &&
                   m.inputs(d.input()).has_argument() && d.dim() >= 0 &&
                   d.dim() < g.input_specs(d.input()).sizes_size(),
               Value, what, ": symbol '", d.name(), "' names input ", d.input(), " dim ", d.dim(),
               ", which is no dim of an argument");
    s->symbol_names.push_back(d.name());
  }
  std::vector<int64_t> example;
  for (const proto::SymbolicDim& d : m.dims()) example.push_back(d.example());
  for (const proto::SymbolicInt& si : m.symbolic()) {
    Poly p;
    p.constant = si.constant();
    for (const proto::SymbolicTerm& t : si.terms()) {
      Poly::Term term{t.coefficient(), {}};
      for (int32_t sym : t.symbols()) {
        KILN_CHECK(sym >= 0 && sym < m.dims_size(), Value, what,
                   ": a symbolic integer names symbol ", sym, " of ", m.dims_size());
        term.symbols.push_back(sym);
      }
      p.terms.push_back(std::move(term));
    }
    exporting::SlotPath path(si.path().begin(), si.path().end());
    // The path must name an integer the program holds, and the example sizes must give it.
    const int64_t held = exporting::get_int_slot(m, path);
    KILN_CHECK(p.eval(example) == held, Value, what, ": ", exporting::slot_str(m, path), " is ",
               held, " but its symbolic form ", p.str(s->symbol_names), " gives ", p.eval(example),
               " at the example sizes");
    s->paths.push_back(std::move(path));
    s->polys.push_back(std::move(p));
  }
  // Ports, with each size in its symbolic form.
  for (int i : s->arg_input) {
    std::vector<Poly> dims;
    for (int d = 0; d < g.input_specs(i).sizes_size(); ++d)
      dims.push_back(s->poly_at({1, -1, 2, i, 2, d}));  // graph.input_specs[i].sizes[d]
    s->inputs.push_back({m.inputs(i).argument(),
                         scalar_type_from_name(g.input_specs(i).dtype().c_str()),
                         dims_of(dims, s->symbol_names)});
    s->arg_dims.push_back(std::move(dims));
  }
  for (int k = 0; k < g.outputs_size(); ++k) {
    std::vector<Poly> dims;
    for (int d = 0; d < m.output_specs(k).sizes_size(); ++d)
      dims.push_back(s->poly_at({7, k, 2, d}));  // output_specs[k].sizes[d]
    s->outputs.push_back({m.output_names(k),
                          scalar_type_from_name(m.output_specs(k).dtype().c_str()),
                          dims_of(dims, s->symbol_names)});
  }
  // Rebuilt once at the example sizes: every node against its schema and meta function.
  s->instance(example);
  return ExportedProgram(std::move(s));
}

const std::vector<ExportedProgram::Port>& ExportedProgram::inputs() const { return s_->inputs; }
const std::vector<ExportedProgram::Port>& ExportedProgram::outputs() const { return s_->outputs; }
const TensorMap& ExportedProgram::weights() const { return s_->weights; }

std::string ExportedProgram::describe() const {
  std::ostringstream os;
  auto port = [&](const Port& p) {
    os << "  " << p.name << ": " << scalar_type_name(p.dtype) << "[";
    for (size_t d = 0; d < p.dims.size(); ++d) os << (d ? ", " : "") << p.dims[d];
    os << "]\n";
  };
  os << "program: " << s_->what << " (" << s_->msg.producer() << ")\n";
  os << "inputs:\n";
  for (const Port& p : s_->inputs) port(p);
  os << "outputs:\n";
  for (const Port& p : s_->outputs) port(p);
  if (s_->msg.dims_size() > 0) {
    os << "symbols:\n";
    for (const proto::SymbolicDim& d : s_->msg.dims()) {
      os << "  " << d.name() << ": dim " << d.dim() << " of "
         << s_->msg.inputs(d.input()).argument() << ", in [" << d.min() << ", "
         << (d.max() > 0 ? std::to_string(d.max()) : "inf") << "], exported at " << d.example()
         << "\n";
    }
  }
  int64_t bytes = 0;
  for (const auto& [name, t] : s_->weights) bytes += static_cast<int64_t>(t.nbytes());
  os << "weights: " << s_->weights.size() << " tensors, " << bytes << " bytes\n";
  std::map<std::string, int> ops;
  for (const proto::Instruction& n : s_->msg.graph().nodes()) ++ops[n.op()];
  os << "ops: " << s_->msg.graph().nodes_size() << " nodes\n";
  for (const auto& [op, count] : ops) os << "  " << op << " x" << count << "\n";
  return os.str();
}

const std::string& ExportedProgram::bytes() const { return s_->bytes; }

std::vector<Tensor> ExportedProgram::run(const std::vector<Tensor>& inputs) const {
  return run_observed(inputs, ir::NodeObserver());
}

std::vector<Tensor> ExportedProgram::run_observed(const std::vector<Tensor>& inputs,
                                                  const ir::NodeObserver& on_node) const {
  const State& s = *s_;
  const std::string what = s.what;
  KILN_CHECK(inputs.size() == s.inputs.size(), Value, what, ": the program takes ", s.inputs.size(),
             " inputs, got ", inputs.size());
  const proto::ExportedProgram& m = s.msg;
  // The symbols, from the dims that bind them.
  std::vector<int64_t> at(m.dims_size());
  for (int k = 0; k < m.dims_size(); ++k) {
    const proto::SymbolicDim& d = m.dims(k);
    size_t a = 0;
    while (s.arg_input[a] != d.input()) ++a;
    const Tensor& t = inputs[a];
    KILN_CHECK(t.defined() && t.dim() > d.dim(), Value, what, ": input '", s.inputs[a].name,
               "' needs at least ", d.dim() + 1, " dims (its dim ", d.dim(), " is '", d.name(),
               "')");
    at[k] = t.size(d.dim());
    KILN_CHECK(at[k] >= d.min() && (d.max() == 0 || at[k] <= d.max()), Value, what, ": input '",
               s.inputs[a].name, "' dim ", d.dim(), " ('", d.name(), "') is ", at[k],
               ", outside the range [", d.min(), ", ",
               d.max() > 0 ? std::to_string(d.max()) : "inf", "] it was exported with");
  }
  std::vector<Tensor> args;
  for (size_t a = 0; a < inputs.size(); ++a) {
    const Tensor& t = inputs[a];
    const Port& p = s.inputs[a];
    KILN_CHECK(t.defined(), Value, what, ": input '", p.name, "' is undefined");
    KILN_CHECK(t.dtype() == p.dtype, Value, what, ": input '", p.name, "' is ",
               scalar_type_name(t.dtype()), "; the program takes ", scalar_type_name(p.dtype));
    KILN_CHECK(t.dim() == static_cast<int64_t>(p.dims.size()), Value, what, ": input '", p.name,
               "' has ", t.dim(), " dims; the program takes ", p.dims.size());
    for (size_t d = 0; d < p.dims.size(); ++d) {
      const Poly& want = s.arg_dims[a][d];
      const int64_t n = want.eval(at);
      if (t.size(static_cast<int64_t>(d)) == n) continue;
      if (want.is_constant())
        KILN_FAIL(Value, what, ": input '", p.name, "' dim ", d, " is ", t.size(d),
                  "; the program was exported with the static size ", n,
                  " there (declare it dynamic to vary it)");
      KILN_FAIL(Value, what, ": input '", p.name, "' dim ", d, " is ", t.size(d),
                "; the program needs ", p.dims[d], " = ", n, " there (", s.at_str(at), ")");
    }
    args.push_back(t.contiguous());
  }
  std::shared_ptr<const State::Instance> inst = s.instance(at);
  std::vector<Tensor> graph_in = inst->fixed;
  for (size_t a = 0; a < args.size(); ++a) {
    const TensorSpec& spec = inst->graph.value(inst->graph.inputs()[s.arg_input[a]]).meta;
    KILN_CHECK(args[a].device() == spec.device, Value, what, ": input '", s.inputs[a].name,
               "' is on ", args[a].device().str(), "; the program runs on ", spec.device.str());
    graph_in[s.arg_input[a]] = args[a];
  }
  autograd::NoGradGuard no_grad;
  return ir::run(inst->graph, graph_in, on_node);
}

TensorMap ExportedProgram::run_named(const TensorMap& inputs) const {
  std::vector<Tensor> in;
  for (const Port& p : s_->inputs) {
    auto it = inputs.find(p.name);
    KILN_CHECK(it != inputs.end(), Value, s_->what, ": no input named '", p.name, "'");
    in.push_back(it->second);
  }
  for (const auto& [name, t] : inputs) {
    bool known = false;
    for (const Port& p : s_->inputs) known = known || p.name == name;
    KILN_CHECK(known, Value, s_->what, ": the program has no input named '", name, "'");
  }
  std::vector<Tensor> out = run(in);
  TensorMap named;
  for (size_t k = 0; k < out.size(); ++k) named[s_->outputs[k].name] = out[k];
  return named;
}

}  // namespace kiln
