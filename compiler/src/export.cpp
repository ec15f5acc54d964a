// export_step: a step captured once, as recorded. See Note [Exported steps] in
// kiln/compiler/export.h.
#include "kiln/compiler/export.h"

#include "kiln/tensor_impl.h"
#include "program.h"

namespace kiln::compiler {
namespace {

std::string input_str(const detail::Program& p, size_t i) {
  const ir::ValueId v = p.graph.inputs()[i];
  return "%" + std::to_string(v) + " (" + ir::spec_str(p.graph.value(v).meta) + ")";
}

// The first thing in `p` a replay cannot reproduce, as the error to raise.
void check_replayable(const detail::Program& p) {
  using Kind = detail::InputSource::Kind;
  KILN_CHECK(!p.aot, NotImplemented,
             "export_step: the step returns a value that needs autograd and runs no backward "
             "itself; a batch job never runs a backward of its outputs: run the backward and the "
             "optimizer step inside the step, or run it under no_grad");
  for (size_t i = 0; i < p.sources.size(); ++i) {
    const detail::InputSource& s = p.sources[i];
    KILN_CHECK(s.kind != Kind::GradOf && s.kind != Kind::GradOutput, Value,
               "export_step: the step reads input ", input_str(p, i),
               " as the .grad of an earlier value, which a batch job does not keep between steps: "
               "zero the gradients with set_to_none at the start of the step");
  }
  const auto& nodes = p.graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node& n = nodes[i];
    KILN_CHECK(!p.generators[i], NotImplemented, "export_step: op '", n.op_name,
               "' draws from an explicit generator; only the default generator's random ops can "
               "be replayed (draw from it instead)");
  }
}

}  // namespace

ExportedStep export_step(const Fn& fn, const std::vector<Tensor>& args) {
  KILN_CHECK(fn != nullptr, Value, "export_step: the function is empty");
  KILN_CHECK(!is_capturing(), Value, "export_step: called inside a capture (kiln.compile)");
  detail::CaptureResult r = detail::capture(fn, args, /*rewrite_first=*/false, /*raw=*/true);
  if (!r.program) {
    const bool retry = r.refusal == Event::Kind::Retry;
    KILN_FAIL(Value, "export_step: the step cannot be exported: ", r.reason,
              retry ? "; run one step eagerly first so the optimizer state exists" : "");
  }
  detail::Program& p = *r.program;
  check_replayable(p);
  p.grad_writes.clear();  // a batch job keeps no gradients
  detail::dead_code_elimination(p);
  std::vector<std::string> problems = ir::verify(p.graph);
  KILN_CHECK(problems.empty(), Value, "export_step: the captured graph does not verify: ",
             problems.empty() ? "" : problems[0]);

  ExportedStep s;
  for (const detail::InputSource& src : p.sources) {
    s.arg_of_input.push_back(src.kind == detail::InputSource::Kind::Arg ? src.index : -1);
    s.captured.push_back(src.kind == detail::InputSource::Kind::Captured ? src.tensor : Tensor());
  }
  int next = 0;
  for (ir::ValueId v : p.outputs) s.outputs.push_back(v >= 0 ? next++ : -1);
  s.graph = std::move(p.graph);
  s.rng_seed = p.rng_seed, s.rng_offset = p.rng_offset, s.rng_count = p.rng_count;
  return s;
}

Tensor constant_input(const ir::Graph& g, size_t i) {
  KILN_CHECK(i < g.inputs().size(), Index, "constant_input: no input ", i, " (the graph has ",
             g.inputs().size(), ")");
  const ir::Value& v = g.value(g.inputs()[i]);
  if (!v.meta.wrapped_number || !v.number || !v.meta.sizes.ref().empty()) return Tensor();
  Tensor t = scalar_tensor_of(*v.number, v.meta.dtype, v.meta.device);
  t.impl()->set_wrapped_number(true);
  return t;
}

}  // namespace kiln::compiler
