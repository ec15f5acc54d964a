// The DTensor key's kernel: one boxed fallback that checks the arguments, picks placements by the
// row's sharding rule (cached per op and input specs), runs the op on the local shards and wraps
// the results (Note [DTensor dispatch]).
#include <bit>
#include <mutex>
#include <set>
#include <unordered_map>

#include "kiln/autograd/grad_mode.h"
#include "kiln/dist/remote.h"
#include "rules.h"

namespace kiln::dist {

// Note [DTensor dispatch]: every op reaches the DTensor key through one boxed fallback.
//  - Arguments: every tensor must be a DTensor, except 0-d plain tensors (scalars and wrapped
//    numbers), which count as replicated: anything else is a RuntimeError, as in PyTorch. Two
//    rules take more plain tensors (plain_allowed): the optimizer's, and the norms' weight and
//    bias when they need no gradient (the ones and zeros layer_norm makes when it has none). All
//    DTensors must be on one mesh (ValueError naming the op and both meshes), except in the
//    optimizer rule, which checks that per parameter (Note [Optimizer sharding]).
//  - The row's rule (rules.h; one file per rule) decides the placements the inputs take for the
//    local call, and each result's placements, shape and strides. The decision is cached per
//    (op; each tensor's shape and placements; the integer, bool, int-list, dtype and string
//    arguments and whether each is given; the mesh's shape and this rank's coordinate). Float and
//    Scalar values are not in the key (an optimizer's lr changes every step), so a rule must not
//    depend on them; rule "attention" does (dropout_p, Note [Attention sharding]), so its rows
//    key on their float values too. A repeated call costs a hash lookup, the redistributions and
//    the local op.
//  - Rule "creation" on a DTensor (ones_like and the other composite *_like rows, whose
//    decompositions would make plain tensors): the op runs on self's shard and the result keeps
//    self's placements, Partial becoming Replicate. A composite row would also run its
//    decomposition at the Autograd key, above this one, so *_like of a DTensor that requires
//    grad (and clone, contiguous, reshape and .to(), which decompose through empty_like) would
//    make a plain tensor there: this library gives these rows an Autograd kernel that
//    redispatches below it. They are not differentiable (their values do not depend on self's),
//    so skipping autograd is right for plain tensors too.
//  - The composite rows of rule "matmul" (matmul, linear) also take this kernel over their
//    decompositions at the DTensor key, so that their rule sees the whole op (Note [Matmul
//    sharding]); under autograd they decompose above it as every composite row does.
//  - Rule "replicate" takes the replicate path: each DTensor is redistributed to Replicate(),
//    the op runs on the full tensors, tensor results come back as Replicate() DTensors, and
//    arguments the op writes are written back into their shards. It is correct and slow. Views
//    with a rule (view, transpose, split, ...: Note [View sharding]) run on the local shard and
//    are real views of it, so writing into the view writes the DTensor. A view on this path
//    (as_strided), like a view whose shards had to be gathered first, views a gathered copy:
//    writing into it leaves the DTensor unchanged. A rule that cannot shard a call
//    takes the same path.
//  - A rule not implemented yet, and out= variants, take the same path, and the op is also
//    warned about once (Note [Warnings]) and listed by fallback_ops(). Random ops on this path
//    draw on each rank's own generator.

namespace rules {

int arg_named(const OpInfo& info, std::string_view name) {
  for (int i = 0; i < info.num_args; ++i)
    if (name == info.args[i].name) return i;
  return -1;
}

int64_t move_cost(const Placement& from, const Placement& to, int64_t numel) {
  if (from == to) return 0;
  if (from.is_shard()) return numel;                                // all-gather (then local)
  if (from.is_partial()) return to.is_shard() ? numel : 2 * numel;  // reduce-scatter, all-reduce
  return 0;                                                         // a piece, or zeros
}

bool choose(const RuleCall& call, const std::function<std::vector<Candidate>(int64_t)>& cands,
            Decision& d) {
  const std::vector<Arg>& args = call.tensors;
  const int64_t m = call.mesh.ndim();
  d.targets.assign(args.size(), Placements{});
  for (size_t j = 0; j < args.size(); ++j)
    if (args[j].spec) d.targets[j].resize(m);
  for (OutSpec& o : d.outs) o.placements.resize(m);
  const bool inplace = call.op.info().is_inplace && !args.empty() && args[0].spec;
  for (int64_t i = 0; i < m; ++i) {
    std::vector<Candidate> cs = cands(i);
    int64_t best = -1;
    size_t best_c = 0;
    for (size_t c = 0; c < cs.size(); ++c) {
      KILN_ASSERT(cs[c].in.size() == args.size() && cs[c].out.size() == d.outs.size(),
                  call.op.name(), ": a sharding candidate of the wrong arity");
      if (inplace && cs[c].out[0] != args[0].spec->placements[i]) continue;
      int64_t cost = 0;
      for (size_t j = 0; j < args.size(); ++j)
        if (args[j].spec)
          cost += move_cost(args[j].spec->placements[i], cs[c].in[j], args[j].tensor->numel());
      if (best >= 0 && cost >= best) continue;
      best = cost;
      best_c = c;
    }
    if (best < 0) return false;
    for (size_t j = 0; j < args.size(); ++j)
      if (args[j].spec) d.targets[j][i] = cs[best_c].in[j];
    for (size_t k = 0; k < d.outs.size(); ++k) d.outs[k].placements[i] = cs[best_c].out[k];
  }
  return true;
}

}  // namespace rules

namespace {

using rules::Arg;
using rules::Decision;

// The rule of a row, or null where it is not implemented yet.
rules::Rule rule_of(ShardingRule r) {
  switch (r) {
    case ShardingRule::Pointwise:
      return &rules::decide_pointwise;
    case ShardingRule::Optimizer:
      return &rules::decide_optimizer;
    case ShardingRule::Reduction:
      return &rules::decide_reduction;
    case ShardingRule::Softmax:
      return &rules::decide_softmax;
    case ShardingRule::Norm:
      return &rules::decide_norm;
    case ShardingRule::View:
      return &rules::decide_view;
    case ShardingRule::Cat:
      return &rules::decide_cat;
    case ShardingRule::Matmul:
      return &rules::decide_matmul;
    case ShardingRule::Embedding:
      return &rules::decide_embedding;
    case ShardingRule::Index:
      return &rules::decide_index;
    case ShardingRule::Attention:
      return &rules::decide_attention;
    case ShardingRule::Random:
      return &rules::decide_random;
    case ShardingRule::Loss:
      return &rules::decide_loss;
    default:
      return nullptr;
  }
}

// ---- The decision cache ------------------------------------------------------------------------

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return h;
  }
};

