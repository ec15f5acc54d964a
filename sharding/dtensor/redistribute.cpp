// Moving a DTensor's local shard from one list of placements to another
// (detail::redistribute_local, Note [Redistribute]), with the functional collectives of
// tensor/ops/comm.toml on the mesh dims' groups.
#include <algorithm>

#include "kiln/dist/dtensor.h"
#include "kiln/dist/remote.h"
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
// collectives, which need equal lengths, and trimmed after. Shard(a) -> Shard(b) on a mesh dim
// is one all-to-all (each rank sends every other its piece of b, cut from its piece of a) when
// no other mesh dim shards a or b, before or after; otherwise it goes through Replicate.
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

// Shard(a) -> Shard(b) along mesh dim i: the piece of b of every index, cut from this rank's
// piece of a, goes to that index; the pieces of a that arrive are joined. Tensor dims a and b
// are sharded by no other mesh dim, so `full_a` is the global size of a.
Tensor all_to_all_dims(const Step& s, int64_t i, const Tensor& local, int64_t a, int64_t b,
                       int64_t full_a) {
  const int64_t n = s.n(i);
  std::vector<Tensor> send;
  std::vector<int64_t> in_splits, out_splits;
  DimVector piece(local.sizes());  // what index j sends here: (its piece of a, my piece of b)
  piece[b] = chunk_of(local.size(b), n, s.coord[i]).second;
  for (int64_t j = 0; j < n; ++j) {
    auto [off, len] = chunk_of(local.size(b), n, j);
    send.push_back(local.narrow(b, off, len).contiguous().flatten());
    in_splits.push_back(send.back().numel());
    piece[a] = chunk_of(full_a, n, j).second;
    out_splits.push_back(numel_of(IntArrayRef(piece)));
  }
  Tensor got = all_to_all_single(cat(send, 0), out_splits, in_splits, s.group(i));
  std::vector<Tensor> pieces;
  int64_t off = 0;
  for (int64_t j = 0; j < n; ++j) {
    piece[a] = chunk_of(full_a, n, j).second;
    pieces.push_back(got.narrow(0, off, out_splits[j]).reshape(IntArrayRef(piece)));
    off += out_splits[j];
  }
  return cat(pieces, a);
}

// Whether mesh dim i goes Shard(a) -> Shard(b) by one all-to-all (Note [Redistribute]).
bool swaps_shard(const Placements& from, const Placements& to, size_t i) {
  if (!from[i].is_shard() || !to[i].is_shard() || from[i].dim == to[i].dim) return false;
  for (size_t k = 0; k < from.size(); ++k) {
    if (k == i) continue;
    for (int64_t d : {from[i].dim, to[i].dim})
      if (from[k].is_shard(d) || to[k].is_shard(d)) return false;
  }
  return true;
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
  if (local.device().type() == DeviceType::Remote)  // See Note [Remote DTensor]
    return detail::remote_hooks().redistribute(local, spec, to, Tensor());
  Step s{spec.mesh, spec.mesh.coordinate()};
  KILN_CHECK(!s.coord.empty(), Value, "redistribute: this rank is not in ", spec.mesh.str());
  const int64_t ndim = static_cast<int64_t>(from.size());
  Placements cur = from;
  Tensor x = local;
  const std::vector<bool> stable = stable_shards(from, to);
  for (int64_t i = ndim - 1; i >= 0; --i) {
    if (!cur[i].is_shard() || stable[i] || swaps_shard(from, to, i)) continue;
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
    if (c.is_shard()) {  // kept by pass 1 for an all-to-all
      x = all_to_all_dims(s, i, x, c.dim, t.dim, spec.shape[c.dim]);
      continue;
    }
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
