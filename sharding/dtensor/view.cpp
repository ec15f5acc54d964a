// The view and cat sharding rules (Note [View sharding]).
#include <algorithm>
#include <set>

#include "kiln/meta.h"
#include "rules.h"

namespace kiln::dist::rules {

// Note [View sharding]: a view op runs on self's local shard and its result is a view of that
// shard, so writing through the view of a DTensor writes the DTensor (where nothing had to be
// gathered first). Along each mesh dim:
//  - Replicate and Partial (any reduce op: a view only moves elements) pass through unchanged.
//  - Shard(d) passes as Shard(d') when the view of every rank's piece is exactly that rank's
//    piece of the result along output dim d': alias, t, transpose, permute, unsqueeze and
//    squeeze renumber d; expand keeps d unless it expands d (size 1 -> n); select, slice,
//    split, split_with_sizes, chunk and diagonal keep the dims they do not index (a slice that
//    keeps the whole dim passes too). A shard of the dim they index, of a dim squeeze removes or
//    expand expands, is gathered first (Replicate), as is as_strided, whose geometry addresses
//    the global storage.
//  - view (reshape, flatten and unflatten decompose to it above this key) pairs input and output
//    dims into groups of equal products. Shard(d) can pass only when d is the outermost dim of
//    its group of size > 1, to the group's outermost output dim od of size > 1: with inner
//    products a (input dims after d) and b (output dims after od), the pieces line up when
//    ceil(size(d) / n) * a == ceil(size(od) / n) * b, i.e. both chunkings cut the flattened group
//    at the same offsets (torch.chunk pieces, Note [Placements]; then the lengths match too,
//    both clipped at the group's end). A merge (b = 1) passes when the shard is even (uneven
//    pieces of d do not start at multiples of ceil(size(od) / n)); a split (a = 1) passes when
//    the piece length ceil(size(d) / n) is divisible by b. Several mesh dims sharding d split the
//    pieces again: the test holds for every piece length at every level, or all of them gather.
//    The local call gets the local sizes (-1 resolved).
//  - Every shard that passes keeps its mesh dim order, so nested pieces stay nested.
// The result's global shape and strides are those of the op on a meta tensor with self's global
// shape and strides (x.t() of a contiguous DTensor has transposed strides). Multi-output views
// (split, chunk) give every piece the same placements. A view whose input had to be gathered
// is a view of the gathered copy, so writes through it do not reach the DTensor (as in PyTorch).
//
// cat (and stack, which decomposes to unsqueeze and cat): along each mesh dim, Shard(e) of a dim
// e other than the cat dim passes when every input takes it; Partial(op) passes when every input
// is that same Partial (cat only places elements, like a view); otherwise Replicate. The cheapest
// by move_cost wins (choose()); the cat dim is never sharded.

namespace {

// The global geometry of the results: the op on meta tensors of the arguments' global sizes
// and strides. Also checks the call as the op itself would (its error names the op).
std::vector<OutSpec> global_outs(const RuleCall& call) {
  Stack s = call.args;
  auto meta_of = [](const Tensor& t) {
    return empty_strided_on(t.sizes(), t.strides(), t.dtype(), kMeta);
  };
  for (const Arg& a : call.tensors) {
    if (a.elem < 0) {
      s[a.index] = meta_of(*a.tensor);
    } else {
      std::vector<Tensor> l = s[a.index].to_tensor_list();
      l[a.elem] = meta_of(*a.tensor);
      s[a.index] = std::move(l);
    }
  }
  {
    // Shape inference, not a step: a capture (Note [Capture]) must not record it.
    ExcludeDispatchKeyGuard no_trace(DispatchKey::Tracing);
    call.op.call_boxed(s);
  }
  std::vector<OutSpec> outs;
  auto add = [&](const Tensor& t) {
    outs.push_back(OutSpec{{}, DimVector(t.sizes()), DimVector(t.strides())});
  };
  for (const IValue& v : s) {
    if (v.is_tensor()) add(v.to_tensor());
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) add(t);
  }
  return outs;
}

int64_t int_arg(const RuleCall& call, int i) { return call.args[i].get<int64_t>(); }

std::vector<int64_t> ints_arg(const RuleCall& call, int i) {
  return call.args[i].get<std::vector<int64_t>>();
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The mesh dims that shard tensor dim d, in order.
std::vector<int64_t> chain_of(const Placements& p, int64_t d) {
  std::vector<int64_t> c;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].is_shard(d)) c.push_back(static_cast<int64_t>(i));
  return c;
}

