// kiln::export_program: a function captured for inference, with its symbolic dims, as one file.
// See Note [Exported programs] and Note [Symbolic dims by differences] in
// kiln/exported_program.h.
#include "kiln/compiler/export.h"

#include <google/protobuf/util/message_differencer.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "file_format.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/exported_program.h"
#include "kiln/proto/codec.h"
#include "kiln/safetensors.h"
#include "kiln/scalar_type.h"
#include "symbolic.h"

namespace kiln {
namespace {

using exporting::Poly;

constexpr const char* kWhat = "kiln.export";

struct Symbol {
  std::string name;
  size_t input = 0;  // the first argument and dim that has it
  int64_t dim = 0;
  int64_t example = 0, min = 1, max = 0;
  int64_t alt = 0, third = 0;  // the other sizes captured (Note [Symbolic dims by differences])
};

// The symbols of `o`, each with the sizes to capture it at, and per argument and dim the symbol
// there (-1: static).
std::vector<Symbol> symbols_of(const ExportOptions& o, const std::vector<Tensor>& args,
                               std::vector<std::vector<int>>* dim_symbol) {
  std::vector<Symbol> syms;
  dim_symbol->clear();
  for (const Tensor& a : args) dim_symbol->emplace_back(a.dim(), -1);
  for (const DynamicDim& d : o.dynamic_dims) {
    KILN_CHECK(!d.name.empty(), Value, kWhat, ": a dynamic dim needs a name");
    KILN_CHECK(d.input < args.size(), Index, kWhat, ": dynamic dim '", d.name, "' names input ",
               d.input, " of a function with ", args.size(), " inputs");
    const Tensor& a = args[d.input];
    const int64_t dim = d.dim < 0 ? d.dim + a.dim() : d.dim;
    KILN_CHECK(dim >= 0 && dim < a.dim(), Index, kWhat, ": dynamic dim '", d.name, "' is dim ",
               d.dim, " of input ", d.input, ", which has ", a.dim(), " dims");
    KILN_CHECK((*dim_symbol)[d.input][dim] < 0, Value, kWhat, ": dim ", dim, " of input ", d.input,
               " is declared dynamic twice");
    const int64_t v = a.size(dim);
    KILN_CHECK(v >= 2, Value, kWhat, ": dynamic dim '", d.name, "' (dim ", dim, " of input ",
               d.input, ") has example size ", v,
               "; give an example of at least 2 (sizes 0 and 1 specialize the program)");
    KILN_CHECK(d.min >= 0 && (d.max == 0 || d.max >= d.min), Value, kWhat, ": dynamic dim '",
               d.name, "' has the range [", d.min, ", ", d.max, "]");
    KILN_CHECK(v >= d.min && (d.max == 0 || v <= d.max), Value, kWhat, ": dynamic dim '", d.name,
               "' has example size ", v, ", outside its range [", d.min, ", ", d.max, "]");
    int s = 0;
    while (s < static_cast<int>(syms.size()) && syms[s].name != d.name) ++s;
    if (s == static_cast<int>(syms.size())) {
      syms.push_back({d.name, d.input, dim, v, d.min, d.max});
    } else {
      Symbol& sym = syms[s];
      KILN_CHECK(sym.example == v, Value, kWhat, ": dynamic dim '", d.name, "' is ", sym.example,
                 " in input ", sym.input, " dim ", sym.dim, " but ", v, " in input ", d.input,
                 " dim ", dim);
      sym.min = std::max(sym.min, d.min);
      if (d.max > 0) sym.max = sym.max > 0 ? std::min(sym.max, d.max) : d.max;
    }
    (*dim_symbol)[d.input][dim] = s;
  }
  for (Symbol& sym : syms) {
    std::vector<int64_t> picks;
    for (int64_t step = 1; picks.size() < 2 && step <= 8; ++step) {
      for (int64_t c : {sym.example + step, sym.example - step})
        if (c >= std::max<int64_t>(2, sym.min) && (sym.max == 0 || c <= sym.max) &&
            picks.size() < 2)
          picks.push_back(c);
    }
    KILN_CHECK(picks.size() == 2, Value, kWhat, ": dynamic dim '", sym.name, "' (example ",
               sym.example, ", range [", sym.min, ", ", sym.max,
               "]) leaves no room for two more sizes of at least 2 to capture it at");
    sym.alt = picks[0];
    sym.third = picks[1];
  }
  return syms;
}

// `t` with dim `dim` made `n` long by repeating its slices cyclically (the values stay valid
// inputs: token ids stay in the vocabulary).
Tensor resized(const Tensor& t, int64_t dim, int64_t n) {
  Tensor idx = empty_on({n}, kInt64, t.device().is_cpu() ? t.device() : Device(kCPU));
  int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = i % t.size(dim);
  return t.index_select(dim, idx.to(std::nullopt, t.device())).contiguous();
}

proto::TensorSpec spec_proto(const TensorSpec& s) {
  proto::TensorSpec p;
  p.set_dtype(scalar_type_name(s.dtype));
  for (int64_t v : s.sizes) p.add_sizes(v);
  for (int64_t v : s.strides) p.add_strides(v);
  p.set_offset(s.offset);
  p.set_device(s.device.str());
  return p;
}

struct Capture {
  compiler::ExportedStep step;
  proto::ExportedProgram msg;  // graph, inputs (kinds only) and output_specs
};

// Refuses a graph that writes into one of its inputs (a weight or an argument), or a view of one.
void check_no_input_writes(const compiler::ExportedStep& s, const ExportOptions& o) {
  const ir::Graph& g = s.graph;
  std::vector<ir::ValueId> root(g.num_values(), -1);
  for (ir::ValueId v : g.inputs()) root[v] = v;
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const ir::Node& n = g.nodes()[k];
    const OpInfo& info = n.op->info();
    for (int a = 0; a < info.num_args && a < static_cast<int>(n.args.size()); ++a) {
      if (!info.args[a].is_mutable && !(a == 0 && info.is_inplace)) continue;
      for (ir::ValueId v : n.args[a].values()) {
        if (root[v] < 0) continue;
        size_t i = 0;
        while (g.inputs()[i] != root[v]) ++i;
        const int arg = s.arg_of_input[i];
        KILN_FAIL(Value, kWhat, ": node ", k, " '", n.op_name, "' writes into ",
                  arg >= 0 ? "input '" + o.input_names[arg] + "'"
                           : "a weight (" + ir::spec_str(g.value(root[v]).meta) + ")",
                  "; an exported program may not change its inputs or weights (a BatchNorm or a "
                  "Dropout in training mode: call eval() first)");
      }
    }
    for (ir::ValueId out : n.outputs) {
      const int alias = g.value(out).meta.alias_of;
      if (alias >= 0 && alias < static_cast<int>(n.args.size()) && n.args[alias].is_value())
        root[out] = root[n.args[alias].values()[0]];
    }
  }
}

std::string sizes_str(const std::vector<Symbol>& syms, const std::vector<int64_t>& at) {
  std::string s;
  for (size_t i = 0; i < syms.size(); ++i)
    s += (i ? ", " : "") + syms[i].name + "=" + std::to_string(at[i]);
  return s;
}

Capture capture_at(const compiler::Fn& fn, const std::vector<Tensor>& examples,
                   const std::vector<std::vector<int>>& dim_symbol,
                   const std::vector<int64_t>& sizes, const ExportOptions& o,
                   const std::string& where) {
  std::vector<Tensor> args;
  for (size_t i = 0; i < examples.size(); ++i) {
    Tensor t = examples[i];
    for (int64_t d = 0; d < t.dim(); ++d)
      if (const int s = dim_symbol[i][d]; s >= 0 && t.size(d) != sizes[s])
        t = resized(t, d, sizes[s]);
    args.push_back(t);
  }
  Capture c;
  {
    autograd::NoGradGuard no_grad;
    try {
      c.step = compiler::export_step(fn, args);
    } catch (const Error& e) {
      KILN_FAIL(Value, kWhat, ": the function cannot be exported", where, ": ", e.what());
    } catch (const std::exception& e) {
      if (where.empty()) throw;  // the function's own error, at the caller's example sizes
      KILN_FAIL(Value, kWhat, ": the function failed", where, ": ", e.what());
    }
  }
  const compiler::ExportedStep& s = c.step;
  if (s.rng_count > 0) {  // a program file holds no generator state to draw from yet
    std::string op = "a random op";
    for (const ir::Node& n : s.graph.nodes())
      if (n.rng || ir::seed_offset_args(*n.op).first >= 0) {
        op = "op '" + n.op_name + "'";
        break;
      }
    KILN_FAIL(NotImplemented, kWhat, ": ", op,
              " draws random numbers; an exported program cannot hold random ops yet (call "
              "eval() for dropout)");
  }
  for (size_t k = 0; k < s.outputs.size(); ++k)
    KILN_CHECK(s.outputs[k] >= 0, Value, kWhat, ": output ", k,
               " is an undefined tensor; an exported program returns tensors");
  KILN_CHECK(!s.outputs.empty(), Value, kWhat, ": the function returns no tensors");
  check_no_input_writes(s, o);
  *c.msg.mutable_graph() = proto::encode_graph(s.graph);
  for (size_t i = 0; i < s.graph.inputs().size(); ++i) {
    proto::ExportedInput* in = c.msg.add_inputs();
    if (s.arg_of_input[i] >= 0)
      in->set_argument(o.input_names[s.arg_of_input[i]]);
    else if (compiler::constant_input(s.graph, i).defined())
      in->set_constant(true);
    else
      in->set_weight("");  // named once the captures agree
  }
  for (ir::ValueId v : s.graph.outputs())
    *c.msg.add_output_specs() = spec_proto(s.graph.value(v).meta);
  return c;
}

// Refuses a capture that is not `base` with other integers (Note [Symbolic dims by
// differences]).
void check_same_structure(const Capture& base, const Capture& c, const std::vector<Symbol>& syms,
                          const std::vector<int64_t>& base_at, const std::vector<int64_t>& at) {
  const std::string where =
      " with " + sizes_str(syms, base_at) + " and with " + sizes_str(syms, at);
  bool same = base.step.arg_of_input == c.step.arg_of_input;
  for (size_t i = 0; same && i < base.step.captured.size(); ++i)  // weights, by identity
    same = base.msg.inputs(static_cast<int>(i)).kind_case() ==
               c.msg.inputs(static_cast<int>(i)).kind_case() &&
           (!base.msg.inputs(static_cast<int>(i)).has_weight() ||
            base.step.captured[i].impl() == c.step.captured[i].impl());
  KILN_CHECK(same, Value, kWhat, ": the function reads other tensors", where,
             "; a dynamic dim must not change which weights it uses");
  proto::ExportedProgram a = base.msg, b = c.msg;
  exporting::zero_int_slots(&a);
  exporting::zero_int_slots(&b);
  google::protobuf::util::MessageDifferencer diff;
  std::string report;
  diff.ReportDifferencesToString(&report);
  if (diff.Compare(a, b)) return;
  if (report.size() > 600) report = report.substr(0, 600) + " ...";
  KILN_FAIL(Value, kWhat, ": the function records a different program", where,
            " (a Python branch on a size, or a float computed from one?); the first differences, "
            "sizes and int attributes aside:\n",
            report);
}

// Every integer of base.msg that depends on the symbols, fitted (Note [Symbolic dims by
// differences]).
void fit_symbols(proto::ExportedProgram* out, const std::vector<Capture>& caps,
                 const std::vector<std::vector<int64_t>>& points, const std::vector<Symbol>& syms) {
  std::vector<std::vector<exporting::IntSlot>> slots;
  for (const Capture& c : caps) slots.push_back(exporting::int_slots(c.msg));
  std::vector<std::string> names;
  for (const Symbol& s : syms) names.push_back(s.name);
  for (size_t k = 0; k < slots[0].size(); ++k) {
    std::vector<int64_t> values;
    for (size_t c = 0; c < caps.size(); ++c) {
      KILN_ASSERT(slots[c].size() == slots[0].size() && slots[c][k].path == slots[0][k].path);
      values.push_back(slots[c][k].value);
    }
    Poly p;
    const std::string why = exporting::fit(points, values, &p);
    KILN_CHECK(
        why.empty(), Value, kWhat, ": ", exporting::slot_str(caps[0].msg, slots[0][k].path),
        " depends on the dynamic dims (",
        [&] {
          std::string s;
          for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
          return s;
        }(),
        ") in a way an exported program cannot express: ", why);
    if (p.is_constant()) continue;
    proto::SymbolicInt* si = out->add_symbolic();
    for (int32_t v : slots[0][k].path) si->add_path(v);
    si->set_constant(p.constant);
    for (const Poly::Term& t : p.terms) {
      proto::SymbolicTerm* pt = si->add_terms();
      pt->set_coefficient(t.coefficient);
      for (int s : t.symbols) pt->add_symbols(s);
    }
  }
}

// Names for the weights the program reads: the caller's names, by identity or as a view of the
// same storage and geometry; "weight<k>" for the rest.
void name_weights(proto::ExportedProgram* msg, const compiler::ExportedStep& s,
                  const ExportOptions& o, TensorMap* weights) {
  std::set<std::string> used;
  for (const auto& [name, t] : o.weight_names) used.insert(name);
  int next = 0;
  for (int i = 0; i < msg->inputs_size(); ++i) {
    if (!msg->inputs(i).has_weight()) continue;
    const Tensor& t = s.captured[i];
    std::string name;
    for (const auto& [n, w] : o.weight_names) {
      if (!w.defined()) continue;
      if (w.is_same(t) ||
          (w.is_alias_of(t) && w.sizes() == t.sizes() && w.strides() == t.strides() &&
           w.storage_offset() == t.storage_offset() && w.dtype() == t.dtype())) {
        name = n;
        break;
      }
    }
    if (name.empty()) {
      do name = "weight" + std::to_string(next++);
      while (used.count(name));
    }
    msg->mutable_inputs(i)->set_weight(name);
    if (weights->count(name)) continue;
    // Stored contiguous; a view at an offset or with other strides is stored as its whole
    // storage, flat, and rebuilt with as_strided at load (Note [Exported programs]).
    Tensor stored;
    if (t.is_contiguous() && t.storage_offset() == 0) {
      stored = t.detach().contiguous().clone();
    } else {
      const int64_t n = static_cast<int64_t>(t.impl()->storage()->nbytes() / t.element_size());
      stored = t.detach().as_strided({n}, {1}, 0).clone();
    }
    weights->emplace(name, stored);
  }
}

}  // namespace

