// Functionalization and pattern rewrites over a captured program's graph (the FX role, with
// passes.cpp).
//
// Note [Functionalization]: an in-place op writes a storage that other values may share, so
// the passes treat it as an effect (Note [Passes]): nothing is merged across it, folding and DCE
// keep it, and fusion stops at it. This pass turns it into its functional form, `add_(x, y)`
// into `add(x, y)`, `fill_(t, v)` into `full(t.sizes(), v)`, `copy_(t, s)` into `clone(s)` (or
// `_to_copy` to t's dtype and device), and later reads of its result read the new value, when
// that changes nothing anyone can see:
// - the written tensor is a whole storage the program allocated itself (not a graph input, not
//   a view of one), reached through in-place results only;
// - after the write, nothing reads that storage through a value made before it (an older view
//   or the pre-write value), and no program result is such a value;
// - the functional form gives the in-place result's exact geometry and dtype.
// Writes into tensors the program does not own (parameters, optimizer state, .grad buffers,
// through views of them) are the program's effects and stay in place: they are the writes put
// back, once, where eager made them. A write through a view of a fresh storage stays in place
// too (the op table has no scatter-into-view rows to express it functionally).
//
// Note [Pattern rewrites]: a rewrite is a pattern written as the calls it matches,
// "view(bmm(x, y))": ops by name with their tensor arguments in schema order, lower-case leaves
// binding values (a name used twice must bind the same value), `name:op(...)` binding the node.
// The rewriter tries every pattern at every node's output; a match's interior nodes must be
// pure, and each interior value, views included, must be read only inside the match: the point
// is to stop computing it (a backward that reads the attention's probabilities through a view
// keeps the attention written out). The rewrite's builder checks what a pattern cannot say
// (attributes, geometry, a constant's data), adds its replacement right before the matched
// root, and redirects the root's readers to it; DCE then drops the matched nodes. One match per
// sweep, until none applies.
#include <cmath>
#include <functional>
#include <map>

#include "kiln/dispatcher.h"
#include "program.h"