// Whether the shards of input dim d (global size `in`, inner product a) become the shards of an
// output dim (global size `out`, inner product b) for every piece at every level of the chain.
bool pieces_line_up(const DeviceMesh& mesh, const std::vector<int64_t>& chain, int64_t in,
                    int64_t out, int64_t a, int64_t b) {
  std::set<std::pair<int64_t, int64_t>> pairs{{in, out}};
  for (int64_t i : chain) {
    const int64_t n = mesh.size(i);
    std::set<std::pair<int64_t, int64_t>> next;
    for (auto [p, q] : pairs) {
      if (ceil_div(p, n) * a != ceil_div(q, n) * b) return false;
      for (int64_t k = 0; k < n; ++k)
        next.insert({chunk_of(p, n, k).second, chunk_of(q, n, k).second});
    }
    pairs = std::move(next);
  }
  return true;
}

// view: where each input dim's shards go (-1: gathered). See Note [View sharding].
std::vector<int64_t> view_map(const DeviceMesh& mesh, const Placements& p, IntArrayRef in,
                              IntArrayRef out) {
  const int64_t r = static_cast<int64_t>(in.size()), R = static_cast<int64_t>(out.size());
  std::vector<int64_t> to(r, -1);
  int64_t i = 0, j = 0;
  while (i < r || j < R) {
    const int64_t a0 = i, b0 = j;
    int64_t pi = 1, po = 1;
    if (i < r) pi *= in[i++];
    if (j < R) po *= out[j++];
    while (pi != po) {
      if (pi < po) {
        KILN_ASSERT(i < r, "view: shapes ", in, " and ", out, " differ in numel");
        pi *= in[i++];
      } else {
        KILN_ASSERT(j < R, "view: shapes ", in, " and ", out, " differ in numel");
        po *= out[j++];
      }
    }
    // The group is input dims [a0, i) and output dims [b0, j); its outermost dims of size > 1:
    int64_t d = a0, od = b0;
    while (d < i && in[d] == 1) ++d;
    while (od < j && out[od] == 1) ++od;
    if (d == i || od == j) continue;  // all of size 1
    std::vector<int64_t> chain = chain_of(p, d);
    if (chain.empty()) continue;
    int64_t a = 1, b = 1;
    for (int64_t k = d + 1; k < i; ++k) a *= in[k];
    for (int64_t k = od + 1; k < j; ++k) b *= out[k];
    if (pieces_line_up(mesh, chain, in[d], out[od], a, b)) to[d] = od;
  }
  return to;
}