std::mutex g_cache_mu;
std::unordered_map<std::vector<int64_t>, Decision, KeyHash>& cache() {
  static std::unordered_map<std::vector<int64_t>, Decision, KeyHash> c;
  return c;
}
DispatchStats g_stats;

int64_t code(const Placement& p) {
  return static_cast<int64_t>(p.kind) | (p.dim << 8) | (static_cast<int64_t>(p.reduce) << 4);
}

void key_tensor(std::vector<int64_t>& key, const Arg& a) {
  key.push_back(a.spec ? -2 - a.rank : -1);
  for (int64_t s : a.tensor->sizes()) key.push_back(s);
  if (!a.spec) return;
  key.push_back(static_cast<int64_t>(a.spec->placements.size()));
  for (const Placement& p : a.spec->placements) key.push_back(code(p));
}

// The cache key of a call (See Note [DTensor dispatch]).
std::vector<int64_t> cache_key(const OperatorHandle& op, const Stack& args,
                               const std::vector<Arg>& tensors, const DeviceMesh& mesh) {
  std::vector<int64_t> key{reinterpret_cast<int64_t>(&op)};
  // Rule "attention" decides on dropout_p (See Note [Attention sharding]); rule "random" reads
  // dropout_seeded's seed and offset at call time (See Note [Random sharding]), which change on
  // every call.
  const bool key_floats = op.info().sharding == ShardingRule::Attention;
  const bool random = op.info().sharding == ShardingRule::Random;
  for (int64_t s : mesh.shape()) key.push_back(s);
  for (int64_t c : mesh.coordinate()) key.push_back(c);
  size_t t = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& v = args[i];
    key.push_back(-100 - static_cast<int64_t>(v.variant().index()));
    const std::string_view name = op.info().args[i].name;
    if (random && (name == "seed" || name == "offset")) continue;
    if (v.is_tensor()) {
      if (v.to_tensor().defined()) key_tensor(key, tensors[t++]);
    } else if (v.is_tensor_list()) {
      for (const Tensor& e : v.to_tensor_list())
        if (e.defined()) key_tensor(key, tensors[t++]);
    } else if (v.is<int64_t>()) {
      key.push_back(v.get<int64_t>());
    } else if (v.is<bool>()) {
      key.push_back(v.get<bool>());
    } else if (v.is<double>() && key_floats) {
      key.push_back(std::bit_cast<int64_t>(v.get<double>()));
    } else if (v.is<ScalarType>()) {
      key.push_back(static_cast<int64_t>(v.get<ScalarType>()));
    } else if (v.is<std::vector<int64_t>>()) {
      const auto& l = v.get<std::vector<int64_t>>();
      key.push_back(static_cast<int64_t>(l.size()));
      key.insert(key.end(), l.begin(), l.end());
    } else if (v.is<std::string>()) {
      key.push_back(static_cast<int64_t>(std::hash<std::string>{}(v.get<std::string>())));
    }
  }
  return key;
}

