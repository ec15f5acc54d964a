// The matmul family's sharding rule: mm, bmm, addmm, matmul and linear (Note [Matmul sharding]).
#include "kiln/generated/meta/linalg.h"
#include "rules.h"

namespace kiln::dist::rules {

// Note [Matmul sharding]: every op of the family is out = beta * bias + alpha * A @ B, written
// with labels: each dim of the output has its own label, the contracted dim k one more, and each
// operand dim carries the label of the output dim (or of k) it runs along. A batch dim that an
// operand broadcasts (size 1 where the output's is not) or does not have gets no label.
//   mm (m, k) @ (k, n); bmm (b, m, k) @ (b, k, n); addmm: bias broadcast to (m, n);
//   matmul: a 1-d operand has no m (or n), batch dims broadcast as in meta::matmul;
//   linear: input (..., k), weight (n, k), bias broadcast to (..., n): the input's leading dims
//   are the output's, and the weight is B transposed.
// Each mesh dim is decided on its own (choose()), among:
//  - Replicate everywhere (first, so that ties keep the inputs as they are);
//  - Shard(o) for each output dim o: operands with o's label Shard that dim, the others (and a
//    broadcast bias dim) Replicate. This is mm(Shard(0), Replicate) -> Shard(0),
//    mm(Replicate, Shard(1)) -> Shard(1), and Shard(b) on both sides of a bmm;
//  - Partial(sum) from k: A and B Shard their k dims, and each rank multiplies its slices;
//  - Partial(r) for r sum or avg, where some input is Partial(r) already: one of A and B
//    Partial(r), the other Replicate (the product is linear in each).
// The bias must be added once: with a Partial output it is Partial(r) too (Replicate ->
// Partial(sum) keeps it on index 0 of the mesh dim and zeros elsewhere, Partial(avg) keeps it
// everywhere), so the ranks' beta * bias terms sum (or average) to one; a plain 0-d bias cannot
// be Partial, and those calls take no Partial candidate. Uneven and empty pieces need nothing
// special: the pieces of A and B along k line up (the same size, split the same way), a rank with
// no k computes zeros, and one with no rows an empty piece.
// matmul and linear are composite rows: with grad recording they decompose above the DTensor key
// into views and mm/bmm/addmm; otherwise the DTensor key runs them here (dispatch.cpp registers
// its kernel over their decompositions) and the local op decomposes on the shards.

namespace {

constexpr int kNone = -1;

struct Form {
  std::vector<std::vector<int>> labels;  // per Arg: the label of each dim (kNone: none)
  std::vector<int> role;                 // per Arg: 0 A, 1 B, 2 bias
  int k = 0;                             // the contracted label (the output dims are 0..k-1)
};

// Labels of an operand of `sizes` whose dims line up, from the right, with output dims
// [first, first + rank) of `out`.
std::vector<int> aligned(IntArrayRef sizes, IntArrayRef out, int64_t first) {
  std::vector<int> l;
  for (size_t d = 0; d < sizes.size(); ++d) {
    const int64_t o = first + static_cast<int64_t>(d);
    l.push_back(o >= 0 && (sizes[d] == out[o] || (out[o] == 0 && sizes[d] == 0))
                    ? static_cast<int>(o)
                    : kNone);
  }
  return l;
}

// The labels of a matrix-product operand: its batch dims (aligned to the output's first
// `batch` dims), then `tail` (m or n and k, or k alone).
std::vector<int> operand(const Tensor& t, IntArrayRef out, int64_t batch, std::vector<int> tail) {
  const int64_t nb = t.dim() - static_cast<int64_t>(tail.size());
  std::vector<int> l = aligned(IntArrayRef(t.sizes().data(), nb), out, batch - nb);
  l.insert(l.end(), tail.begin(), tail.end());
  return l;
}

Form form_of(const RuleCall& call, DimVector& out) {
  const std::string_view n = call.op.name();
  const std::vector<Arg>& a = call.tensors;
  const Stack& s = call.args;
  Form f;
  auto bias = [&](const Arg& b) {
    f.labels.push_back(
        aligned(b.tensor->sizes(), IntArrayRef(out), static_cast<int64_t>(out.size()) - b.rank));
    f.role.push_back(2);
  };
  if (n == "mm" || n == "bmm" || n == "addmm") {
    const int o = n == "addmm" ? 1 : 0;  // addmm's bias is its first tensor
    const Tensor &A = *a[o].tensor, &B = *a[o + 1].tensor;
    out = n == "mm"    ? meta::mm(A, B).sizes
          : n == "bmm" ? meta::bmm(A, B).sizes
                       : meta::addmm(*a[0].tensor, A, B, s[3].to_scalar(), s[4].to_scalar()).sizes;
    const int r = static_cast<int>(out.size());  // 2, or 3 for bmm
    f.k = r;
    if (o) bias(a[0]);
    f.labels.push_back(operand(A, IntArrayRef(out), r - 2, {r - 2, f.k}));
    f.labels.push_back(operand(B, IntArrayRef(out), r - 2, {f.k, r - 1}));
    f.role.push_back(0);
    f.role.push_back(1);
    return f;
  }
  if (n == "matmul") {
    const Tensor &A = *a[0].tensor, &B = *a[1].tensor;
    out = meta::matmul(A, B).sizes;
    const int r = static_cast<int>(out.size());
    f.k = r;
    const int nb = r - (A.dim() >= 2) - (B.dim() >= 2);  // batch dims of the output
    f.labels.push_back(A.dim() == 1 ? std::vector<int>{f.k}
                                    : operand(A, IntArrayRef(out), nb, {nb, f.k}));
    f.labels.push_back(B.dim() == 1 ? std::vector<int>{f.k}
                                    : operand(B, IntArrayRef(out), nb, {f.k, r - 1}));
    f.role = {0, 1};
    return f;
  }
  KILN_ASSERT(n == "linear", n, ": not an op of the matmul sharding rule");
  const Tensor &X = *a[0].tensor, &W = *a[1].tensor;
  std::optional<Tensor> b;
  if (a.size() > 2) b = *a[2].tensor;
  out = meta::linear(X, W, b).sizes;
  const int r = static_cast<int>(out.size());
  f.k = r;
  std::vector<int> x;
  for (int d = 0; d + 1 < X.dim(); ++d) x.push_back(d);
  x.push_back(f.k);
  f.labels = {x, {r - 1, f.k}};  // weight (n, k)
  if (W.dim() == 1) f.labels[1] = {f.k};
  f.role = {0, 1};
  if (b) bias(a[2]);
  return f;
}

}  // namespace

Decision decide_matmul(const RuleCall& call) {
  const std::vector<Arg>& args = call.tensors;
  Decision dec;
  dec.outs.resize(1);
  const Form f = form_of(call, dec.outs[0].shape);
  const size_t na = args.size();
  bool plain_bias = false;  // a plain 0-d bias cannot be Partial
  for (size_t j = 0; j < na; ++j) plain_bias = plain_bias || (f.role[j] == 2 && !args[j].spec);
  auto shard_on = [&](int label, Placement other) {
    Candidate c{Placements(na, other), {label < f.k ? Shard(label) : Partial()}};
    for (size_t j = 0; j < na; ++j)
      for (size_t d = 0; d < f.labels[j].size(); ++d)
        if (f.labels[j][d] == label) c.in[j] = Shard(static_cast<int64_t>(d));
    return c;
  };
  auto cands = [&](int64_t i) {
    std::vector<Candidate> cs{{Placements(na, Replicate()), {Replicate()}}};
    for (int l = 0; l < f.k; ++l) cs.push_back(shard_on(l, Replicate()));
    if (plain_bias) return cs;
    cs.push_back(shard_on(f.k, Partial()));  // A and B Shard(k), a bias Partial(sum)
    for (ReduceOp r : {ReduceOp::Sum, ReduceOp::Avg}) {
      bool present = false;
      for (const Arg& a : args)
        present = present || (a.spec && a.spec->placements[i] == Partial(r));
      if (!present) continue;
      for (int side : {0, 1}) {
        Candidate c{Placements(na, Partial(r)), {Partial(r)}};
        for (size_t j = 0; j < na; ++j)
          if (f.role[j] == 1 - side) c.in[j] = Replicate();
        cs.push_back(std::move(c));
      }
    }
    return cs;
  };
  if (!choose(call, cands, dec)) return replicate();
  return dec;
}

}  // namespace kiln::dist::rules