std::string export_program_bytes(const compiler::Fn& fn, const std::vector<Tensor>& example_args,
                                 const ExportOptions& options) {
  KILN_CHECK(fn != nullptr, Value, kWhat, ": the function is empty");
  ExportOptions o = options;
  if (o.input_names.empty())
    for (size_t i = 0; i < example_args.size(); ++i)
      o.input_names.push_back("input" + std::to_string(i));
  KILN_CHECK(o.input_names.size() == example_args.size(), Value, kWhat, ": ", o.input_names.size(),
             " input names for ", example_args.size(), " inputs");
  KILN_CHECK(std::set<std::string>(o.input_names.begin(), o.input_names.end()).size() ==
                 o.input_names.size(),
             Value, kWhat, ": input names repeat");
  std::vector<Tensor> examples;
  for (size_t i = 0; i < example_args.size(); ++i) {
    const Tensor& a = example_args[i];
    KILN_CHECK(a.defined(), Value, kWhat, ": input '", o.input_names[i], "' is undefined");
    examples.push_back(a.detach().contiguous().clone());
  }
  std::vector<std::vector<int>> dim_symbol;
  const std::vector<Symbol> syms = symbols_of(o, examples, &dim_symbol);

  std::vector<int64_t> example, alt, third;
  for (const Symbol& s : syms) {
    example.push_back(s.example);
    alt.push_back(s.alt);
    third.push_back(s.third);
  }
  const std::vector<std::vector<int64_t>> points =
      syms.empty() ? std::vector<std::vector<int64_t>>{{}}
                   : exporting::capture_points(example, alt, third);
  std::vector<Capture> caps;
  for (const auto& at : points) {
    const std::string where =
        caps.empty() ? ""
                     : " at " + sizes_str(syms, at) +
                           " (it runs at other sizes of its dynamic dims to keep them symbolic)";
    caps.push_back(capture_at(fn, examples, dim_symbol, at, o, where));
    if (caps.size() > 1) check_same_structure(caps[0], caps.back(), syms, points[0], at);
  }
  const Capture& base = caps[0];
  const size_t n_out = base.step.outputs.size();
  if (o.output_names.empty())
    for (size_t k = 0; k < n_out; ++k) o.output_names.push_back("output" + std::to_string(k));
  KILN_CHECK(o.output_names.size() == n_out, Value, kWhat, ": ", o.output_names.size(),
             " output names for a function with ", n_out, " outputs");

  proto::ExportedProgram msg = base.msg;
  for (const std::string& n : o.output_names) msg.add_output_names(n);
  msg.set_producer("kiln " KILN_VERSION);
  const std::vector<ir::ValueId>& gin = base.step.graph.inputs();
  for (const Symbol& s : syms) {
    proto::SymbolicDim* d = msg.add_dims();
    d->set_name(s.name);
    int input = 0;  // the graph input of argument s.input
    while (base.step.arg_of_input[input] != static_cast<int>(s.input)) ++input;
    KILN_ASSERT(input < static_cast<int>(gin.size()));
    d->set_input(input);
    d->set_dim(static_cast<int32_t>(s.dim));
    d->set_example(s.example);
    d->set_min(s.min);
    d->set_max(s.max);
  }
  if (!syms.empty()) fit_symbols(&msg, caps, points, syms);
  TensorMap weights;
  name_weights(&msg, base.step, o, &weights);
  return exporting::pack(msg.SerializeAsString(),
                         safetensors_to_bytes(weights, {{"format", "kiln exported program"}}));
}

void export_program(const std::string& path, const compiler::Fn& fn,
                    const std::vector<Tensor>& example_args, const ExportOptions& options) {
  const std::string bytes = export_program_bytes(fn, example_args, options);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(f.good(), Value, kWhat, ": cannot write ", tmp);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    KILN_CHECK(f.good(), Runtime, kWhat, ": writing ", tmp, " failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    KILN_FAIL(Runtime, kWhat, ": cannot rename ", tmp, " to ", path, ": ", ec.message());
  }
}

}  // namespace kiln
