// vocab_parallel_cross_entropy: loss_parallel's cross entropy on class-sharded logits (Note
// [Vocab-parallel cross entropy] in kiln/distributed/tensor/parallel/loss.py, the same
// computation).
#include <cmath>
#include <limits>

#include "kiln/autograd/function.h"
#include "kiln/dist/tensor_parallel.h"
#include "kiln/kiln.h"

namespace kiln::dist {
namespace {

enum class Reduction { None, Mean, Sum };

Tensor all_reduced(ProcessGroup& g, Tensor t, ReduceOp op) {
  t = t.contiguous();
  g.all_reduce(t, op)->wait();
  return t;
}

// Forward arguments: the local (N, V_r) logits and the (N,) int64 target; the rest (the (C,)
// weight, undefined for none, gets no gradient) are in Options.
struct Options {
  Tensor weight;
  ProcessGroupPtr group;
  int64_t offset = 0;
  int64_t vocab = 0;
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double eps = 0;
};

struct VocabParallelCrossEntropy : autograd::Function<VocabParallelCrossEntropy> {
  static Tensor forward(autograd::AutogradContext* ctx, Tensor x, Tensor target, Options o) {
    const Tensor& weight = o.weight;
    const int64_t n = x.size(0), vr = x.size(1);
    Tensor valid = target != o.ignore_index;
    Tensor local_t = target - o.offset;
    Tensor owned = logical_and(logical_and(valid, local_t >= 0), local_t < vr);
    Tensor m =
        vr > 0 ? amax(x, {1}) : full({n}, -std::numeric_limits<double>::infinity(), x.dtype());
    m = all_reduced(*o.group, m, ReduceOp::Max);
    m = where(m == -std::numeric_limits<double>::infinity(), zeros_like(m), m);
    Tensor idx = where(owned, local_t, zeros_like(local_t)).unsqueeze(1);
    Tensor zero = zeros_like(m);
    Tensor sumexp = vr > 0 ? sum(exp(x - m.unsqueeze(1)), std::vector<int64_t>{1}) : zero;
    Tensor picked = vr > 0 ? where(owned, gather(x, 1, idx).squeeze({1}), zero) : zero;
    Tensor rowsum = vr > 0 ? sum(x, std::vector<int64_t>{1}) : zero;
    Tensor sums = all_reduced(*o.group, stack({sumexp, picked, rowsum}, 0), ReduceOp::Sum);
    Tensor lse = m + log(sums.select(0, 0));
    Tensor v = valid.to(x.dtype());
    Tensor w = weight.defined()
                   ? index_select(weight, 0, where(valid, target, zeros_like(target))) * v
                   : v;
    Tensor loss = (lse - sums.select(0, 1)) * w;
    if (o.eps > 0)
      loss =
          loss * (1 - o.eps) + (lse - sums.select(0, 2) / static_cast<double>(o.vocab)) * v * o.eps;
    Tensor denom = sum(w);
    ctx->save_for_backward({x, lse, w, v, idx, owned, denom});
    o.weight = Tensor();
    ctx->saved_data["options"] = o;
    if (o.reduction == Reduction::None) return loss;
    Tensor total = sum(loss);
    return o.reduction == Reduction::Mean ? total / denom : total;
  }