// ---- The replicate path ------------------------------------------------------------------------

std::mutex g_fallback_mu;
std::set<std::string>& recorded() {
  static std::set<std::string> s;
  return s;
}

void note_fallback(const OperatorHandle& op) {
  static std::set<const OperatorHandle*> warned;
  bool first;
  {
    std::lock_guard<std::mutex> lock(g_fallback_mu);
    recorded().insert(op.name());
    first = warned.insert(&op).second;
  }
  if (first)
    warn(kiln::detail::str_cat("DTensor: ", op.name(), " has no sharding rule yet (its rule is '",
                               to_string(op.info().sharding),
                               "'); replicating its inputs, computing, and returning Replicate()"));
}

Placements replicated(const DeviceMesh& mesh) { return Placements(mesh.ndim(), Replicate()); }

Tensor full_local(const Tensor& t) {
  const DTensorSpec& s = detail::spec_of(t);
  return detail::redistribute_local(detail::local_of(t), s, replicated(s.mesh));
}

Tensor wrap_replicated(const Tensor& local, const DeviceMesh& mesh) {
  return detail::make_dtensor(local, DTensorSpec{mesh, replicated(mesh), DimVector(local.sizes()),
                                                 DimVector(local.strides()), local.dtype()});
}

Stack replicate_path(const OperatorHandle& op, Stack args, const DeviceMesh& mesh) {
  const OpInfo& info = op.info();
  Stack locals = args;
  for (IValue& v : locals) {
    if (v.is_tensor() && is_dtensor(v.to_tensor())) {
      v = full_local(v.to_tensor());
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts = v.to_tensor_list();
      for (Tensor& t : ts)
        if (is_dtensor(t)) t = full_local(t);
      v = ts;
    }
  }
  Stack work = locals;
  op.call_boxed(work);
  // Write the arguments the op changed back into their shards.
  auto write_back = [](const Tensor& dt, const Tensor& full) {
    const Tensor& local = detail::local_of(dt);
    if (full.is_same(local)) return;
    const DTensorSpec& s = detail::spec_of(dt);
    DTensorSpec rep = s;
    rep.placements = replicated(s.mesh);
    local.copy_(detail::redistribute_local(full, rep, s.placements));
  };
  for (int i = 0; i < info.num_args; ++i) {
    if (!info.args[i].is_mutable) continue;
    if (args[i].is_tensor() && is_dtensor(args[i].to_tensor())) {
      write_back(args[i].to_tensor(), locals[i].to_tensor());
    } else if (args[i].is_tensor_list()) {
      const auto& orig = args[i].to_tensor_list();
      const auto& full = locals[i].to_tensor_list();
      for (size_t k = 0; k < orig.size(); ++k)
        if (is_dtensor(orig[k])) write_back(orig[k], full[k]);
    }
  }
  // Results that are an argument's full tensor are that argument (in-place and out= ops).
  auto wrap = [&](const Tensor& r) -> Tensor {
    if (!r.defined()) return r;
    for (int i = 0; i < info.num_args; ++i)
      if (info.args[i].is_mutable && locals[i].is_tensor() && locals[i].to_tensor().is_same(r))
        return args[i].to_tensor();
    return wrap_replicated(r, mesh);
  };
  for (IValue& v : work) {
    if (v.is_tensor()) {
      v = wrap(v.to_tensor());
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts = v.to_tensor_list();
      for (Tensor& t : ts) t = wrap(t);
      v = ts;
    }
  }
  return work;
}

