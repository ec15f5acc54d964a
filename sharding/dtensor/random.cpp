// The random sharding rule: bernoulli, normal_, uniform_ and dropout_seeded on DTensors (Note
// [Random sharding]).
#include "rules.h"

namespace kiln::dist::rules {

// Note [Random sharding]: element i of a random op depends only on (seed, offset, i) (Note
// [Counter-based RNG] in kiln/generator.h), i its row-major index in the whole tensor. A rank
// whose shard is the global elements [g0, g0 + numel) in that order (only Shard(0), on any mesh
// dims, the others Replicate) draws exactly its part of the unsharded result by running the op on
// its shard from counter offset + g0 / p, p the elements per counter of the op's width, when p
// divides g0: the counter blocks (and normal's Box-Muller pairs inside them) line up. The rule
// reserves the whole tensor's counters from the caller's generator, as the unsharded op does, and
// runs the local op on a generator of the same seed at this rank's first counter; a replicated
// rank draws the whole tensor from the same counters. So a sharded DTensor gets bit for bit the
// values of the unsharded op on every rank, the generator advances as it would, and nothing is
// gathered. dropout_seeded (what dropout calls, after reserving the whole tensor's counters)
// takes its seed and offset as arguments: the rule adds this rank's first counter to the offset
// (the decision cache leaves both out of its key), and its backward, dropout_seeded of the
// gradient, placed like the result, draws the same mask. The decision must be the same on every
// rank (the replicate path gathers): p must
// divide the first element of every rank's piece, so the rule checks all of them. Any other
// call (a Shard of another dim, a Partial, a misaligned piece, a device other than the CPU)
// takes the replicate path, which is exact too when every rank's generator is in the same state
// (the same manual_seed), and slow. On the rule's path every rank checks that the states agree
// (two small all-reduces per mesh dim) and raises a RuntimeError otherwise: replicas drawn from
// different states would silently differ.

namespace {

// The first row of the piece of `rows` rows at `coord`, nested over the mesh dims that shard dim 0
// (Note [Placements]); -1 for an empty piece.
int64_t first_row(const Placements& placements, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& coord, int64_t rows) {
  int64_t lo = 0, len = rows;
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    auto [off, n] = chunk_of(len, shape[i], coord[i]);
    lo += off;
    len = n;
  }
  return len == 0 ? -1 : lo;
}

// Every rank of the mesh must draw from the same generator state: the MAX and MIN of (seed,
// offset) over every mesh dim agree only then. RuntimeError on every rank otherwise.
void check_same_state(const DeviceMesh& mesh, std::string_view op, uint64_t seed, uint64_t offset) {
  Tensor hi = empty({2}, kInt64);
  auto* v = static_cast<int64_t*>(hi.impl()->raw_data());
  v[0] = static_cast<int64_t>(seed);
  v[1] = static_cast<int64_t>(offset);
  Tensor lo = hi.clone();
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    mesh.group(i)->all_reduce(hi, ReduceOp::Max)->wait();
    mesh.group(i)->all_reduce(lo, ReduceOp::Min)->wait();
  }
  const auto* h = static_cast<const int64_t*>(hi.impl()->raw_data());
  const auto* l = static_cast<const int64_t*>(lo.impl()->raw_data());
  KILN_CHECK(h[0] == l[0] && h[1] == l[1], Runtime, op,
             ": the ranks' random generators are in different states (this rank: seed ", seed,
             ", offset ", offset,
             "); a random op on a DTensor draws one tensor for the whole mesh, "
             "so seed every rank alike (manual_seed with the same seed on every rank)");
}

}  // namespace

Decision decide_random(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;
  if (args.size() != 1 || !args[0].spec || args[0].elem >= 0) return replicate();
  const DTensorSpec& spec = *args[0].spec;
  const Tensor& self = *args[0].tensor;
  // CPU shards, or the meta shards of a remote DTensor's shadow, which decides as the workers'
  // CPU shards do (See Note [Remote DTensor]).
  const Device where = detail::local_of(self).device();
  if (self.dim() == 0 || (where != kCPU && where != kMeta)) return replicate();
  const std::string name(call.op.name());
  // dropout_seeded is linear in its input for a given mask, so a Partial input passes when every
  // rank along that mesh dim draws the same mask, which it does: the first element depends on
  // the Shard(0) mesh dims only.
  const bool dropout = name == "dropout_seeded";
  // dropout's result keeps a strided input's layout; the rule's results are contiguous.
  if (dropout && spec.stride != contiguous_strides(IntArrayRef(spec.shape))) return replicate();
  for (const Placement& p : spec.placements)
    if ((p.is_partial() && !dropout) || (p.is_shard() && p.dim != 0)) return replicate();
  const int gen = arg_named(call.op.info(), dropout ? "offset" : "generator");
  KILN_ASSERT(gen >= 0, name, ": a random row without a generator or offset argument");
  // The decision cache does not key on the dtype: align for the widest counter block (4
  // elements, float32 and narrower; float64's 2 divide it) and size the draw at call time.
  const int64_t per = random_elems_per_counter(RandomWidth::k32);
  const int64_t row = self.numel() / std::max<int64_t>(spec.shape[0], 1);
  // Every rank's first element, by walking all mesh coordinates.
  const std::vector<int64_t>& mesh_shape = call.mesh.shape();
  std::vector<int64_t> coord(mesh_shape.size(), 0);
  while (true) {
    const int64_t lo = first_row(spec.placements, mesh_shape, coord, spec.shape[0]);
    if (lo > 0 && (lo * row) % per != 0) return replicate();
    size_t d = mesh_shape.size();
    while (d > 0 && ++coord[d - 1] == mesh_shape[d - 1]) coord[--d] = 0;
    if (d == 0) break;
  }
  const int64_t lo = first_row(spec.placements, mesh_shape, call.mesh.coordinate(), spec.shape[0]);
  const int64_t first_elem = std::max<int64_t>(lo, 0) * row, numel = self.numel();
  Decision dec;
  dec.targets.push_back(spec.placements);
  dec.outs.push_back(OutSpec{spec.placements, spec.shape, {}});
  if (dropout) {  // the composite dropout reserved the whole tensor's counters (k32)
    const int seed_arg = arg_named(call.op.info(), "seed");
    dec.local_call = [gen, seed_arg, first_elem, per, mesh = call.mesh](const OperatorHandle& op,
                                                                        Stack& s) {
      const int64_t offset = s[gen].get<int64_t>();
      check_same_state(mesh, op.name(), static_cast<uint64_t>(s[seed_arg].get<int64_t>()),
                       static_cast<uint64_t>(offset));
      s[gen] = IValue(offset + first_elem / per);
      op.call_boxed(s);
    };
    return dec;
  }
  dec.local_call = [gen, name, first_elem, numel, mesh = call.mesh](const OperatorHandle& op,
                                                                    Stack& s) {
    const ScalarType dtype = s[0].to_tensor().dtype();
    const uint64_t skip = first_elem / random_elems_per_counter(random_op_width(name, dtype));
    Generator caller = s[gen].is_none() ? default_generator() : s[gen].get<Generator>();
    const auto [seed, first] = caller.reserve(random_op_counters(name, numel, dtype));
    check_same_state(mesh, op.name(), seed, first);
    Generator mine(seed);
    mine.set_state({seed, first + skip});
    s[gen] = IValue(std::move(mine));
    op.call_boxed(s);
  };
  return dec;
}

}  // namespace kiln::dist::rules