// The op's map from input dims to output dims (-1: gathered first), or nullopt where the rule
// gathers everything (as_strided, an unknown view). `outs` holds the results' global geometry.
std::optional<std::vector<int64_t>> dim_map(const RuleCall& call, const std::vector<OutSpec>& outs,
                                            std::vector<std::pair<int, IValue>>& local_args) {
  const std::string_view name = call.op.name();
  const Tensor& self = *call.tensors[0].tensor;
  const Placements& p = call.tensors[0].spec->placements;
  const int64_t r = self.dim();
  auto wrap = [&](int64_t d, int64_t n) { return meta::wrap_dim(call.op.name(), d, n); };
  std::vector<int64_t> to(r);
  for (int64_t d = 0; d < r; ++d) to[d] = d;
  if (name == "alias") return to;
  if (name == "t") {
    if (r == 2) std::swap(to[0], to[1]);
    return to;
  }
  if (name == "transpose") {
    if (r == 0) return to;
    std::swap(to[wrap(int_arg(call, 1), r)], to[wrap(int_arg(call, 2), r)]);
    return to;
  }
  if (name == "permute") {
    std::vector<int64_t> dims = ints_arg(call, 1);
    for (size_t k = 0; k < dims.size(); ++k) to[wrap(dims[k], r)] = static_cast<int64_t>(k);
    return to;
  }
  if (name == "unsqueeze") {
    const int64_t at = wrap(int_arg(call, 1), r + 1);
    for (int64_t d = 0; d < r; ++d) to[d] = d + (d >= at);
    return to;
  }
  if (name == "squeeze") {
    // The dims removed, by the global sizes: a local piece of a sharded size-1 dim may be empty,
    // so the local call is told which dims to squeeze.
    std::vector<bool> gone(r, false);
    if (call.args[1].is_none()) {
      for (int64_t d = 0; d < r; ++d) gone[d] = self.size(d) == 1;
    } else {
      for (int64_t d : ints_arg(call, 1))
        if (r > 0) gone[wrap(d, r)] = self.size(wrap(d, r)) == 1;
    }
    std::vector<int64_t> dims;
    int64_t k = 0;
    for (int64_t d = 0; d < r; ++d) {
      if (gone[d]) dims.push_back(d);
      to[d] = gone[d] ? -1 : k++;
    }
    local_args.push_back({1, IValue(dims)});
    return to;
  }
  if (name == "expand") {
    const IntArrayRef out = outs[0].shape;
    const int64_t R = static_cast<int64_t>(out.size());
    for (int64_t d = 0; d < r; ++d)
      to[d] = self.size(d) == out[d + R - r] ? d + R - r : -1;  // expanded from size 1: gather
    return to;
  }
  if (name == "select") {
    const int64_t at = wrap(int_arg(call, 1), r);
    for (int64_t d = 0; d < r; ++d) to[d] = d == at ? -1 : d - (d > at);
    return to;
  }
  if (name == "slice") {
    const int64_t at = wrap(int_arg(call, 1), r);
    const bool whole = outs[0].shape[at] == self.size(at) && int_arg(call, 4) == 1;
    if (!whole) to[at] = -1;
    return to;
  }
  if (name == "split" || name == "split_with_sizes" || name == "chunk") {
    to[wrap(int_arg(call, 2), r)] = -1;
    return to;
  }
  if (name == "diagonal") {
    const int64_t d1 = wrap(int_arg(call, 2), r), d2 = wrap(int_arg(call, 3), r);
    int64_t k = 0;
    for (int64_t d = 0; d < r; ++d) to[d] = d == d1 || d == d2 ? -1 : k++;
    return to;
  }
  if (name == "view") {
    if (self.numel() == 0) return std::nullopt;
    return view_map(call.mesh, p, self.sizes(), outs[0].shape);
  }
  return std::nullopt;  // as_strided, and any view this rule does not know
}

}  // namespace

Decision decide_view(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;
  if (args.size() != 1 || !args[0].spec) return replicate();
  Decision dec;
  dec.outs = global_outs(call);
  std::optional<std::vector<int64_t>> to = dim_map(call, dec.outs, dec.local_args);
  if (!to) return replicate();
  const Placements& in = args[0].spec->placements;
  const int64_t m = call.mesh.ndim();
  dec.targets.assign(1, Placements(m));
  for (OutSpec& o : dec.outs) o.placements.resize(m);
  for (int64_t i = 0; i < m; ++i) {
    Placement t = in[i], o = in[i];
    if (t.is_shard()) {
      const int64_t od = (*to)[t.dim];
      if (od < 0) {
        t = o = Replicate();
      } else {
        o = Shard(od);
      }
    }
    dec.targets[0][i] = t;
    for (OutSpec& out : dec.outs) out.placements[i] = o;
  }
  // view and expand take the local sizes of the result.
  const std::string_view name = call.op.name();
  if (name == "view" || name == "expand")
    dec.local_args.push_back(
        {1, IValue(local_shape(dec.outs[0].shape, call.mesh, dec.outs[0].placements).vec())});
  return dec;
}

Decision decide_cat(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;
  if (args.empty()) return replicate();
  for (const Arg& a : args)
    if (!a.spec || a.rank != args[0].rank) return replicate();  // 0-d or legacy empty inputs
  Decision dec;
  dec.outs = global_outs(call);
  const int64_t dim = meta::wrap_dim(call.op.name(), int_arg(call, 1), args[0].rank);
  auto cands = [&](int64_t i) {
    std::vector<Candidate> cs;
    auto all = [&](const Placement& p) { return Candidate{Placements(args.size(), p), {p}}; };
    for (const Arg& a : args) {
      const Placement& p = a.spec->placements[i];
      if (p.is_shard() && p.dim != dim) {
        bool seen = false;
        for (const Candidate& c : cs) seen = seen || c.out[0] == p;
        if (!seen) cs.push_back(all(p));
      }
    }
    const Placement& p0 = args[0].spec->placements[i];
    bool partial = p0.is_partial();
    for (const Arg& a : args) partial = partial && a.spec->placements[i] == p0;
    if (partial) cs.push_back(all(p0));
    cs.push_back(all(Replicate()));
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

}  // namespace kiln::dist::rules