// ---- Rule "creation" on a tensor (Note [DTensor dispatch]) --------------------------------------

// ones_like, zeros_like, empty_like, full_like: composite rows whose decompositions call plain
// factories, so the DTensor key overrides them (registered below).
bool is_like_op(const OperatorHandle& op) {
  const OpInfo& info = op.info();
  return info.sharding == ShardingRule::Creation && info.kind == OpKind::Composite &&
         info.num_args > 0 && info.args[0].arg_type == ArgType::Tensor;
}

// Composite rows whose rule takes the whole op at the DTensor key instead of its decomposition
// there (which would go through views): matmul and linear (Note [Matmul sharding]).
bool is_ruled_composite(const OperatorHandle& op) {
  const OpInfo& info = op.info();
  return info.kind == OpKind::Composite && info.sharding == ShardingRule::Matmul;
}

Tensor like_op(const OperatorHandle& op, Stack args) {
  const Tensor self = args[0].to_tensor();
  DTensorSpec spec = detail::spec_of(self);
  for (Placement& p : spec.placements)
    if (p.is_partial()) p = Replicate();  // the values come from the op, not from self
  spec.stride = contiguous_strides(IntArrayRef(spec.shape));
  args[0] = detail::local_of(self);
  op.call_boxed(args);
  return detail::make_dtensor(args[0].to_tensor(), std::move(spec));
}

// ---- The kernel --------------------------------------------------------------------------------

[[noreturn]] void mixed_error(const OperatorHandle& op, int i, const Tensor& t) {
  KILN_FAIL(Runtime, op.name(), ": got a mix of DTensors and a plain tensor (argument '",
            op.info().args[i].name, "' of shape ", t.sizes(),
            "); convert every plain tensor to a DTensor first (distribute_tensor or "
            "DTensor.from_local); only 0-d tensors and scalars may be mixed in");
}

// Note [DTensor views]: a view op on a DTensor gives a real view of the local shard when its rule
// keeps the input's placements (ViewKind::Local: writing into it writes the DTensor), and a view
// of a gathered or moved copy otherwise (ViewKind::Copy: the replicate path, or a rule that had to
// redistribute the input; a view of a Copy view is a Copy too). A write into a Copy view would
// not reach the DTensor, and autograd cannot see that a write into a Local view changes its base
// (a DTensor has no storage, so it is never an autograd view of its base: no CopySlices, Note
// [CopySlices]); either would give silently wrong values or gradients, so both are refused with a
// NotImplementedError naming the way out: a write into a Local view is fine when no tensor of the
// call needs a gradient or grad mode is off (initialisation, optimizer-style updates).

void mark_views(const IValue& v, detail::ViewKind kind) {
  if (v.is_tensor()) {
    if (is_dtensor(v.to_tensor())) detail::set_view_kind(v.to_tensor(), kind);
  } else if (v.is_tensor_list()) {
    for (const Tensor& t : v.to_tensor_list())
      if (is_dtensor(t)) detail::set_view_kind(t, kind);
  }
}

detail::ViewKind view_kind_of(const std::vector<Arg>& tensors, const Decision& dec) {
  for (size_t j = 0; j < tensors.size(); ++j) {
    const Arg& a = tensors[j];
    if (!a.spec) continue;
    if (detail::view_kind(*a.tensor) == detail::ViewKind::Copy) return detail::ViewKind::Copy;
    if (!dec.targets[j].empty() && dec.targets[j] != a.spec->placements)
      return detail::ViewKind::Copy;
  }
  return detail::ViewKind::Local;
}