namespace kiln::compiler::detail {

namespace {

// The value that allocated `v`'s storage, through views and in-place results.
ir::ValueId store_of(const Program& p, const std::vector<int64_t>& prod, ir::ValueId v) {
  for (ir::ValueId a = aliased_arg(p, prod, v); a >= 0; a = aliased_arg(p, prod, v = a)) {
  }
  return v;
}

// True when `v` is its whole storage: the allocation itself or in-place results on it.
bool whole_storage(const Program& p, const std::vector<int64_t>& prod, ir::ValueId v) {
  for (ir::ValueId a = aliased_arg(p, prod, v); a >= 0; a = aliased_arg(p, prod, v = a))
    if (p.graph.nodes()[prod[v]].op->info().is_view) return false;
  return true;
}

// Records `op` on `args` and, when its one output has `want`'s geometry, moves it to index `at`
// in place of the node there: the new output, or -1 (the graph is unchanged but for an unused
// value).
ir::ValueId replace_node(Program& p, size_t at, const std::string& op,
                         std::vector<ir::NodeArg> args, const TensorSpec& want) {
  if (Dispatcher::get().find(op) == nullptr) return -1;
  std::vector<ir::Node>& nodes = p.graph.nodes();
  std::vector<ir::ValueRef> outs;
  try {
    outs = p.graph.add_node(op, std::move(args));
  } catch (const Error&) {
    return -1;
  }
  if (outs.size() != 1 || !same_geometry(p.graph.value(outs[0].id).meta, want)) {
    nodes.pop_back();
    return -1;
  }
  nodes[at] = std::move(nodes.back());
  nodes.pop_back();
  return outs[0].id;
}

// Functionalizes node i if Note [Functionalization] allows: its new output, or -1.
ir::ValueId functionalize_node(Program& p, const std::vector<int64_t>& prod, size_t i) {
  const ir::Node& n = p.graph.nodes()[i];
  const OpInfo& info = n.op->info();
  if (!info.is_inplace || info.is_out || n.outputs.size() != 1 || n.rng || p.generators[i] ||
      info.tags.has(OpTag::Collective))
    return -1;
  const ir::ValueId out = n.outputs[0];
  const ir::ValueId w = aliased_arg(p, prod, out);
  if (w < 0) return -1;
  const ir::ValueId store = store_of(p, prod, w);
  if (prod[store] < 0 || !whole_storage(p, prod, w)) return -1;
  // Nothing may read the storage through an older value after the write.
  auto older = [&](ir::ValueId u) {
    return prod[u] < static_cast<int64_t>(i) && store_of(p, prod, u) == store;
  };
  const auto& nodes = p.graph.nodes();
  for (size_t j = i + 1; j < nodes.size(); ++j)
    for (ir::ValueId u : nodes[j].inputs())
      if (older(u)) return -1;
  const std::vector<bool> results = program_results(p);
  for (ir::ValueId u = 0; u < static_cast<ir::ValueId>(results.size()); ++u)
    if (results[u] && older(u)) return -1;
  const TensorSpec want = p.graph.value(out).meta;
  const std::string name = info.name;
  if (name == "fill_")
    return replace_node(p, i, "full",
                        {std::vector<int64_t>(want.sizes.begin(), want.sizes.end()), n.args[1],
                         IValue(want.dtype), IValue(want.device)},
                        want);
  if (name == "copy_") {
    const ir::ValueId src = n.args[1].values()[0];
    const TensorSpec& s = p.graph.value(src).meta;
    if (s.sizes.ref() != want.sizes.ref()) return -1;  // a broadcasting copy stays
    if (s.dtype == want.dtype && s.device == want.device)
      return replace_node(p, i, "clone", {ir::ValueRef{src}}, want);
    return replace_node(p, i, "_to_copy",
                        {ir::ValueRef{src}, IValue(want.dtype), IValue(want.device)}, want);
  }
  if (name.size() < 2 || name.back() != '_') return -1;
  return replace_node(p, i, name.substr(0, name.size() - 1), n.args, want);
}

}  // namespace

int functionalize(Program& p) {
  int done = 0;
  std::vector<int64_t> prod = producers(p);
  for (size_t i = 0; i < p.graph.nodes().size(); ++i) {
    const ir::ValueId old = p.graph.nodes()[i].outputs.empty() ? -1 : p.graph.nodes()[i].outputs[0];
    const ir::ValueId fresh = functionalize_node(p, prod, i);
    if (fresh < 0) continue;
    replace_uses(p, old, fresh);
    prod = producers(p);
    ++done;
  }
  return done;
}

// ---- pattern rewrites ------------------------------------------------------------------------

namespace {

struct Pattern {
  std::string op;         // empty: a leaf
  std::string name;       // a leaf's binding, or the node's (name:op(...))
  bool optional = false;  // op?(x, ...): the node, or its first argument's pattern in its place
  std::vector<Pattern> args;
};

Pattern parse(std::string_view& s) {
  auto skip = [&] {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  };
  auto word = [&] {
    skip();
    size_t k = 0;
    while (k < s.size() &&
           (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_' || s[k] == '?'))
      ++k;
    std::string w(s.substr(0, k));
    s.remove_prefix(k);
    skip();
    return w;
  };
  Pattern pat;
  std::string w = word();
  if (!s.empty() && s.front() == ':') {
    s.remove_prefix(1);
    pat.name = w;
    w = word();
  }
  if (s.empty() || s.front() != '(') {
    KILN_ASSERT(pat.name.empty() && !w.empty(), "bad rewrite pattern near '", s, "'");
    pat.name = w;
    return pat;
  }
  pat.op = w;
  s.remove_prefix(1);
  if (!pat.op.empty() && pat.op.back() == '?') {
    pat.op.pop_back();
    pat.optional = true;
  }
  for (;;) {
    pat.args.push_back(parse(s));
    skip();
    KILN_ASSERT(!s.empty(), "unterminated rewrite pattern");
    const char c = s.front();
    s.remove_prefix(1);
    if (c == ')') break;
    KILN_ASSERT(c == ',', "bad rewrite pattern near '", s, "'");
  }
  return pat;
}

Pattern pattern(std::string_view text) {
  Pattern p = parse(text);
  KILN_ASSERT(text.empty(), "trailing text in rewrite pattern: '", text, "'");
  return p;
}

struct Match {
  std::map<std::string, ir::ValueId> values;
  std::map<std::string, size_t> nodes;
};

struct Matcher {
  const Program& p;
  std::vector<int64_t> prod;
  std::vector<int> uses;  // reads by nodes and program results

  explicit Matcher(const Program& prog) : p(prog), prod(producers(prog)) {
    uses.assign(static_cast<size_t>(p.graph.num_values()), 0);
    for (const ir::Node& n : p.graph.nodes())
      for (ir::ValueId u : n.inputs()) ++uses[u];
    const std::vector<bool> results = program_results(p);
    for (size_t v = 0; v < results.size(); ++v) uses[v] += results[v];
  }

  bool match(const Pattern& pat, ir::ValueId v, Match& m, bool root) const {
    if (pat.op.empty()) {
      auto [it, fresh] = m.values.emplace(pat.name, v);
      return fresh || it->second == v;
    }
    if (pat.optional) {
      Match with = m;
      Pattern node = pat;
      node.optional = false;
      if (match(node, v, with, root)) {
        m = std::move(with);
        return true;
      }
      return match(pat.args[0], v, m, root);
    }
    if (prod[v] < 0) return false;
    const size_t i = static_cast<size_t>(prod[v]);
    const ir::Node& n = p.graph.nodes()[i];
    if (n.op_name != pat.op || n.outputs.size() != 1 || n.rng || has_effects(p, i)) return false;
    if (!root && uses[v] != 1) return false;
    std::vector<ir::ValueId> vals;
    for (const ir::NodeArg& a : n.args) {
      if (a.is_value_list()) return false;
      if (a.is_value()) vals.push_back(a.values()[0]);
    }
    if (vals.size() != pat.args.size()) return false;
    if (!pat.name.empty()) m.nodes[pat.name] = i;
    for (size_t k = 0; k < vals.size(); ++k)
      if (!match(pat.args[k], vals[k], m, false)) return false;
    return true;
  }
};

using Builder = std::function<ir::ValueId(Program&, const Match&, GraphEdit&, size_t at)>;

struct Rewrite {
  const char* name;
  std::vector<Pattern> patterns;
  Builder build;
};

const TensorSpec& spec(const Program& p, ir::ValueId v) { return p.graph.value(v).meta; }
const IValue& attr(const Program& p, const Match& m, const char* node, size_t arg) {
  return p.graph.nodes()[m.nodes.at(node)].args[arg].attribute();
}

// Adds `op` before `at` and returns its first output when it has the geometry of the value it
// replaces (`want`); otherwise -1 (the added node is dead, and DCE drops it).
ir::ValueId add_if_same(Program& p, GraphEdit& ed, size_t at, const char* op,
                        std::vector<ir::NodeArg> args, ir::ValueId want) {
  std::vector<ir::ValueId> outs;
  try {
    outs = ed.add_before(at, op, std::move(args), p.phases[at]);
  } catch (const Error&) {
    return -1;
  }
  return same_geometry(spec(p, outs[0]), spec(p, want)) ? outs[0] : -1;
}

// The captured constant behind graph input `v`, or an undefined tensor.
Tensor constant(const Program& p, ir::ValueId v) {
  const auto& in = p.graph.inputs();
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k] == v && p.sources[k].kind == InputSource::Kind::Captured) return p.sources[k].tensor;
  return {};
}

// Whether `mask` is the causal mask of an (n, n) score matrix: true exactly above the diagonal.
bool is_causal_mask(const Tensor& mask, int64_t n) {
  if (!mask.defined() || mask.dtype() != kBool || !mask.device().is_cpu() || mask.dim() != 2 ||
      mask.size(0) != n || mask.size(1) != n)
    return false;
  const Tensor c = mask.contiguous();
  const bool* d = c.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      if (d[i * n + j] != (j > i)) return false;
  return true;
}

// Note [Attention rewrite]: the written-out attention, as matmul records it for (..., L, E)
// inputs, softmax((q @ k^T) / c [masked with the causal mask]) @ v, becomes one
// `_fused_attention(q, k, v, 0, is_causal, 1/c)`, which never makes the (L, S) matrix (Note
// [Fused attention] in kernels/cpu/attention.cpp). Its expands must be no-ops, its transpose
// must swap the last two dims, the softmax must be over the last dim in the input's dtype, and
// a mask must be a captured constant whose data is the causal mask (-inf exactly above the
// diagonal of a square matrix). Scaling by 1/c inside the kernel rather than dividing the scores
// by c changes the last bits of a result (reassociation), not more.
ir::ValueId build_attention(Program& p, const Match& m, GraphEdit& ed, size_t at) {
  const ir::ValueId q = m.values.at("q"), k = m.values.at("k"), v = m.values.at("v");
  const TensorSpec &sq = spec(p, q), &sk = spec(p, k), &sv = spec(p, v);
  const int64_t r = static_cast<int64_t>(sq.sizes.size());
  if (r < 3 || static_cast<int64_t>(sk.sizes.size()) != r ||
      static_cast<int64_t>(sv.sizes.size()) != r)
    return -1;
  for (const char* e : {"eq", "ek", "ev", "ea"}) {  // expands that change nothing
    const ir::Node& n = p.graph.nodes()[m.nodes.at(e)];
    if (spec(p, n.outputs[0]).sizes.ref() != spec(p, n.args[0].values()[0]).sizes.ref()) return -1;
  }
  const int64_t d0 = attr(p, m, "kt", 1).to_int(), d1 = attr(p, m, "kt", 2).to_int();
  const int64_t a0 = d0 < 0 ? d0 + r : d0, a1 = d1 < 0 ? d1 + r : d1;
  if (std::min(a0, a1) != r - 2 || std::max(a0, a1) != r - 1) return -1;
  const int64_t sm_dim = attr(p, m, "sm", 1).to_int();
  if ((sm_dim != -1 && sm_dim != r - 1) || !attr(p, m, "sm", 2).is_none()) return -1;
  bool causal = false;
  if (m.nodes.count("mf")) {
    const double fill = attr(p, m, "mf", 2).to_double();
    if (!(std::isinf(fill) && fill < 0)) return -1;
    const int64_t L = sq.sizes[r - 2];
    if (sk.sizes[r - 2] != L || !is_causal_mask(constant(p, m.values.at("mask")), L)) return -1;
    causal = true;
  }
  const std::optional<Scalar>& c = spec(p, m.values.at("c")).wrapped_number
                                       ? p.graph.value(m.values.at("c")).number
                                       : std::optional<Scalar>();
  if (!c || c->to_double() == 0) return -1;
  const bool divide = p.graph.nodes()[m.nodes.at("scale")].op_name == "div";
  if (divide && !attr(p, m, "scale", 2).is_none()) return -1;  // a rounding mode
  const double scale = divide ? 1.0 / c->to_double() : c->to_double();
  return add_if_same(p, ed, at, "_fused_attention",
                     {ir::ValueRef{q}, ir::ValueRef{k}, ir::ValueRef{v}, 0.0, causal, IValue(scale),
                      int64_t{0}, int64_t{0}},
                     p.graph.nodes()[at].outputs[0]);
}

const std::vector<Rewrite>& rewrites() {
  static const std::vector<Rewrite> all = [] {
    // matmul's records of q @ k^T and a @ v for (..., L, E) operands: expand, a copy where the
    // operand is not contiguous, view to 3-d, bmm, view back.
    auto attention = [](const std::string& scale_op) {
      const std::string scores =
          "view(bmm(view(clone?(eq:expand(q))), view(clone?(ek:expand(kt:transpose(k))))))";
      return pattern("view(bmm(view(clone?(ea:expand(sm:softmax(mf:masked_fill?(scale:" + scale_op +
                     "(" + scores + ", c), mask))))), view(clone?(ev:expand(v)))))");
    };
    std::vector<Rewrite> r;
    r.push_back({"attention", {attention("div"), attention("mul")}, &build_attention});
    r.push_back({"silu",
                 {pattern("mul(x, sigmoid(x))"), pattern("mul(sigmoid(x), x)")},
                 [](Program& p, const Match& m, GraphEdit& ed, size_t at) {
                   return add_if_same(p, ed, at, "silu", {ir::ValueRef{m.values.at("x")}},
                                      p.graph.nodes()[at].outputs[0]);
                 }});
    return r;
  }();
  return all;
}

// One sweep: the first match that builds, applied; its rewrite's name, or nullptr.
const char* rewrite_once(Program& p) {
  const Matcher matcher(p);
  const size_t n0 = p.graph.nodes().size();
  for (size_t i = 0; i < n0; ++i) {
    const ir::Node& n = p.graph.nodes()[i];
    if (n.outputs.size() != 1 || matcher.uses[n.outputs[0]] == 0) continue;
    const ir::ValueId out = n.outputs[0];
    for (const Rewrite& rw : rewrites())
      for (const Pattern& pat : rw.patterns) {
        Match m;
        if (!matcher.match(pat, out, m, true)) continue;
        GraphEdit ed(p);
        const ir::ValueId v = rw.build(p, m, ed, i);
        if (v >= 0) replace_uses(p, out, v);
        ed.commit();  // a declined builder may have added a dead node: DCE drops it
        if (v >= 0) return rw.name;
      }
  }
  return nullptr;
}

}  // namespace

int rewrite_patterns(Program& p) {
  std::map<std::string, int> counts;
  int total = 0;
  for (const char* name = rewrite_once(p); name != nullptr; name = rewrite_once(p)) {
    ++counts[name];
    ++total;
    dead_code_elimination(p);  // the matched nodes: their reads would hide later matches
  }
  for (const auto& [name, n] : counts)
    p.rewrites += (p.rewrites.empty() ? "" : ", ") + name + " x" + std::to_string(n);
  return total;
}

// Note [Rewrites before the backward]: a module's forward compiled with its backward (Note
// [Compiled backward] in program.h) records the backward the engine derived from the forward
// as it ran, and that backward reads the very values a forward rewrite removes (the attention's
// probabilities). So when the forward's passes rewrite something, the capture runs the
// rewritten forward again, op by op through the whole dispatcher, autograd included, and
// captures that run with its backward: the backward is then the rewritten ops' own
// (_fused_attention_backward). Only a forward that replays the same way is rewritten: no random
// draws, no effects once functionalized, no aliases made without an op (a detach), no .grad
// reads.
int rewrite_forward(Program& p, std::string* what) {
  const auto& nodes = p.graph.nodes();
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].rng || p.generators[i] || nodes[i].op_name == "as_strided") return 0;
  if (!p.seed_uses.empty()) return 0;
  for (const InputSource& s : p.sources)
    if (s.kind != InputSource::Kind::Arg && s.kind != InputSource::Kind::Captured) return 0;
  functionalize(p);
  for (size_t i = 0; i < nodes.size(); ++i)
    if (has_effects(p, i)) return 0;
  constant_folding(p);
  common_subexpression_elimination(p);
  const int n = rewrite_patterns(p);
  if (n == 0 || !ir::verify(p.graph).empty()) return 0;
  *what = p.rewrites;
  return n;
}

}  // namespace kiln::compiler::detail
