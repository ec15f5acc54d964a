// The embedding sharding rule: embedding and embedding_dense_backward (Note [Embedding sharding]).
#include "rules.h"

namespace kiln::dist::rules {

// Note [Embedding sharding]: embedding(weight (V, D), indices (*)) -> (*, D). Along each mesh
// dim, the cheapest of:
//  - Replicate everywhere (first, so that ties keep the inputs as they are);
//  - indices Shard(d), weight Replicate -> Shard(d) (a batch of lookups split by position);
//  - weight Shard(1), indices Replicate -> Shard(last) (columns: each rank looks up its columns);
//  - weight Shard(0), indices Replicate -> Partial(sum) (rows, vocab-parallel): each rank looks
//    up only the indices in its own row range, shifted by the range's start, and zeroes the
//    others, so exactly one rank contributes each row (Decision::local_call);
//  - weight Partial(r), indices Replicate -> Partial(r), for r sum or avg already on the weight
//    (a lookup is linear in the weight).
// embedding_dense_backward(grad (*, D), indices (*), V, padding_idx, scale_grad_by_freq) ->
// (V, D), consistently:
//  - grad and indices Replicate -> Shard(0): each rank accumulates only its rows, from the
//    indices in its range; the others go to one extra scratch row that is dropped. This is the
//    gradient of a row-sharded weight without communication, and it comes first, so that a tie
//    with Replicate (both free) takes it: each rank does a piece of the work;
//  - Replicate everywhere;
//  - grad Shard(last), indices Replicate -> Shard(1) (columns);
//  - grad and indices Shard(d) on the same batch dim -> Partial(sum), each rank summing its
//    positions' gradients; not with scale_grad_by_freq, whose counts are over all positions;
//  - grad Partial(r), indices Replicate -> Partial(r).
// padding_idx is a row index: a rank whose range holds it passes it shifted, the others pass -1
// (none), so its row gets no gradient anywhere. Several mesh dims may shard the rows; the range is
// then the nested piece (Note [Placements]).

namespace {

// The rows [first, first + count) of a dim 0 of `size` that this rank holds under `p`.
std::pair<int64_t, int64_t> rows_of(const DeviceMesh& mesh, const Placements& p, int64_t size) {
  const std::vector<int64_t> c = mesh.coordinate();
  int64_t first = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_shard(0)) continue;
    auto [off, len] = chunk_of(size, mesh.size(static_cast<int64_t>(i)), c[i]);
    first += off;
    size = len;
  }
  return {first, size};
}

bool shards_rows(const Placements& p) {
  for (const Placement& x : p)
    if (x.is_shard(0)) return true;
  return false;
}

// Whether `indices` (int64 or int32) lie in [first, first + count).
Tensor in_range(const Tensor& indices, int64_t first, int64_t count) {
  return logical_and(indices >= Scalar(first), indices < Scalar(first + count));
}

// Partial(r) candidates for a linear input `lin` (the other Args Replicate) where some Arg is
// Partial(r) on mesh dim i already.
void add_partials(const RuleCall& call, int64_t i, size_t lin, std::vector<Candidate>& cs) {
  for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg}) {
    const Arg& a = call.tensors[lin];
    if (!a.spec || a.spec->placements[i] != Partial(r)) continue;
    Candidate c{Placements(call.tensors.size(), Replicate()), {Partial(r)}};
    c.in[lin] = Partial(r);
    cs.push_back(std::move(c));
  }
}

Decision decide_lookup(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;  // weight, indices
  const Tensor &weight = *args[0].tensor, &indices = *args[1].tensor;
  KILN_CHECK(weight.dim() == 2, Value, "embedding: weight must be 2-d, got ", weight.dim(), "-d");
  Decision dec;
  dec.outs.resize(1);
  DimVector& shape = dec.outs[0].shape;
  shape = DimVector(indices.sizes());
  shape.push_back(weight.size(1));
  auto cands = [&](int64_t i) {
    std::vector<Candidate> cs{{{Replicate(), Replicate()}, {Replicate()}}};
    for (int64_t d = 0; d < indices.dim() && args[1].spec; ++d)
      cs.push_back({{Replicate(), Shard(d)}, {Shard(d)}});
    cs.push_back({{Shard(1), Replicate()}, {Shard(indices.dim())}});
    cs.push_back({{Shard(0), Replicate()}, {Partial()}});
    add_partials(call, i, 0, cs);
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  if (shards_rows(dec.targets[0])) {
    const auto [first, count] = rows_of(call.mesh, dec.targets[0], weight.size(0));
    dec.local_call = [first = first, count = count](const OperatorHandle& op, Stack& s) {
      const Tensor w = s[0].to_tensor(), idx = s[1].to_tensor();
      if (count == 0) {  // no rows here: contribute zeros
        DimVector sz(idx.sizes());
        sz.push_back(w.size(1));
        s.assign(1, zeros(IntArrayRef(sz), w.dtype(), w.device()));
        return;
      }
      const Tensor mine = in_range(idx, first, count);
      s[1] = (idx - Scalar(first)) * mine;  // row 0 stands in for the others, then is zeroed
      s[2] = int64_t{-1};                   // the forward does not read padding_idx
      op.call_boxed(s);
      s[0] = s[0].to_tensor().masked_fill(mine.logical_not().unsqueeze(-1), 0.0);
    };
  }
  return dec;
}

Decision decide_lookup_backward(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;  // grad, indices
  const Tensor &grad = *args[0].tensor, &indices = *args[1].tensor;
  const int64_t num_weights = call.args[2].to_int();
  const bool scale = call.args[4].get<bool>("a bool");
  KILN_CHECK(grad.dim() == indices.dim() + 1, Value, "embedding_dense_backward: grad of shape ",
             grad.sizes(), " does not fit indices of shape ", indices.sizes());
  Decision dec;
  dec.outs.resize(1);
  dec.outs[0].shape = DimVector{num_weights, grad.size(-1)};
  auto cands = [&](int64_t i) {
    std::vector<Candidate> cs{{{Replicate(), Replicate()}, {Shard(0)}},
                              {{Replicate(), Replicate()}, {Replicate()}},
                              {{Shard(grad.dim() - 1), Replicate()}, {Shard(1)}}};
    for (int64_t d = 0; d < indices.dim() && args[1].spec && !scale; ++d)
      cs.push_back({{Shard(d), Shard(d)}, {Partial()}});
    add_partials(call, i, 0, cs);
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  if (shards_rows(dec.outs[0].placements)) {
    const auto [first, count] = rows_of(call.mesh, dec.outs[0].placements, num_weights);
    dec.local_call = [first = first, count = count](const OperatorHandle& op, Stack& s) {
      const Tensor idx = s[1].to_tensor();
      const int64_t pad = s[3].to_int();
      const Tensor mine = in_range(idx, first, count);
      // In range: shifted; elsewhere: row `count`, a scratch row dropped below.
      s[1] = where(mine, idx - Scalar(first), full({}, Scalar(count), idx.dtype()));
      s[2] = count + 1;
      s[3] = pad >= first && pad < first + count ? pad - first : int64_t{-1};
      op.call_boxed(s);
      s[0] = s[0].to_tensor().narrow(0, 0, count).contiguous();
    };
  }
  return dec;
}

}  // namespace

Decision decide_embedding(const RuleCall& call) {
  return call.op.name() == std::string_view("embedding") ? decide_lookup(call)
                                                         : decide_lookup_backward(call);
}

}  // namespace kiln::dist::rules
