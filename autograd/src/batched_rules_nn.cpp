// The Batched key's rules for convolution, pooling, and the row-wise ops of nn.toml, loss.toml
// and attention.toml (Note [Batching rules] in kiln/autograd/batched.h).
#include <string>
#include <vector>

#include "batched_rules.h"
#include "kiln/generated/meta/conv.h"

namespace kiln::autograd::batching {

// ---- convolution and pooling (conv.toml, pool.toml) --------------------------------------------

static bool is_composite(const Call& c) { return c.info().kind == OpKind::Composite; }

// A composite row (conv2d, max_pool2d, ...): its decomposition, run on the BatchedTensors (each
// op of it hits its own rule).
static Stack decompose(Call& c) {
  Stack args = c.args;
  c.op.redispatch_boxed(DispatchKeySet(DispatchKey::CPU), args);
  return args;
}

// The int[] argument at position `i` (ops::X::kArg_<name>).
static std::vector<int64_t> int_list(const Call& c, int i) {
  return c.args[i].get<std::vector<int64_t>>(c.info().args[i].name);
}

// `t` with the batch dim first, moved next to dim 1 and merged into it: (B, N, C, ..) ->
// (N, B * C, ..).
static Tensor fold_into_channels(const Call& c, const Tensor& t) {
  return front_or_expand(c, t).transpose(0, 1).flatten(1, 2);
}

// convolution: a batched weight folds the vmap dim into the groups (input (N, B * C, ..), weight
// (B * O, ..), groups * B); a batched input alone folds it into N. convolution_backward_weight
// folds it into the groups. The meta function checks the examples' shapes first, so errors are
// those of one example.
Result conv_rule(Call& c) {
  if (is_composite(c)) return decompose(c);
  if (c.batch == 0) return std::nullopt;
  const int64_t B = c.batch;
  if (c.is<ops::convolution_backward_weight>()) {
    using Op = ops::convolution_backward_weight;
    const Tensor &go = c.args[Op::kArg_grad_output].to_tensor(),
                 &x = c.args[Op::kArg_input].to_tensor();
    const int64_t groups = c.args[Op::kArg_groups].to_int();
    const std::vector<int64_t> stride = int_list(c, Op::kArg_stride),
                               padding = int_list(c, Op::kArg_padding),
                               dilation = int_list(c, Op::kArg_dilation);
    std::vector<int64_t> ws = int_list(c, Op::kArg_weight_size);
    meta::convolution_backward_weight(go, x, ws, stride, padding, dilation, groups);
    const int64_t out_channels = ws[0];
    ws[0] *= B;
    Tensor gw =
        kiln::convolution_backward_weight(fold_into_channels(c, go), fold_into_channels(c, x), ws,
                                          stride, padding, dilation, groups * B);
    return wrap_outputs(c, Stack{gw.unflatten(0, {B, out_channels})});
  }
  if (!c.is<ops::convolution>()) return std::nullopt;
  using Op = ops::convolution;
  const Tensor &x = c.args[Op::kArg_input].to_tensor(), &w = c.args[Op::kArg_weight].to_tensor();
  const int64_t groups = c.args[Op::kArg_groups].to_int();
  const std::vector<int64_t> stride = int_list(c, Op::kArg_stride),
                             padding = int_list(c, Op::kArg_padding),
                             dilation = int_list(c, Op::kArg_dilation),
                             output_padding = int_list(c, Op::kArg_output_padding);
  const bool transposed = c.args[Op::kArg_transposed].get<bool>("transposed");
  TensorSpec spec =
      meta::convolution(x, w, stride, padding, dilation, transposed, output_padding, groups);
  if (!c.batched(w)) {
    Tensor y = kiln::convolution(front(x).flatten(0, 1), w, stride, padding, dilation, transposed,
                                 output_padding, groups);
    return wrap_outputs(c, Stack{y.unflatten(0, {B, spec.sizes[0]})});
  }
  Tensor y = kiln::convolution(fold_into_channels(c, x), front(w).flatten(0, 1), stride, padding,
                               dilation, transposed, output_padding, groups * B);
  return wrap_outputs(c, Stack{y.unflatten(1, {B, spec.sizes[1]}).transpose(0, 1)});
}

// The pools and their backward rows: every tensor argument has the example's rank (3 or 4) and
// the vmap dim folds into N (a 3-D example (C, H, W) takes it as its N); self_size follows.
Result pool_rule(Call& c) {
  if (is_composite(c)) return decompose(c);
  int64_t rank = -1, n = 1;
  Stack args = c.args;
  for (int i = 0; i < c.info().num_args; ++i) {
    if (!c.args[i].is_tensor()) continue;
    const Tensor& t = c.args[i].to_tensor();
    if (rank < 0) rank = t.dim(), n = t.dim() == 4 ? t.size(0) : 1;
    if (t.dim() != rank || (rank != 3 && rank != 4)) return std::nullopt;  // the loop raises
    args[i] = rank == 4 ? front_or_expand(c, t).flatten(0, 1) : front_or_expand(c, t);
  }
  const int size_i = c.index(ArgRole::InputSize);  // the backward rows' self_size
  if (size_i >= 0) {
    std::vector<int64_t> s = int_list(c, size_i);
    if (static_cast<int64_t>(s.size()) != rank) return std::nullopt;
    if (rank == 4)
      s[0] *= c.batch;
    else
      s.insert(s.begin(), c.batch);
    args[size_i] = s;
  }
  Stack outs = run(c.op, std::move(args));
  if (rank == 4)
    for (IValue& o : outs) o = o.to_tensor().unflatten(0, {c.batch, n});
  return wrap_outputs(c, std::move(outs));
}

// ---- norms, losses, dropout, embedding (nn.toml, loss.toml, softmax backward) ------------------

// Note [Row-wise batching]: these rows compute over the trailing dims of their data arguments
// (input, grad, output, target, indices) with parameters (weight, bias) shared by every row, so
// the vmap dim folds into the leading dims: data arguments go batch-first (expanded if
// unbatched), a `dim` shifts past it, and the op runs once. Per op: batch_norm's statistics are
// per channel over N, so there the batch folds into the channels (weight repeated); the
// weight-gradient rows, and the weight and bias outputs of the fused layer/rms norm backward
// rows, sum over the rows of one example, so they are computed per example; group_norm and
// cross_entropy over (N, C, ..) examples merge the batch into N; dropout gives every example the
// same mask, that of its (seed, offset), as the loop does (PyTorch's randomness="same"); attention
// folds the batch into its leading dims (with dropout: the loop).
// A batched weight or bias (a different parameter per example) uses the loop.
static bool is_parameter(const Call& c, int i) {
  const ArgRole r = c.info().args[i].role;
  return r == ArgRole::Weight || r == ArgRole::Bias;
}

// A parameter shaped to broadcast against `like` along its channel dim (1) or, for the
// layer/rms norms, its trailing dims.
static Tensor param_view(const Call& c, const Tensor& p, const Tensor& like) {
  if (c.is<ops::_layer_norm>() || c.is<ops::_rms_norm>() || c.is<ops::_layer_norm_backward>() ||
      c.is<ops::_rms_norm_backward>() || c.is<ops::layer_norm>() || c.is<ops::rms_norm>())
    return p;
  std::vector<int64_t> shape(like.dim() - 1, 1);
  shape[0] = p.numel();
  return p.view(shape);
}

// Rows whose weight (or bias) differs per example (per-example gradients promote parameters to
// BatchedTensors): the norms run with unit parameters and apply the affine part as logical ops;
// the input-gradient rows take grad * weight with a unit weight; embedding looks each example's
// indices up in its own table. All of these are logical ops on BatchedTensors (own rules).
static Result batched_parameters(Call& c) {
  if (c.is<ops::embedding>()) {
    const Tensor &w = c.args[0].to_tensor(), &idx = c.args[1].to_tensor();
    const int64_t B = c.batch, V = w.size(0), pad = c.args[2].to_int();
    Tensor flat = front(w).flatten(0, 1);
    Tensor pidx = front_or_expand(c, idx);
    std::vector<int64_t> shape(pidx.dim(), 1);
    shape[0] = B;
    Tensor off = kiln::add(pidx, kiln::arange(0, B * V, V, kInt64, pidx.device()).view(shape));
    Tensor out = kiln::embedding(flat, off, -1, c.args[3].get<bool>("scale_grad_by_freq"));
    if (pad >= 0)  // the padding row gets no gradient
      out = kiln::where(kiln::ne(pidx, scalar_to_tensor(Scalar(pad))).unsqueeze(-1), out,
                        out.detach());
    return wrap_outputs(c, Stack{out});
  }
  auto unit = [](const Tensor& p, double v) {
    return kiln::full(p.sizes(), Scalar(v), p.dtype(), p.device());
  };
  const bool forward = c.is<ops::_layer_norm>() || c.is<ops::_rms_norm>() ||
                       c.is<ops::_group_norm>() || c.is<ops::_batch_norm>();
  if (forward) {
    Stack args = c.args;
    Tensor w, b;
    for (int i = 0; i < c.info().num_args; ++i) {
      if (!c.args[i].is_tensor() || !is_parameter(c, i)) continue;
      const Tensor& p = c.args[i].to_tensor();
      const bool weight = c.info().args[i].role == ArgRole::Weight;
      (weight ? w : b) = p;
      args[i] = unit(p, weight ? 1.0 : 0.0);
    }
    const Tensor x = run(c.op, std::move(args))[0].to_tensor();  // hits this rule unbatched
    Tensor y = kiln::mul(x, param_view(c, w, x));
    if (b.defined()) y = kiln::add(y, param_view(c, b, x));
    return Stack{y};
  }
  if (c.is<ops::batch_norm_backward>()) {
    Stack args = c.args;
    const int w_i = c.index(ArgRole::Weight);
    const Tensor& w = c.args[w_i].to_tensor();
    args[0] = kiln::mul(c.args[0].to_tensor(), param_view(c, w, c.args[0].to_tensor()));
    args[w_i] = unit(w, 1.0);
    return Stack{run(c.op, std::move(args))[0]};
  }
  return std::nullopt;
}

// _layer_norm_backward, _rms_norm_backward, _group_norm_backward: the input gradient folds the
// batch into the rows (group norm: into N; a batched weight goes into grad, with a unit weight);
// the weight and bias gradients sum over one example's rows (group norm: all but the channel
// dim), from the examples' xhat.
static Result norm_backward(Call& c) {
  const bool rms = c.is<ops::_rms_norm_backward>(), group = c.is<ops::_group_norm_backward>();
  const Tensor &g = c.args[0].to_tensor(), &x = c.args[1].to_tensor();
  if (group && x.dim() < 2) return std::nullopt;  // the loop raises the shape error
  const int w_i = c.index(ArgRole::Weight);
  const Tensor& w = c.args[w_i].to_tensor();
  const double eps = c.args[group ? ops::_group_norm_backward::kArg_eps
                                 : rms ? ops::_rms_norm_backward::kArg_eps
                                       : ops::_layer_norm_backward::kArg_eps]
                           .to_double();
  // the parameters' shape: (C,), or normalized_shape
  const std::vector<int64_t> ps =
      group ? std::vector<int64_t>{x.size(1)}
            : int_list(c, rms ? ops::_rms_norm_backward::kArg_normalized_shape
                              : ops::_layer_norm_backward::kArg_normalized_shape);
  Tensor one = kiln::ones(ps, x.dtype(), x.device());
  Tensor zero = kiln::zeros(ps, x.dtype(), x.device());
  Tensor gp = front_or_expand(c, g), xp = front_or_expand(c, x);  // (B, ..)
  Tensor gwp = c.batched(w) ? front_or_expand(c, kiln::mul(g, param_view(c, w, g))) : gp;
  Stack args = c.args;
  args[w_i] = c.batched(w) ? one : w;
  Tensor xhat;
  std::vector<int64_t> dims;  // an example's dims summed for the weight and bias
  if (group) {  // (B, N, C, ..) -> (B * N, C, ..)
    const int64_t G = c.args[ops::_group_norm_backward::kArg_num_groups].to_int(), N = xp.size(1);
    args[0] = gwp.flatten(0, 1);
    args[1] = xp.flatten(0, 1);
    xhat = kiln::_group_norm(xp.flatten(0, 1), G, one, zero, eps).unflatten(0, {c.batch, N});
    for (int64_t d = 1; d < xp.dim(); ++d)
      if (d != 2) dims.push_back(d);
  } else {
    args[0] = gwp;
    args[1] = xp;
    xhat = rms ? kiln::_rms_norm(xp, ps, one, eps) : kiln::_layer_norm(xp, ps, one, zero, eps);
    for (int64_t d = 1; d < xp.dim() - static_cast<int64_t>(ps.size()); ++d) dims.push_back(d);
  }
  Stack outs = run(c.op, std::move(args));  // its weight and bias sums span every example
  if (group) outs[0] = outs[0].to_tensor().unflatten(0, {c.batch, xp.size(1)});
  auto rows_sum = [&](const Tensor& t) {
    return dims.empty() ? t : kiln::sum(t, dims, false, std::nullopt);
  };
  outs[1] = rows_sum(kiln::mul(gp, xhat));
  if (!rms) outs[2] = rows_sum(gp);
  return wrap_outputs(c, std::move(outs));
}

Result rowwise_rule(Call& c) {
  if (c.batch == 0) return std::nullopt;
  const int64_t B = c.batch;
  if (c.is<ops::_layer_norm_backward>() || c.is<ops::_rms_norm_backward>() ||
      c.is<ops::_group_norm_backward>())
    return norm_backward(c);
  for (int i = 0; i < c.info().num_args; ++i)
    if (c.args[i].is_tensor() && is_parameter(c, i) && c.batched(c.args[i].to_tensor()))
      return batched_parameters(c);
  if (c.is<ops::embedding_dense_backward>()) {  // example b's rows become rows b * num_weights + i
    Tensor g = front_or_expand(c, c.args[0].to_tensor());
    Tensor idx = front_or_expand(c, c.args[1].to_tensor());
    const int64_t nw = c.args[2].to_int(), pad = c.args[3].to_int();
    if (pad >= 0) g = kiln::mul(g, kiln::ne(idx, scalar_to_tensor(Scalar(pad))).unsqueeze(-1).to(g.dtype()));
    std::vector<int64_t> shape(idx.dim(), 1);
    shape[0] = B;
    Tensor offsets = kiln::arange(0, B * nw, nw, kInt64, idx.device()).view(shape);
    Tensor gw = kiln::embedding_dense_backward(g, kiln::add(idx, offsets), B * nw, -1,
                                               c.args[4].get<bool>("scale_grad_by_freq"));
    return wrap_outputs(c, Stack{gw.unflatten(0, {B, nw})});
  }
  if (c.is<ops::_batch_norm>() || c.is<ops::batch_norm_backward>() ||
      c.is<ops::batch_norm_backward_weight>()) {
    Stack args = c.args;
    int64_t C = 0;
    for (int i = 0; i < c.info().num_args; ++i) {
      if (!c.args[i].is_tensor()) continue;
      const Tensor& t = c.args[i].to_tensor();
      if (is_parameter(c, i)) {
        args[i] = t.repeat({B});
      } else {
        if (t.dim() < 2) return std::nullopt;  // the loop raises the shape error
        C = t.size(1);
        args[i] = fold_into_channels(c, t);
      }
    }
    Tensor out = run(c.op, std::move(args))[0].to_tensor();
    if (c.is<ops::batch_norm_backward_weight>())
      return wrap_outputs(c, Stack{out.unflatten(0, {B, C})});
    return wrap_outputs(c, Stack{out.unflatten(1, {B, C}).transpose(0, 1)});
  }
  // dropout_seeded: every example gets the mask of (seed, offset), as in the loop
  if (c.is<ops::dropout_seeded>()) {
    const Tensor& x = c.args[0].to_tensor();
    Tensor scale = kiln::dropout_seeded(kiln::ones(x.sizes(), x.dtype(), x.device()),
                                        c.args[1].to_double(), c.args[2].to_int(),
                                        c.args[3].to_int());
    return Stack{kiln::where(kiln::ne(scale, scalar_to_tensor(Scalar(0.0))), kiln::mul(x, scale),
                             scalar_to_tensor(Scalar(0.0)))};
  }
  if ((c.is<ops::_fused_attention>() &&
       c.args[ops::_fused_attention::kArg_dropout_p].to_double() > 0) ||
      (c.is<ops::_fused_attention_backward>() &&
       c.args[ops::_fused_attention_backward::kArg_dropout_p].to_double() > 0))
    return std::nullopt;  // the loop: every example draws the mask of one (seed, offset)
  // cross_entropy and group_norm look at their input's rank (below)
  int input_i = -1;
  if (c.is<ops::cross_entropy_indices>()) input_i = ops::cross_entropy_indices::kArg_input;
  if (c.is<ops::cross_entropy_indices_backward>())
    input_i = ops::cross_entropy_indices_backward::kArg_input;
  const bool cross_entropy = input_i >= 0, group_norm = c.is<ops::_group_norm>();
  if (group_norm) input_i = ops::_group_norm::kArg_input;
  const int64_t rank = input_i >= 0 ? c.args[input_i].to_tensor().dim() : 0;
  const bool merge_n = (cross_entropy && rank >= 2) || group_norm;  // (B, N, ..) -> (B * N, ..)
  if (cross_entropy && rank == 0) return std::nullopt;
  Stack args = c.args;
  for (int i = 0; i < c.info().num_args; ++i) {
    if (c.args[i].is_tensor_list()) return std::nullopt;
    if (c.args[i].is_tensor()) {
      const Tensor& t = c.args[i].to_tensor();
      if (!t.defined() || is_parameter(c, i)) continue;
      Tensor f = front_or_expand(c, t);
      if (merge_n) {
        if (f.dim() < 2) return std::nullopt;
        f = f.flatten(0, 1);
      }
      args[i] = f;
    } else if (c.info().args[i].role == ArgRole::Dim &&
               c.info().args[i].arg_type == ArgType::Int) {
      const int64_t r = c.args[0].to_tensor().dim();
      args[i] = wrap_dim(c, c.args[i].to_int(), r) + 1;
    }
  }
  Stack outs = run(c.op, std::move(args));
  if (merge_n) {
    const int64_t n = c.args[input_i].to_tensor().size(0);
    for (IValue& o : outs) o = o.to_tensor().unflatten(0, {B, n});
  }
  return wrap_outputs(c, std::move(outs));
}

}  // namespace kiln::autograd::batching