void check_view_writes(const OperatorHandle& op, const std::vector<Arg>& tensors) {
  const OpInfo& info = op.info();
  for (const Arg& w : tensors) {
    if (!w.spec || !info.args[w.index].is_mutable) continue;
    const detail::ViewKind kind = detail::view_kind(*w.tensor);
    KILN_CHECK(kind != detail::ViewKind::Copy, NotImplemented, op.name(),
               ": writes into a view of a DTensor (shape ", w.tensor->sizes(), ", ",
               placements_str(w.spec->placements),
               ") that views a gathered copy of its shards, so the write would not reach the "
               "DTensor; redistribute the DTensor so that the dims the view cuts are not sharded, "
               "then take the view and write");
    if (kind != detail::ViewKind::Local || !autograd::GradMode::is_enabled()) continue;
    for (const Arg& a : tensors)
      KILN_CHECK(!a.tensor->requires_grad(), NotImplemented, op.name(),
                 ": an in-place write into a view of a DTensor (shape ", w.tensor->sizes(),
                 ") while autograd records it is not supported yet: the DTensor it views would "
                 "not see the write in its gradient; write into the DTensor itself (e.g. "
                 "index_put_ or masked_fill_ on it), clone the view first, or write under no_grad");
  }
}

// The plain tensors that rules take beside DTensors (Note [DTensor dispatch]): the optimizer
// rule checks its own (Note [Optimizer sharding]); the norm rule takes a weight or bias that needs
// no gradient as replicated (Note [Softmax sharding]).
bool plain_allowed(const OpInfo& info, int i, const Tensor& t) {
  if (info.sharding == ShardingRule::Optimizer) return true;
  const std::string_view name = info.args[i].name;
  return info.sharding == ShardingRule::Norm && (name == "weight" || name == "bias") &&
         !t.requires_grad();
}

void dtensor_kernel(const OperatorHandle& op, DispatchKeySet, Stack& stack) {
  const OpInfo& info = op.info();
  const int n = info.num_args;
  Stack args(stack.end() - n, stack.end());
  stack.resize(stack.size() - n);
  // Check the arguments and collect the tensors (Note [DTensor dispatch]).
  std::vector<Arg> tensors;
  const DeviceMesh* mesh = nullptr;
  auto visit = [&](int i, int elem, const Tensor& t) {
    if (!t.defined()) return;
    if (!is_dtensor(t)) {
      if (t.dim() != 0 && !plain_allowed(info, i, t)) mixed_error(op, i, t);
      tensors.push_back(Arg{i, elem, &t, nullptr, 0});
      return;
    }
    const DTensorSpec& s = detail::spec_of(t);
    if (mesh == nullptr) {
      mesh = &s.mesh;
    } else if (info.sharding != ShardingRule::Optimizer) {  // it checks per parameter
      KILN_CHECK(*mesh == s.mesh, Value, op.name(),
                 ": DTensor arguments are on different device meshes: ", mesh->str(), " and ",
                 s.mesh.str());
    }
    tensors.push_back(Arg{i, elem, &t, &s, t.dim()});
  };
  for (int i = 0; i < n; ++i) {
    if (args[i].is_tensor()) {
      visit(i, -1, args[i].to_tensor());
    } else if (args[i].is_tensor_list()) {
      const auto& l = args[i].to_tensor_list();
      for (size_t k = 0; k < l.size(); ++k) visit(i, static_cast<int>(k), l[k]);
    }
  }
  KILN_ASSERT(mesh != nullptr, op.name(), ": DTensor kernel without a DTensor argument");
  for (const Arg& a :
       tensors)  // shards on a gang: the workers run this kernel (Note [Remote DTensor])
    if (a.spec && detail::local_of(*a.tensor).device().type() == DeviceType::Remote)
      return detail::remote_hooks().run_op(op, args, stack);
  check_view_writes(op, tensors);
  if (is_like_op(op) && is_dtensor(args[0].to_tensor())) {
    stack.push_back(like_op(op, std::move(args)));
    return;
  }
  const rules::Rule rule = info.is_out ? nullptr : rule_of(info.sharding);
  const Decision* dec = nullptr;  // a cache entry: node-based, so it stays valid
  if (rule) {
    std::vector<int64_t> key = cache_key(op, args, tensors, *mesh);
    std::unique_lock<std::mutex> lock(g_cache_mu);
    auto it = cache().find(key);
    if (it != cache().end()) {
      ++g_stats.hits;
      dec = &it->second;
    } else {
      lock.unlock();
      Decision d = rule(rules::RuleCall{op, args, tensors, *mesh});
      lock.lock();
      ++g_stats.misses;
      dec = &cache().emplace(std::move(key), std::move(d)).first->second;
    }
  }
  if (!rule || dec->replicate_path) {
    if (!rule && info.sharding != ShardingRule::Replicate) note_fallback(op);
    {
      std::lock_guard<std::mutex> lock(g_cache_mu);
      ++g_stats.replicated;
    }
    for (IValue& v : replicate_path(op, std::move(args), *mesh)) {
      if (info.is_view) mark_views(v, detail::ViewKind::Copy);
      stack.push_back(std::move(v));
    }
    return;
  }
  Stack locals = args;
  for (size_t j = 0; j < tensors.size(); ++j) {
    const Arg& a = tensors[j];
    if (!a.spec) continue;
    Tensor local =
        detail::redistribute_local(detail::local_of(*a.tensor), *a.spec, dec->targets[j]);
    if (a.elem < 0) {
      locals[a.index] = std::move(local);
    } else {
      std::vector<Tensor> l = locals[a.index].to_tensor_list();
      l[a.elem] = std::move(local);
      locals[a.index] = std::move(l);
    }
  }
  for (const auto& [i, v] : dec->local_args) locals[i] = v;
  // A written argument that the rule redistributed is written in its new placements: remember
  // that tensor (the call consumes `locals`) to bring the result back into its own shards.
  std::vector<std::pair<size_t, Tensor>> moved;
  for (size_t j = 0; j < tensors.size(); ++j) {
    const Arg& a = tensors[j];
    if (!a.spec || !info.args[a.index].is_mutable || dec->targets[j].empty() ||
        dec->targets[j] == a.spec->placements)
      continue;
    moved.emplace_back(
        j, a.elem < 0 ? locals[a.index].to_tensor() : locals[a.index].to_tensor_list()[a.elem]);
  }
  if (dec->local_call) {
    dec->local_call(op, locals);
  } else {
    op.call_boxed(locals);
  }
  for (const auto& [j, written] : moved) {
    DTensorSpec spec = *tensors[j].spec;
    spec.placements = dec->targets[j];
    detail::local_of(*tensors[j].tensor)
        .copy_(detail::redistribute_local(written, spec, tensors[j].spec->placements));
  }
  if (info.is_inplace) {
    if (info.num_returns > 0) stack.push_back(args[0]);
    return;
  }
  size_t k = 0;
  auto wrap = [&](const Tensor& r) {
    KILN_ASSERT(k < dec->outs.size(), op.name(), ": the sharding rule gave too few results");
    const rules::OutSpec& o = dec->outs[k++];
    return detail::make_dtensor(
        r, DTensorSpec{*mesh, o.placements, o.shape,
                       o.stride.empty() ? contiguous_strides(IntArrayRef(o.shape)) : o.stride,
                       r.dtype()});
  };
  const detail::ViewKind view = info.is_view ? view_kind_of(tensors, *dec) : detail::ViewKind::None;
  for (IValue& v : locals) {
    if (v.is_tensor()) {
      v = wrap(v.to_tensor());
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> l = v.to_tensor_list();
      for (Tensor& t : l) t = wrap(t);
      v = std::move(l);
    }
    if (info.is_view) mark_views(v, view);
    stack.push_back(std::move(v));
  }
}

}  // namespace