  static autograd::variable_list backward(autograd::AutogradContext* ctx,
                                          autograd::variable_list grads) {
    autograd::variable_list s = ctx->get_saved_variables();
    const Tensor &x = s[0], &lse = s[1], &w = s[2], &v = s[3], &idx = s[4], &owned = s[5],
                 &denom = s[6];
    const auto o = std::any_cast<Options>(ctx->saved_data["options"]);
    Tensor scale = o.reduction == Reduction::Mean ? grads[0] / denom : grads[0];
    Tensor a = (w * (1 - o.eps) + v * o.eps) * scale;
    Tensor g = exp(x - lse.unsqueeze(1)) * a.unsqueeze(1);
    if (o.eps > 0) g = g - (v * scale * (o.eps / static_cast<double>(o.vocab))).unsqueeze(1);
    if (x.size(1) > 0) {
      Tensor hit = where(owned, w * scale * (1 - o.eps), zeros_like(w));
      g = scatter_add(g, 1, idx, (-hit).unsqueeze(1));
    }
    return {g, Tensor()};
  }
};

Reduction parse_reduction(std::string_view r) {
  if (r == "mean") return Reduction::Mean;
  if (r == "sum") return Reduction::Sum;
  KILN_CHECK(r == "none", Value,
             "vocab_parallel_cross_entropy: reduction must be 'none', "
             "'mean' or 'sum', got '",
             r, "'");
  return Reduction::None;
}

}  // namespace

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target,
                                    const Tensor& weight, std::string_view reduction,
                                    int64_t ignore_index, double label_smoothing) {
  const char* what = "vocab_parallel_cross_entropy";
  KILN_CHECK(is_dtensor(logits), Value, what, ": expected DTensor logits, got a plain tensor");
  KILN_CHECK(logits.dim() == 1 || logits.dim() == 2, Value, what,
             ": expected logits of shape (N, C) or (C,), got ", logits.sizes(),
             "; flatten the leading dims first (the class dim must be the last)");
  const DTensor d(logits);
  const DeviceMesh& mesh = d.device_mesh();
  const Placements& p = d.placements();
  const int64_t cdim = logits.dim() - 1;
  int64_t mdim = -1, shards = 0;
  bool others_replicated = true;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].is_shard()) {
      ++shards;
      mdim = static_cast<int64_t>(i);
    } else if (!p[i].is_replicate()) {
      others_replicated = false;
    }
  }
  KILN_CHECK(shards == 1 && p[mdim].is_shard(cdim) && others_replicated, Value, what,
             ": expected the logits sharded on the class dim (Shard(-1)) along one mesh dim and "
             "replicated along the others, got placements ",
             placements_str(p));
  const Reduction red = parse_reduction(reduction);
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1, Value, what,
             ": label_smoothing must be between 0.0 and 1.0, got ", label_smoothing);
  KILN_CHECK(label_smoothing == 0 || !weight.defined(), NotImplemented, what,
             ": label_smoothing with class weights is not supported in Kiln yet");
  Tensor t = target;
  if (is_dtensor(t)) {
    for (const Placement& q : DTensor(t).placements())
      KILN_CHECK(q.is_replicate(), Value, what,
                 ": the target must be a plain tensor or a Replicate() DTensor, got placements ",
                 placements_str(DTensor(t).placements()));
    t = DTensor(t).to_local();
  }
  const int64_t vocab = logits.size(cdim);
  const DimVector batch = logits.dim() == 1 ? DimVector{} : DimVector{logits.size(0)};
  KILN_CHECK(t.sizes() == IntArrayRef(batch), Value, what, ": expected a target of shape ",
             IntArrayRef(batch), " for logits of shape ", logits.sizes(), ", got ", t.sizes());
  KILN_CHECK(!is_floating(t.dtype()), NotImplemented, what,
             ": class probabilities as target are not supported; pass class indices");
  KILN_CHECK(!weight.defined() || weight.sizes() == IntArrayRef({vocab}), Value, what,
             ": weight must have shape (", vocab, "), got ", weight.sizes());
  t = t.to(kInt64).reshape({-1});
  Tensor bad = logical_and(t != ignore_index, logical_or(t < 0, t >= vocab));
  KILN_CHECK(!any(bad).item<bool>(), Index, what, ": a target is out of bounds for ", vocab,
             " classes");
  Options o;
  o.weight = weight;
  o.group = mesh.group(mdim);
  o.offset = chunk_of(vocab, mesh.size(mdim), mesh.local_rank(mdim)).first;
  o.vocab = vocab;
  o.reduction = red;
  o.ignore_index = ignore_index;
  o.eps = label_smoothing;
  Tensor local = d.to_local();
  Tensor x = logits.dim() == 1 ? local.reshape({1, -1}) : local;
  Tensor loss = VocabParallelCrossEntropy::apply(x, t, o);
  if (logits.dim() == 1 && red == Reduction::None) loss = loss.reshape({});
  return DTensor::from_local(loss, mesh, Placements(mesh.ndim(), Replicate()));
}

}  // namespace kiln::dist
