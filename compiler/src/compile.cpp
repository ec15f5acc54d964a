// kiln::compile: the cache of captured programs, guarded (Note [Guards]), and its history.
#include <iostream>

#include "kiln/compiler/compile.h"
#include "program.h"

namespace kiln::compiler {

const char* event_kind_name(Event::Kind k) {
  switch (k) {
    case Event::Kind::Capture: return "capture";
    case Event::Kind::Recompile: return "recompile";
    case Event::Kind::GraphBreak: return "graph break";
    case Event::Kind::Retry: return "retry";
    case Event::Kind::Fallback: return "fallback";
    case Event::Kind::Segment: return "segment";
  }
  return "?";
}

struct CompiledFunction::State {
  Fn fn;
  Options options;
  std::vector<std::shared_ptr<const detail::Program>> programs;
  // Guards of calls that cannot be captured (a graph break, a fallback): they run without
  // capturing again, eagerly, or in segments after a data read (Note [Graph break segments]).
  struct Uncaptured {
    std::shared_ptr<const detail::Program> guards;
    bool segments = false;
  };
  std::vector<Uncaptured> eager;
  detail::SegmentCache segments;
  std::vector<Event> events;
  int retries = 0;  // consecutive captures refused as Retry
  int64_t replays = 0;
  bool warned = false;
};

CompiledFunction::CompiledFunction(Fn fn, Options options) : s_(std::make_unique<State>()) {
  KILN_CHECK(fn != nullptr, Value, "kiln::compile: the function is empty");
  KILN_CHECK(options.recompile_limit >= 1, Value,
             "kiln::compile: recompile_limit must be at least 1, got ", options.recompile_limit);
  if (detail::fusion_enabled()) {
    std::string problem = detail::compiler_problem();
    KILN_CHECK(problem.empty(), Runtime, problem);
  }
  s_->fn = std::move(fn);
  s_->options = options;
}
CompiledFunction::~CompiledFunction() = default;
CompiledFunction::CompiledFunction(CompiledFunction&&) noexcept = default;
CompiledFunction& CompiledFunction::operator=(CompiledFunction&&) noexcept = default;

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& args) {
  State& s = *s_;
  // Inside an outer capture or segment: its ops join that graph.
  if (is_capturing() || detail::is_recording_segments()) return s.fn(args);
  std::string nearest;
  for (const auto& p : s.programs) {
    std::string miss = p->check_guards(args);
    if (miss.empty()) {
      ++s.replays;
      return p->run(args);
    }
    if (nearest.empty()) nearest = miss;
  }
  for (const State::Uncaptured& u : s.eager) {
    if (!u.guards->check_guards(args).empty()) continue;
    if (!u.segments) return s.fn(args);
    return detail::run_in_segments(s.segments, s.events, s.fn, args);
  }
  if (static_cast<int>(s.programs.size() + s.eager.size()) >= s.options.recompile_limit) {
    if (!s.warned) {
      s.warned = true;
      std::string why = "recompile limit (" + std::to_string(s.options.recompile_limit) +
                        ") reached; calls that miss every guard run eagerly (last miss: " +
                        nearest + ")";
      s.events.push_back({Event::Kind::Fallback, why});
      std::cerr << "kiln.compile: warning: " << why << "\n";
    }
    return s.fn(args);
  }
  detail::CaptureResult r = detail::capture(s.fn, args);
  if (r.program) {
    if (s.programs.empty() && s.eager.empty())
      s.events.push_back({Event::Kind::Capture, std::to_string(r.program->graph.nodes().size()) +
                                                    " ops, " +
                                                    std::to_string(r.program->graph.inputs().size()) +
                                                    " inputs"});
    else
      s.events.push_back({Event::Kind::Recompile, nearest.empty() ? "after a retry" : nearest});
    if (r.program->saved_before > 0)
      s.events.back().reason += "; saved activations " + std::to_string(r.program->saved_before) +
                                " -> " + std::to_string(r.program->saved_after) + " bytes";
    if (!r.program->kernels.empty())
      s.events.back().reason += "; " + std::to_string(r.program->kernels.size()) + " fused loops";
    if (!r.program->rewrites.empty())
      s.events.back().reason += "; rewrites: " + r.program->rewrites;
    if (!r.program->cache_note.empty()) s.events.back().reason += "; " + r.program->cache_note;
    s.programs.push_back(r.program);
    s.retries = 0;
    // See Note [Compiled backward]: the capture consumed the eager outputs' autograd graph; the
    // program's own run gives outputs whose backward is the compiled one.
    if (r.program->aot) return r.program->run(args);
  } else {
    s.events.push_back({r.refusal, r.reason});
    // A second retry in a row means the function makes new state on every call: stay eager.
    s.retries = r.refusal == Event::Kind::Retry ? s.retries + 1 : 0;
    if (r.refusal != Event::Kind::Retry || s.retries >= 2) {
      // Remember these guards so later matching calls stay eager without tracing again.
      detail::CaptureResult g = detail::capture(
          [&](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }, args);
      if (g.program) s.eager.push_back({g.program, r.segmentable});
    }
  }
  return r.outputs;
}

const std::vector<Event>& CompiledFunction::explain() const { return s_->events; }
int CompiledFunction::num_programs() const { return static_cast<int>(s_->programs.size()); }
int CompiledFunction::num_recompiles() const {
  int n = 0;
  for (const Event& e : s_->events) n += e.kind == Event::Kind::Recompile;
  return n;
}
int64_t CompiledFunction::num_replays() const { return s_->replays; }
int64_t CompiledFunction::num_segment_runs() const { return s_->segments.compiled_runs; }

std::pair<int64_t, int64_t> CompiledFunction::saved_activation_bytes(int i) const {
  KILN_CHECK(i >= 0 && i < num_programs(), Index, "kiln::compile: no program ", i, " (there are ",
             num_programs(), ")");
  return {s_->programs[i]->saved_before, s_->programs[i]->saved_after};
}

std::string CompiledFunction::graph_str(int i) const {
  KILN_CHECK(i >= 0 && i < num_programs(), Index, "kiln::compile: no program ", i, " (there are ",
             num_programs(), ")");
  const detail::Program& p = *s_->programs[i];
  std::string out = p.graph.str();
  for (const detail::FusedKernel& k : p.kernels) {  // Note [Fusion]
    out += "  fused " + k.name + ": nodes";
    for (size_t m : k.members) out += " " + std::to_string(m);
    out += " ->";
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      out += " %" + std::to_string(k.outputs[j]);
      if (k.reuse[j] >= 0)
        out += " (in %" + std::to_string(k.inputs[k.reuse[j]]) + ")";  // Note [Buffer reuse]
    }
    out += "\n";
  }
  return out;
}

void CompiledFunction::reset() {
  Fn fn = std::move(s_->fn);
  Options o = s_->options;
  s_ = std::make_unique<State>();
  s_->fn = std::move(fn);
  s_->options = o;
}

CompiledFunction compile(Fn fn, Options options) {
  return CompiledFunction(std::move(fn), options);
}

}  // namespace kiln::compiler
