// Moving a DTensor's local shard from one list of placements to another
// (detail::redistribute_local, Note [Redistribute]), with the functional collectives of
// tensor/ops/comm.toml on the mesh dims' groups.
#include <algorithm>

#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"

namespace kiln::dist {

// Note [Redistribute]: placements change one mesh dim at a time, in two passes.
//  1. Unshard, last mesh dim first: a Shard(d) whose piece would not stay the same is
//     all-gathered along its mesh dim (Replicate). A Shard(d) on mesh dim i stays only when the
//     target keeps it and no earlier mesh dim starts or stops sharding d, or changes its own
//     Shard(d) (Note [Placements]: earlier mesh dims split first). Going last-first, every later
//     split of the same tensor dim is already undone when an earlier one is gathered.
//  2. Everything else, first mesh dim first, so that an earlier split of a tensor dim happens
//     before a later one: Replicate -> Shard takes this rank's piece (no communication);
//     Partial -> Shard reduce-scatters; Partial -> Replicate all-reduces; Replicate -> Partial
//     keeps the values on index 0 of the mesh dim and zeros elsewhere for sum (every rank keeps
//     them for avg, max and min); Partial(a) -> Partial(b) all-reduces with a, then does
//     Replicate -> Partial(b).
// Uneven pieces (See Note [Placements]) are padded to the first piece's length for the
// collectives, which need equal lengths, and trimmed after. A Shard(a) -> Shard(b) change goes
// through Replicate (an all-gather), not an all-to-all.
namespace {

struct Step {
  const DeviceMesh& mesh;
  std::vector<int64_t> coord;

  std::string group(int64_t i) const { return mesh.group(i)->name(); }
  int64_t n(int64_t i) const { return mesh.size(i); }
};

const char* op_name(ReduceOp op) { return reduce_op_name(op); }

// `t` with tensor dim `d` padded with zeros to `length`.
Tensor pad_to(const Tensor& t, int64_t d, int64_t length) {
  if (t.size(d) == length) return t;
  DimVector sizes(t.sizes());
  sizes[d] = length - t.size(d);
  return cat({t, zeros(IntArrayRef(sizes), t.dtype(), t.device())}, d);
}

// The pieces along tensor dim `d` (of length `full`) of every index of mesh dim i, gathered.
Tensor all_gather_dim(const Step& s, int64_t i, const Tensor& local, int64_t d, int64_t full) {
  const int64_t n = s.n(i), c = chunk_of(full, n, 0).second;
  if (c == 0) return local;
  Tensor x = pad_to(local, d, c).transpose(0, d).contiguous();
  Tensor all = all_gather_into_tensor(x, n, s.group(i));  // (n * c, ...)
  std::vector<Tensor> pieces;
  for (int64_t j = 0; j < n; ++j) {
    auto [off, len] = chunk_of(full, n, j);
    (void)off;
    pieces.push_back(all.narrow(0, j * c, len));
  }
  return cat(pieces, 0).transpose(0, d).contiguous();
}

// This rank's piece along tensor dim `d` of the reduction over mesh dim i.
Tensor reduce_scatter_dim(const Step& s, int64_t i, const Tensor& local, int64_t d, ReduceOp op) {
  const int64_t n = s.n(i), full = local.size(d), c = chunk_of(full, n, 0).second;
  if (c == 0) return local;
  Tensor x = pad_to(local, d, c * n).transpose(0, d).contiguous();
  Tensor mine = reduce_scatter_tensor(x, op_name(op), n, s.group(i));  // (c, ...)
  return mine.narrow(0, 0, chunk_of(full, n, s.coord[i]).second).transpose(0, d).contiguous();
}

Tensor take_piece(const Step& s, int64_t i, const Tensor& local, int64_t d) {
  auto [off, len] = chunk_of(local.size(d), s.n(i), s.coord[i]);
  return local.narrow(d, off, len).contiguous();
}

Tensor to_partial(const Step& s, int64_t i, const Tensor& local, ReduceOp op) {
  if (op != ReduceOp::Sum || s.coord[i] == 0) return local;
  return zeros_like(local);
}

// Whether the Shard on mesh dim i survives (pass 1 of Note [Redistribute]).
std::vector<bool> stable_shards(const Placements& from, const Placements& to) {
  std::vector<bool> stable(from.size(), false);
  for (size_t i = 0; i < from.size(); ++i) {
    if (!from[i].is_shard() || from[i] != to[i]) continue;
    const int64_t d = from[i].dim;
    bool ok = true;
    for (size_t k = 0; k < i; ++k) {
      if (from[k].is_shard(d) != to[k].is_shard(d)) ok = false;
      if (from[k].is_shard(d) && !stable[k]) ok = false;
    }
    stable[i] = ok;
  }
  return stable;
}

}  // namespace

Tensor detail::redistribute_local(const Tensor& local, const DTensorSpec& spec,
                                  const Placements& to) {
  const Placements& from = spec.placements;
  if (from == to) return local;
  Step s{spec.mesh, spec.mesh.coordinate()};
  KILN_CHECK(!s.coord.empty(), Value, "redistribute: this rank is not in ", spec.mesh.str());
  const int64_t ndim = static_cast<int64_t>(from.size());
  Placements cur = from;
  Tensor x = local;
  const std::vector<bool> stable = stable_shards(from, to);
  for (int64_t i = ndim - 1; i >= 0; --i) {
    if (!cur[i].is_shard() || stable[i]) continue;
    const int64_t d = cur[i].dim;
    int64_t full = spec.shape[d];  // tensor dim d before mesh dim i splits it
    for (int64_t k = 0; k < i; ++k)
      if (cur[k].is_shard(d)) full = chunk_of(full, s.n(k), s.coord[k]).second;
    x = all_gather_dim(s, i, x, d, full);
    cur[i] = Replicate();
  }
  for (int64_t i = 0; i < ndim; ++i) {
    const Placement &c = cur[i], &t = to[i];
    if (c == t) continue;
    if (c.is_partial()) {
      if (t.is_shard()) {
        x = reduce_scatter_dim(s, i, x, t.dim, c.reduce);
        continue;
      }
      x = all_reduce(x, op_name(c.reduce), s.group(i));
    }
    if (t.is_shard()) x = take_piece(s, i, x, t.dim);
    if (t.is_partial()) x = to_partial(s, i, x, t.reduce);
  }
  return x;
}

}  // namespace kiln::dist