void detail::run_dtensor_kernel(const OperatorHandle& op, Stack& stack) {
  dtensor_kernel(op, DispatchKeySet(), stack);
}

// The Autograd kernel of the *_like rows (Note [DTensor dispatch]).
void like_below_autograd(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  op.redispatch_boxed(ks & DispatchKeySet::below(DispatchKey::Autograd), stack);
}

KILN_LIBRARY(DTensor, m) {
  m.fallback(&dtensor_kernel);
  for (OperatorHandle* op : Dispatcher::get().ops()) {
    if (is_like_op(*op))
      Dispatcher::get().register_kernel(*op, DispatchKey::Autograd, nullptr, &like_below_autograd);
    if (is_like_op(*op) || is_ruled_composite(*op))
      Dispatcher::get().register_kernel(*op, m.key(), nullptr, &dtensor_kernel);
  }
}

std::vector<std::string> fallback_ops() {
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  return {recorded().begin(), recorded().end()};
}

void clear_fallback_ops() {
  std::lock_guard<std::mutex> lock(g_fallback_mu);
  recorded().clear();
}

DispatchStats dispatch_stats() {
  std::lock_guard<std::mutex> lock(g_cache_mu);
  return g_stats;
}

bool has_sharding_rule(ShardingRule rule) { return rule_of(rule) != nullptr; }

}  // namespace kiln::dist
