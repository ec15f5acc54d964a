// The DTensor key's kernel: one boxed fallback that checks the arguments, picks placements by the
// row's sharding rule (cached per op and input specs), runs the op on the local shards and wraps
// the results (Note [DTensor dispatch]).
#include <mutex>
#include <set>
#include <unordered_map>

#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"
#include "kiln/meta.h"

namespace kiln::dist {

// Note [DTensor dispatch]: every op reaches the DTensor key through one boxed fallback.
//  - Arguments: every tensor must be a DTensor, except 0-d plain tensors (scalars and wrapped
//    numbers), which count as replicated: anything else is a RuntimeError, as in PyTorch. All
//    DTensors must be on one mesh (ValueError naming the op and both meshes).
//  - Rule "pointwise" (Note [Pointwise sharding]) decides the input placements and the output's;
//    the decision is cached per (op, input shapes and placements, whether the op is linear in
//    its inputs; it does not depend on the mesh's sizes), so a repeated call costs a hash lookup
//    and the local op.
//  - Rule "creation" on a DTensor (ones_like and the other composite *_like rows, whose
//    decompositions would make plain tensors): the op runs on self's shard and the result keeps
//    self's placements, Partial becoming Replicate. A composite row also runs its decomposition
//    at the Autograd key, above this one, so *_like of a DTensor that requires grad (and .to(),
//    which decomposes through empty_like) still makes a plain tensor there; the engine's
//    implicit gradient of a DTensor loss is made below Autograd for that reason.
//  - Rule "replicate" takes the replicate path: each DTensor is redistributed to Replicate(),
//    the op runs on the full tensors, tensor results come back as Replicate() DTensors, and
//    arguments the op writes are written back into their shards. It is correct and slow; a view
//    it makes of a DTensor that is not all Replicate() is a copy, so writing into that view
//    leaves the DTensor unchanged (view rules will fix that).
//  - Every other rule (not implemented yet), out= variants and ops with tensor lists take the
//    same path, and the op is also warned about once (Note [Warnings]) and listed by
//    fallback_ops(). Random ops on this path draw on each rank's own generator.
//
// Note [Pointwise sharding]: the output has the broadcast shape; input dim k of a rank-r input
// is output dim k + R - r. Each mesh dim is decided on its own, among:
//  - Shard(od), for an output dim od that some input shards: an input whose dim od is not
//    broadcast gets Shard of that dim, a broadcast one (size 1 or absent) gets Replicate;
//  - Partial(op) with op sum or avg, for an op that is linear in its inputs: add and sub (every
//    tensor input Partial, a Replicate one becomes Partial without communication), mul (exactly
//    one input Partial, the others Replicate), div without rounding_mode (the numerator Partial),
//    neg. A plain 0-d input cannot become Partial, so add(Partial, 2.0) replicates;
//  - Replicate().
// The cheapest wins (element counts moved: all-gather n, reduce-scatter n, all-reduce 2n,
// taking a piece or going Replicate -> Partial 0), Shard first on a tie, then Partial. An
// in-place op keeps self's placements (its output is self); where self's placement cannot be the
// output's (self Partial in a nonlinear op) the op takes the replicate path, which writes back.

namespace {

struct Arg {
  int index;  // in the op's arguments
  const Tensor* tensor;
  const DTensorSpec* spec;  // null for a plain 0-d tensor
  int64_t rank;
};

struct Decision {
  std::vector<Placements> targets;  // per Arg (empty for plain tensors)
  Placements out;
  DimVector out_shape;
  bool replicate_path = false;
};

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

// ---- Linearity (Note [Pointwise sharding]) -----------------------------------------------------

enum class Linear { None, Add, Mul, Div, Unary };

Linear linearity(const OperatorHandle& op, const Stack& args) {
  std::string_view n = op.name();
  if (!n.empty() && n.back() == '_') n.remove_suffix(1);
  if (n == "add" || n == "sub") return Linear::Add;
  if (n == "mul") return Linear::Mul;
  if (n == "neg") return Linear::Unary;
  if (n == "div") return args.size() > 2 && args[2].is_none() ? Linear::Div : Linear::None;
  return Linear::None;
}

int64_t move_cost(const Placement& from, const Placement& to, int64_t numel) {
  if (from == to) return 0;
  if (from.is_shard()) return numel;                                // all-gather (then local)
  if (from.is_partial()) return to.is_shard() ? numel : 2 * numel;  // reduce-scatter, all-reduce
  return 0;                                                         // a piece, or zeros
}

// The placement of `a` along one mesh dim when the output is `out` there (nullopt: impossible).
// `partial_input`: for Mul/Div, the Arg that stays Partial.
std::optional<Placement> input_for(const Arg& a, const Placement& out, const DimVector& out_shape,
                                   int64_t R, Linear lin, int partial_input, int self) {
  if (out.is_replicate()) return Replicate();
  if (out.is_shard()) {
    const int64_t d = out.dim - (R - a.rank);
    if (d < 0 || (a.tensor->size(d) == 1 && out_shape[out.dim] != 1)) return Replicate();
    if (!a.spec) return std::nullopt;
    return Shard(d);
  }
  // Partial
  if (!a.spec) return lin == Linear::Add ? std::nullopt : std::optional<Placement>(Replicate());
  if (lin == Linear::Add || lin == Linear::Unary) return out;
  return self == partial_input ? out : Replicate();
}

Decision decide_pointwise(const OperatorHandle& op, const std::vector<Arg>& args, Linear lin,
                          const DeviceMesh& mesh) {
  Decision dec;
  const bool inplace = op.info().is_inplace;
  int64_t R = 0;
  for (const Arg& a : args) R = std::max(R, a.rank);
  dec.out_shape = DimVector(args[0].tensor->sizes());
  for (const Arg& a : args)
    dec.out_shape =
        meta::broadcast_shapes(op.name(), IntArrayRef(dec.out_shape), a.tensor->sizes());
  if (inplace)
    KILN_CHECK(IntArrayRef(dec.out_shape) == args[0].tensor->sizes(), Value, op.name(),
               ": the result of shape ", IntArrayRef(dec.out_shape),
               " does not fit in-place into self of shape ", args[0].tensor->sizes());
  dec.targets.assign(args.size(), Placements{});
  for (size_t j = 0; j < args.size(); ++j)
    if (args[j].spec) dec.targets[j].resize(mesh.ndim());
  dec.out.resize(mesh.ndim());
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    // Candidate (output placement, which input stays Partial for Mul/Div).
    std::vector<std::pair<Placement, int>> cands;
    for (const Arg& a : args) {
      if (!a.spec || !a.spec->placements[i].is_shard()) continue;
      Placement s = Shard(a.spec->placements[i].dim + R - a.rank);
      bool seen = false;
      for (auto& c : cands) seen = seen || c.first == s;
      if (!seen) cands.push_back({s, -1});
    }
    if (lin != Linear::None) {
      for (size_t j = 0; j < args.size(); ++j) {
        if (!args[j].spec || !args[j].spec->placements[i].is_partial()) continue;
        const Placement& p = args[j].spec->placements[i];
        if (p.reduce != ReduceOp::Sum && p.reduce != ReduceOp::Avg) continue;
        if (lin == Linear::Div && j != 0) continue;
        cands.push_back({p, static_cast<int>(j)});
      }
    }
    cands.push_back({Replicate(), -1});
    int64_t best = -1;
    size_t best_c = 0;
    for (size_t c = 0; c < cands.size(); ++c) {
      const Placement& out = cands[c].first;
      if (inplace && args[0].spec && !(out == args[0].spec->placements[i])) continue;
      int64_t cost = 0;
      for (size_t j = 0; j < args.size() && cost >= 0; ++j) {
        auto want =
            input_for(args[j], out, dec.out_shape, R, lin, cands[c].second, static_cast<int>(j));
        if (!want) {
          cost = -1;
        } else if (args[j].spec) {
          cost += move_cost(args[j].spec->placements[i], *want, args[j].tensor->numel());
        }
      }
      if (cost < 0 || (best >= 0 && cost >= best)) continue;
      best = cost;
      best_c = c;
    }
    if (best < 0) {  // an in-place op whose self placement cannot be the output's
      dec.replicate_path = true;
      return dec;
    }
    dec.out[i] = cands[best_c].first;
    for (size_t j = 0; j < args.size(); ++j)
      if (args[j].spec)
        dec.targets[j][i] = *input_for(args[j], dec.out[i], dec.out_shape, R, lin,
                                       cands[best_c].second, static_cast<int>(j));
  }
  return dec;
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

void dtensor_kernel(const OperatorHandle& op, DispatchKeySet, Stack& stack) {
  const OpInfo& info = op.info();
  const int n = info.num_args;
  Stack args(stack.end() - n, stack.end());
  stack.resize(stack.size() - n);
  // Check the arguments and collect the tensors (Note [DTensor dispatch]).
  std::vector<Arg> tensors;
  const DeviceMesh* mesh = nullptr;
  bool has_list = false;
  auto visit = [&](int i, const Tensor& t) {
    if (!t.defined()) return;
    if (!is_dtensor(t)) {
      if (t.dim() != 0) mixed_error(op, i, t);
      tensors.push_back(Arg{i, &t, nullptr, 0});
      return;
    }
    const DTensorSpec& s = detail::spec_of(t);
    if (mesh == nullptr) {
      mesh = &s.mesh;
    } else {
      KILN_CHECK(*mesh == s.mesh, Value, op.name(),
                 ": DTensor arguments are on different device meshes: ", mesh->str(), " and ",
                 s.mesh.str());
    }
    tensors.push_back(Arg{i, &t, &s, t.dim()});
  };
  for (int i = 0; i < n; ++i) {
    if (args[i].is_tensor()) {
      visit(i, args[i].to_tensor());
    } else if (args[i].is_tensor_list()) {
      has_list = true;
      for (const Tensor& t : args[i].to_tensor_list()) visit(i, t);
    }
  }
  KILN_ASSERT(mesh != nullptr, op.name(), ": DTensor kernel without a DTensor argument");
  if (is_like_op(op) && is_dtensor(args[0].to_tensor())) {
    stack.push_back(like_op(op, std::move(args)));
    return;
  }
  const bool rule = info.sharding == ShardingRule::Pointwise && !info.is_out && !has_list;
  const Decision* dec = nullptr;  // a cache entry: node-based, so it stays valid
  if (rule) {
    const Linear lin = linearity(op, args);
    std::vector<int64_t> key{reinterpret_cast<int64_t>(&op), static_cast<int64_t>(lin)};
    for (const Arg& a : tensors) {
      key.push_back(a.spec ? -2 - a.rank : -1);
      for (int64_t s : a.tensor->sizes()) key.push_back(s);
      if (a.spec)
        for (const Placement& p : a.spec->placements) key.push_back(code(p));
    }
    std::unique_lock<std::mutex> lock(g_cache_mu);
    auto it = cache().find(key);
    if (it != cache().end()) {
      ++g_stats.hits;
      dec = &it->second;
    } else {
      lock.unlock();
      Decision d = decide_pointwise(op, tensors, lin, *mesh);
      lock.lock();
      ++g_stats.misses;
      dec = &cache().emplace(std::move(key), std::move(d)).first->second;
    }
  }
  if (!rule || dec->replicate_path) {
    if (!rule && info.sharding != ShardingRule::Replicate) note_fallback(op);
    for (IValue& v : replicate_path(op, std::move(args), *mesh)) stack.push_back(std::move(v));
    return;
  }
  Stack locals = args;
  for (size_t j = 0; j < tensors.size(); ++j) {
    const Arg& a = tensors[j];
    if (!a.spec) continue;
    locals[a.index] =
        detail::redistribute_local(detail::local_of(*a.tensor), *a.spec, dec->targets[j]);
  }
  op.call_boxed(locals);
  if (info.is_inplace) {
    stack.push_back(args[0]);
    return;
  }
  for (IValue& v : locals) {
    if (!v.is_tensor()) {
      stack.push_back(std::move(v));
      continue;
    }
    const Tensor& r = v.to_tensor();
    stack.push_back(detail::make_dtensor(
        r, DTensorSpec{*mesh, dec->out, dec->out_shape,
                       contiguous_strides(IntArrayRef(dec->out_shape)), r.dtype()}));
  }
}

}  // namespace

KILN_LIBRARY(DTensor, m) {
  m.fallback(&dtensor_kernel);
  for (OperatorHandle* op : Dispatcher::get().ops())
    if (is_like_op(*op)) Dispatcher::get().register_kernel(*op, m.key(), nullptr, &dtensor_kernel);
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

}  // namespace kiln::dist
