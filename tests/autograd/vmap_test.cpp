// func::vmap and the Batched key (kiln/autograd/batched.h): every row has a batching rule, the
// models' ops never taking the per-example fallback, nesting, in_dims/out_dims, errors, and
// composition with grad, vjp and jacrev. Every manifest op under vmap against the loop over the
// examples, in every dtype it claims, is the conformance driver's Batched path
// (tests/conformance/batched_path.cpp, Conformance.BatchedAgreesWithTheLoop).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/autograd.h"
#include "kiln/autograd/batched.h"
#include "kiln/autograd/forward_ad.h"
#include "kiln/generated/op_handles.h"
#include "kiln/kiln.h"
#include "samples/manifest.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random;
using testing::to_doubles;

// ---- the ops models use never take the loop ----------------------------------------------------

// The ops of an MLP, a CNN and a transformer block (forward and the rows their backward uses).
const std::vector<std::string> kMlpOps = {
    "linear",  "addmm",  "mm",   "matmul",      "t",       "relu",   "gelu",      "tanh",
    "sigmoid", "silu",   "add",  "sub",         "mul",     "div",    "neg",       "exp",
    "log",     "sum",    "mean", "log_softmax", "softmax", "gather", "unsqueeze", "squeeze",
    "max.dim", "argmax", "eq",   "where",       "clamp",   "pow",
    "cross_entropy", "cross_entropy_indices", "cross_entropy_indices_backward", "nll_loss",
    "mse_loss", "dropout", "dropout_seeded", "softmax_backward_data", "log_softmax_backward_data"};
const std::vector<std::string> kCnnOps = {
    "view", "reshape", "flatten", "permute", "mean", "var",    "sqrt", "rsqrt",
    "add",  "mul",     "relu",    "max.dim", "cat",  "narrow", "slice",
    "conv2d", "convolution", "convolution_backward_weight", "max_pool2d",
    "max_pool2d_with_indices", "max_pool2d_backward", "avg_pool2d", "adaptive_avg_pool2d",
    "batch_norm", "_batch_norm", "batch_norm_backward", "batch_norm_backward_weight",
    "group_norm", "_group_norm", "_group_norm_backward"};
// (A causal mask from tril/triu of constants is never batched, so their loop does not matter.)
const std::vector<std::string> kTransformerOps = {
    "matmul", "bmm",         "softmax", "transpose",  "permute", "view",     "reshape",
    "mul",    "add",         "div",     "sqrt",       "rsqrt",   "mean",     "var",
    "sub",    "masked_fill", "expand",  "contiguous", "split",   "chunk",    "stack",
    "cat",    "select",      "gelu",    "exp",        "maximum", "logsumexp",
    "layer_norm", "_layer_norm", "_layer_norm_backward", "rms_norm", "_rms_norm",
    "_rms_norm_backward", "embedding",
    "embedding_dense_backward", "scaled_dot_product_attention", "_fused_attention",
    "_fused_attention_backward"};

TEST(Vmap, ModelOpsHaveBatchingRules) {
  std::string missing;
  for (const auto* list : {&kMlpOps, &kCnnOps, &kTransformerOps})
    for (const std::string& name : *list) {
      const OperatorHandle* op = Dispatcher::get().find(name);
      if (op == nullptr) {
        missing += name + " (not in the table) ";
        continue;
      }
      if (op->info().batching == BatchingRule::Fallback) missing += name + " ";
    }
  EXPECT_TRUE(missing.empty()) << "model ops without a batching rule: " << missing;
}

// A two-layer MLP classifier's loss for one example: x (3,), y () int64.
Tensor mlp_loss(const std::vector<Tensor>& p) {
  const Tensor &w1 = p[0], &b1 = p[1], &w2 = p[2], &b2 = p[3], &x = p[4], &y = p[5];
  Tensor h = kiln::gelu(kiln::linear(x, w1, b1)) + kiln::tanh(kiln::relu(x.matmul(w1.t())));
  h = h * kiln::sigmoid(h) + kiln::exp(-h.abs()).log1p();
  Tensor logits =
      kiln::addmm(b2.unsqueeze(0), h.unsqueeze(0), w2.t()).squeeze(std::vector<int64_t>{0});
  Tensor logp = kiln::log_softmax(logits, 0);
  Tensor pick = kiln::gather(logp, 0, y.unsqueeze(0));
  return -pick.sum() + 0.01 * kiln::softmax(logits, -1).log().mean();
}

std::vector<Tensor> mlp_params() {
  return {random({4, 3}, kFloat64, -1, 1, 1), random({4}, kFloat64, -1, 1, 2),
          random({2, 4}, kFloat64, -1, 1, 3), random({2}, kFloat64, -1, 1, 4)};
}

TEST(Vmap, MlpForwardAndPerSampleGradientsTakeNoLoop) {
  func::clear_vmap_fallback_ops();
  std::vector<Tensor> p = mlp_params();
  Tensor x = random({5, 3}, kFloat64, -2, 2, 7);
  Tensor y = testing::from_vector<int64_t>({0, 1, 1, 0, 1}, {5});
  std::vector<std::optional<int64_t>> in_dims = {
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, 0, 0};
  std::vector<Tensor> args = {p[0], p[1], p[2], p[3], x, y};
  Tensor losses = func::vmap(func::Fn(mlp_loss), in_dims)(args);
  ASSERT_EQ(losses.sizes(), IntArrayRef({5}));
  for (int64_t b = 0; b < 5; ++b)
    expect_close(losses.select(0, b),
                 mlp_loss({p[0], p[1], p[2], p[3], x.select(0, b), y.select(0, b)}), 1e-12);

  // grad over the parameters of one example's loss; the labels are not differentiated.
  func::MultiFn grads_of = [](const std::vector<Tensor>& a) {
    const Tensor y = a[5];
    func::Fn loss = [y](const std::vector<Tensor>& q) {
      return mlp_loss({q[0], q[1], q[2], q[3], q[4], y});
    };
    return func::grad(loss, {0, 1, 2, 3})({a[0], a[1], a[2], a[3], a[4]});
  };
  func::MultiFn per_sample = func::vmap(grads_of, in_dims);
  std::vector<Tensor> gs = per_sample(args);
  ASSERT_EQ(gs.size(), 4u);
  for (int64_t b = 0; b < 5; ++b) {
    std::vector<Tensor> want = grads_of({p[0], p[1], p[2], p[3], x.select(0, b), y.select(0, b)});
    for (size_t i = 0; i < 4; ++i) expect_close(gs[i].select(0, b), want[i], 1e-10, 1e-12);
  }
  EXPECT_FALSE(gs[0].requires_grad());
  EXPECT_TRUE(func::vmap_fallback_ops().empty())
      << "fallback taken by " << func::vmap_fallback_ops()[0];
}

// Multi-head self-attention and a layer norm, written from table ops, on one sequence (T, C).
Tensor attention_block(const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &wqkv = in[1], &wo = in[2];
  const int64_t T = x.size(0), C = x.size(1), H = 2, D = C / H;
  std::vector<Tensor> qkv = kiln::linear(x, wqkv).chunk(3, -1);
  auto heads = [&](const Tensor& t) { return t.view({T, H, D}).transpose(0, 1); };  // (H, T, D)
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor scores = kiln::bmm(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(D));
  Tensor causal = kiln::ones({T, T}, kBool).triu(1);
  scores = scores.masked_fill(causal, -1e9);
  Tensor att = kiln::matmul(kiln::softmax(scores, -1), v);  // (H, T, D)
  Tensor merged = att.permute({1, 0, 2}).contiguous().reshape({T, C});
  Tensor h = x + kiln::matmul(merged, wo.t());
  Tensor mu = h.mean(std::vector<int64_t>{-1}, true);
  Tensor var = h.var(std::vector<int64_t>{-1}, 0.0, true);
  return (h - mu) * kiln::rsqrt(var + 1e-5);
}

TEST(Vmap, AttentionBlockTakesNoLoop) {
  func::clear_vmap_fallback_ops();
  Tensor x = random({3, 4, 6}, kFloat64, -1, 1, 11);
  Tensor wqkv = random({18, 6}, kFloat64, -0.5, 0.5, 12),
         wo = random({6, 6}, kFloat64, -0.5, 0.5, 13);
  Tensor got =
      func::vmap(func::Fn(attention_block), {0, std::nullopt, std::nullopt})({x, wqkv, wo});
  ASSERT_EQ(got.sizes(), IntArrayRef({3, 4, 6}));
  for (int64_t b = 0; b < 3; ++b)
    expect_close(got.select(0, b), attention_block({x.select(0, b), wqkv, wo}), 1e-10, 1e-12);
  // Batched weights too (an ensemble), and the batch dim elsewhere.
  Tensor ws = kiln::stack({wqkv, wqkv * 0.5, wqkv * 2.0}, 1);
  Tensor got2 =
      func::vmap(func::Fn(attention_block), {1, 1, std::nullopt}, 2)({x.transpose(0, 1), ws, wo});
  ASSERT_EQ(got2.sizes(), IntArrayRef({4, 6, 3}));
  for (int64_t b = 0; b < 3; ++b)
    expect_close(got2.select(2, b), attention_block({x.select(0, b), ws.select(1, b), wo}), 1e-10,
                 1e-12);
  EXPECT_TRUE(func::vmap_fallback_ops().empty())
      << "fallback taken by " << func::vmap_fallback_ops()[0];
}

// A token model: embedding, layer_norm, the attention block, rms_norm, a head and cross_entropy,
// on one sequence of tokens (T,) with targets (T,). Per-example gradients of every parameter
// under vmap(grad) take no loop and equal one grad per example.
Tensor token_loss(const std::vector<Tensor>& a) {
  const Tensor &emb = a[0], &ln_w = a[1], &ln_b = a[2], &wqkv = a[3], &wo = a[4], &head = a[5];
  const Tensor &tokens = a[6], &targets = a[7];
  Tensor h = kiln::embedding(emb, tokens, /*padding_idx=*/0);
  h = kiln::layer_norm(h, {h.size(-1)}, ln_w, ln_b);
  h = attention_block({h, wqkv, wo});
  h = kiln::rms_norm(h, {h.size(-1)}, ln_w);
  return kiln::cross_entropy(kiln::linear(h, head), targets, std::nullopt, "mean", -100, 0.1);
}

TEST(Vmap, TokenModelPerSampleGradientsTakeNoLoop) {
  func::clear_vmap_fallback_ops();
  std::vector<Tensor> params = {random({7, 6}, kFloat64, -1, 1, 31), random({6}, kFloat64, 0.5, 1.5, 32),
                                random({6}, kFloat64, -0.5, 0.5, 33), random({18, 6}, kFloat64, -0.5, 0.5, 34),
                                random({6, 6}, kFloat64, -0.5, 0.5, 35), random({7, 6}, kFloat64, -0.5, 0.5, 36)};
  Tensor tokens = testing::from_vector<int64_t>({1, 2, 0, 3, 4, 4, 5, 6, 0, 1, 2, 3}, {3, 4});
  Tensor targets = testing::from_vector<int64_t>({2, 0, 3, 1, 6, 5, 4, 4, 1, 1, 0, 2}, {3, 4});
  func::MultiFn grads_of = [](const std::vector<Tensor>& a) {
    func::Fn loss = [&a](const std::vector<Tensor>& q) {
      return token_loss({q[0], q[1], q[2], q[3], q[4], q[5], a[6], a[7]});
    };
    return func::grad(loss, {0, 1, 2, 3, 4, 5})({a[0], a[1], a[2], a[3], a[4], a[5]});
  };
  std::vector<std::optional<int64_t>> in_dims(6, std::nullopt);
  in_dims.push_back(0);
  in_dims.push_back(0);
  std::vector<Tensor> args = params;
  args.push_back(tokens);
  args.push_back(targets);
  std::vector<Tensor> gs = func::vmap(grads_of, in_dims)(args);
  EXPECT_TRUE(func::vmap_fallback_ops().empty())
      << "fallback taken by " << func::vmap_fallback_ops()[0];
  ASSERT_EQ(gs.size(), 6u);
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<Tensor> one = params;
    one.push_back(tokens.select(0, b));
    one.push_back(targets.select(0, b));
    std::vector<Tensor> want = grads_of(one);
    for (size_t i = 0; i < 6; ++i) expect_close(gs[i].select(0, b), want[i], 1e-10, 1e-12);
  }
}

// The fused attention kernel under vmap(grad): per-example gradients of q, k, v and a weight,
// with no loop.
TEST(Vmap, FusedAttentionPerSampleGradientsTakeNoLoop) {
  func::clear_vmap_fallback_ops();
  Tensor x = random({3, 2, 5, 4}, kFloat64, -1, 1, 51);  // 3 examples of (heads=2, T=5, D=4)
  Tensor w = random({4, 4}, kFloat64, -0.5, 0.5, 52);
  func::Fn loss = [](const std::vector<Tensor>& a) {
    Tensor q = kiln::matmul(a[0], a[1]);
    Tensor y = kiln::scaled_dot_product_attention(q, a[0], a[0] * 2.0, 0.0, true);
    return (y * y).sum();
  };
  func::MultiFn g = [&](const std::vector<Tensor>& a) { return func::grad(loss, {0, 1})(a); };
  std::vector<Tensor> gs = func::vmap(g, {0, std::nullopt})({x, w});
  EXPECT_TRUE(func::vmap_fallback_ops().empty())
      << "fallback taken by " << func::vmap_fallback_ops()[0];
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<Tensor> want = g({x.select(0, b), w});
    for (size_t i = 0; i < 2; ++i) expect_close(gs[i].select(0, b), want[i], 1e-10, 1e-12);
  }
}

// A conv block with batch_norm (training: each example's statistics over its own N) and
// group_norm: per-example outputs under vmap equal the loop, with no fallback.
TEST(Vmap, NormBlocksTakeNoLoop) {
  func::clear_vmap_fallback_ops();
  Tensor x = random({3, 2, 4, 5, 5}, kFloat64, -1, 1, 41);  // 3 examples of (N=2, C=4, 5, 5)
  Tensor w = random({4}, kFloat64, 0.5, 1.5, 42), bias = random({4}, kFloat64, -0.5, 0.5, 43);
  func::Fn block = [](const std::vector<Tensor>& a) {
    Tensor h = kiln::batch_norm(a[0], a[1], a[2], std::nullopt, std::nullopt, true, 0.1, 1e-5);
    return kiln::group_norm(kiln::relu(h), 2, a[1], a[2]).sum();
  };
  func::MultiFn g = [&](const std::vector<Tensor>& a) { return func::grad(block, {0, 1, 2})(a); };
  std::vector<Tensor> gs = func::vmap(g, {0, std::nullopt, std::nullopt})({x, w, bias});
  EXPECT_TRUE(func::vmap_fallback_ops().empty())
      << "fallback taken by " << func::vmap_fallback_ops()[0];
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<Tensor> want = g({x.select(0, b), w, bias});
    for (size_t i = 0; i < 3; ++i) expect_close(gs[i].select(0, b), want[i], 1e-10, 1e-12);
  }
}

// ---- vmap itself -------------------------------------------------------------------------------

TEST(Vmap, NestedVmapIsAnOuterProduct) {
  Tensor a = random({3}, kFloat64, -1, 1, 1), b = random({4}, kFloat64, -1, 1, 2);
  func::Fn mul = [](const std::vector<Tensor>& v) { return v[0] * v[1]; };
  Tensor outer = func::vmap(func::vmap(mul, {std::nullopt, 0}), {0, std::nullopt})({a, b});
  ASSERT_EQ(outer.sizes(), IntArrayRef({3, 4}));
  expect_close(outer, a.unsqueeze(1) * b.unsqueeze(0), 1e-12);
  // vmap of vmap over a (3, 4, 5) tensor: the inner op sees (5,).
  Tensor x = random({3, 4, 5}, kFloat64, -1, 1, 3);
  func::UnaryFn soft = [](const Tensor& t) { return kiln::softmax(t, 0) * t.sum(); };
  Tensor y = func::vmap(func::vmap(soft, 1, 0), 0, 1)(x);  // inner maps dim 1 of each (4, 5)
  ASSERT_EQ(y.sizes(), IntArrayRef({5, 3, 4}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j)
      expect_close(y.select(0, j).select(0, i), soft(x.select(0, i).select(1, j)), 1e-12);
}

TEST(Vmap, InDimsAndOutDims) {
  Tensor x = random({4, 3}, kFloat64, -1, 1, 1), w = random({3}, kFloat64, -1, 1, 2);
  func::Fn dot = [](const std::vector<Tensor>& v) { return (v[0] * v[1]).sum(); };
  expect_close(func::vmap(dot, {0, std::nullopt})({x, w}), kiln::matmul(x, w), 1e-12);
  expect_close(func::vmap(dot, {-1, std::nullopt})({x.t(), w}), kiln::matmul(x, w), 1e-12);
  func::UnaryFn twice = [](const Tensor& t) { return t * 2.0; };
  expect_close(func::vmap(twice, 0, 1)(x), x.t() * 2.0, 1e-12);
  expect_close(func::vmap(twice, 1, -1)(x), x * 2.0, 1e-12);
  // An output that does not depend on the batch comes back expanded.
  func::Fn constant = [&](const std::vector<Tensor>&) { return w; };
  Tensor c = func::vmap(constant)({x});
  ASSERT_EQ(c.sizes(), IntArrayRef({4, 3}));
  expect_close(c.select(0, 2), w, 0);
  // Several outputs with their own out_dims, and chunking.
  func::MultiFn two = [](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{v[0].sum(), v[0].unsqueeze(0) * 3.0};
  };
  std::vector<Tensor> outs = func::vmap(two, {}, {0, 2}, 3)({x});
  expect_close(outs[0], x.sum(std::vector<int64_t>{1}), 1e-12);
  ASSERT_EQ(outs[1].sizes(), IntArrayRef({1, 3, 4}));
  expect_close(outs[1].select(0, 0), x.t() * 3.0, 1e-12);
}

TEST(Vmap, Errors) {
  Tensor x = random({4, 3}), y = random({5, 3});
  func::Fn add = [](const std::vector<Tensor>& v) { return v[0] + v[1]; };
  expect_error(ErrorKind::Value, "same batch size", [&] { func::vmap(add)({x, y}); });
  expect_error(ErrorKind::Value, "at least one input must be batched", [&] {
    func::vmap(add, {std::nullopt, std::nullopt})({x, y});
  });
  expect_error(ErrorKind::Value, "in_dim 2 of input 0 is out of range", [&] {
    func::vmap(add, {2, 0})({x, x});
  });
  expect_error(ErrorKind::Value, "in_dims has 1 entries", [&] { func::vmap(add, {0})({x, x}); });
  func::UnaryFn id = [](const Tensor& t) { return t; };
  expect_error(ErrorKind::Value, "out_dim 3", [&] { func::vmap(id, 0, 3)(x); });
  // In-place into an unbatched tensor from a batched one.
  Tensor z = kiln::zeros({3});
  func::UnaryFn into = [&](const Tensor& t) { return z.add_(t); };
  expect_error(ErrorKind::Value, "self is not batched", [&] { func::vmap(into)(x); });
  // Data of a BatchedTensor cannot be read; backward is refused.
  func::UnaryFn read = [](const Tensor& t) { return scalar_to_tensor(t.sum().item<float>()); };
  expect_error(ErrorKind::Runtime, "batched by vmap", [&] { func::vmap(read)(x); });
  func::UnaryFn back = [](const Tensor& t) {
    t.sum().backward();
    return t;
  };
  expect_error(ErrorKind::NotImplemented, "use func::grad", [&] { func::vmap(back)(x); });
}

TEST(Vmap, InPlaceOnBatchedWritesEachExample) {
  Tensor x = random({4, 3}, kFloat64, -1, 1, 5);
  Tensor w = random({3}, kFloat64, -1, 1, 6);
  Tensor target = x.clone();
  func::Fn f = [](const std::vector<Tensor>& v) {
    v[0].mul_(v[1]).add_(scalar_to_tensor(1.0));
    v[0].select(0, 1).zero_();  // through a view of the example
    return v[0];
  };
  Tensor out = func::vmap(f, {0, std::nullopt})({target, w});
  Tensor want = x * w + 1.0;
  want.select(1, 1).zero_();
  expect_close(out, want, 1e-12);
  expect_close(target, want, 1e-12);  // the caller's tensor was the value
  // Batched at dim 1: writes land in the right examples.
  Tensor t2 = x.t().contiguous();
  func::vmap(f, {1, std::nullopt})({t2, w});
  expect_close(t2.t(), want, 1e-12);
}

TEST(Vmap, RandomnessDiffersPerExample) {
  Tensor p = kiln::full({4, 1000}, 0.5, kFloat64);
  func::UnaryFn draw = [](const Tensor& t) { return kiln::bernoulli(t); };
  Tensor s = func::vmap(draw)(p);
  ASSERT_EQ(s.sizes(), IntArrayRef({4, 1000}));
  EXPECT_NE(to_doubles(s.select(0, 0)), to_doubles(s.select(0, 1)));
}

TEST(Vmap, FallbackIsCorrectAndWarnsOnce) {
  Tensor x = random({3, 4, 4}, kFloat64, -1, 1, 9);
  func::UnaryFn low = [](const Tensor& t) { return kiln::tril(t, -1); };
  const std::string msg = "vmap: no batching rule for tril; using the slow per-example loop";
  ::testing::internal::CaptureStderr();
  Tensor a = func::vmap(low)(x);
  std::string first = ::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  Tensor b = func::vmap(low)(x);
  std::string second = ::testing::internal::GetCapturedStderr();
  // Once per process: the first call warns unless an earlier test already did; never again.
  EXPECT_LE(std::count(first.begin(), first.end(), '\n'), 1) << first;
  EXPECT_EQ(second.find(msg), std::string::npos) << second;
  std::vector<std::string> ops = func::vmap_fallback_ops();
  EXPECT_NE(std::find(ops.begin(), ops.end(), "tril"), ops.end());
  for (int64_t i = 0; i < 3; ++i) expect_close(a.select(0, i), kiln::tril(x.select(0, i), -1), 0);
  expect_close(a, b, 0);
}

// ---- what the rules read from the op table ------------------------------------------------------

// The argument positions the rules read (Note [Argument positions] in tensor/ops/gen.py) are the
// schema's: the argument at ops::X::kArg_<name> is named <name>.
TEST(Vmap, GeneratedArgumentPositionsMatchTheSchema) {
  struct Pos {
    const OperatorHandle& op;
    int i;
    const char* name;
  };
  const Pos read[] = {
      {ops::convolution::handle(), ops::convolution::kArg_groups, "groups"},
      {ops::convolution::handle(), ops::convolution::kArg_transposed, "transposed"},
      {ops::convolution::handle(), ops::convolution::kArg_output_padding, "output_padding"},
      {ops::convolution_backward_weight::handle(), ops::convolution_backward_weight::kArg_groups,
       "groups"},
      {ops::convolution_backward_weight::handle(),
       ops::convolution_backward_weight::kArg_weight_size, "weight_size"},
      {ops::_layer_norm_backward::handle(), ops::_layer_norm_backward::kArg_normalized_shape,
       "normalized_shape"},
      {ops::_rms_norm_backward::handle(), ops::_rms_norm_backward::kArg_eps, "eps"},
      {ops::_group_norm_backward::handle(), ops::_group_norm_backward::kArg_num_groups,
       "num_groups"},
      {ops::_fused_attention_backward::handle(), ops::_fused_attention_backward::kArg_dropout_p,
       "dropout_p"},
      {ops::cross_entropy_indices_backward::handle(),
       ops::cross_entropy_indices_backward::kArg_input, "input"},
      {ops::add_out::handle(), ops::add_out::kArg_out, "out"},
  };
  for (const Pos& p : read) {
    ASSERT_LT(p.i, p.op.info().num_args) << p.op.name();
    EXPECT_STREQ(p.op.info().args[p.i].name, p.name) << p.op.name();
  }
  // The pool backward rows' self_size is found by its role.
  EXPECT_EQ(ops::max_pool2d_backward::handle().info().args[2].role, ArgRole::InputSize);
}

// vmap runs an out= variant as its functional op (OpInfo::functional), then copies: every out=
// op has one, and it takes the same arguments but `out`.
TEST(Vmap, OutAndInplaceVariantsKnowTheirFunctionalOp) {
  int outs = 0;
  for (const OperatorHandle* op : Dispatcher::get().ops()) {
    const OpInfo& info = op->info();
    const OperatorHandle* f = info.functional;
    if (info.is_out) {
      ++outs;
      ASSERT_NE(f, nullptr) << op->name();
    }
    if (f == nullptr) continue;
    EXPECT_TRUE(info.is_out || info.is_inplace) << op->name();
    EXPECT_EQ(f->info().functional, nullptr) << op->name();
    EXPECT_FALSE(f->info().is_out || f->info().is_inplace) << op->name();
    const int n = info.num_args - (info.is_out ? 1 : 0);
    ASSERT_EQ(f->info().num_args, n) << op->name() << " vs " << f->name();
    for (int i = 0; i < n; ++i)
      EXPECT_STREQ(f->info().args[i].name, info.args[i].name) << op->name() << " vs " << f->name();
  }
  EXPECT_GT(outs, 0);
  EXPECT_EQ(ops::add_out::handle().info().functional, &ops::add::handle());
  EXPECT_EQ(ops::add_::handle().info().functional, &ops::add::handle());
  EXPECT_EQ(ops::add::handle().info().functional, nullptr);
}

TEST(Vmap, OutVariantWritesEachExample) {
  Tensor x = random({3, 4}, kFloat64, -1, 1, 4), y = random({4}, kFloat64, -1, 1, 5);
  func::UnaryFn f = [&y](const Tensor& a) {
    Tensor o = kiln::zeros_like(a);  // batched, as out= inside vmap needs
    return kiln::add_out(o, a, y);
  };
  expect_close(func::vmap(f)(x), kiln::add(x, y), 0);
}

// ---- composition with autograd -----------------------------------------------------------------

Tensor sin_x2(const Tensor& x) { return (kiln::sin(x) * x * x).sum(); }

TEST(Vmap, GradOfVmap) {
  Tensor x = random({4, 3}, kFloat64, -2, 2, 1);
  func::UnaryFn total = [](const Tensor& t) { return func::vmap(func::UnaryFn(sin_x2))(t).sum(); };
  Tensor g = func::grad(total)(x);
  Tensor want = x * x * kiln::cos(x) + 2.0 * x * kiln::sin(x);
  expect_close(g, want, 1e-10, 1e-12);
  // Through a batch dim that is not first (the permute is differentiated).
  func::UnaryFn total1 = [](const Tensor& t) {
    return func::vmap(func::UnaryFn(sin_x2), 1, 0)(t).sum();
  };
  expect_close(func::grad(total1)(x), want, 1e-10, 1e-12);
}

TEST(Vmap, VmapOfGradAndVjp) {
  Tensor x = random({4, 3}, kFloat64, -2, 2, 2);
  Tensor g = func::vmap(func::grad(func::UnaryFn(sin_x2)))(x);
  expect_close(g, x * x * kiln::cos(x) + 2.0 * x * kiln::sin(x), 1e-10, 1e-12);
  // Per-example vjp with a captured, unbatched primal: each example its own gradient.
  Tensor w = random({3}, kFloat64, -1, 1, 3);
  func::Fn f = [](const std::vector<Tensor>& v) { return (v[0] * v[1]).sum() * v[1].sum(); };
  func::Fn grad_w = func::grad(f, 0);
  Tensor per = func::vmap(grad_w, {std::nullopt, 0})({w, x});
  for (int64_t b = 0; b < 4; ++b)
    expect_close(per.select(0, b), grad_w({w, x.select(0, b)}), 1e-10, 1e-12);
  func::UnaryFn vjp_row = [&](const Tensor& row) {
    auto [out, fn] =
        func::vjp(func::UnaryFn([](const Tensor& t) { return kiln::sin(t) * 2.0; }), row);
    return fn(kiln::ones_like(out) * row);
  };
  expect_close(func::vmap(vjp_row)(x), kiln::cos(x) * 2.0 * x, 1e-10, 1e-12);
}

TEST(Vmap, VmapOfJacrevJacfwdAndHessian) {
  Tensor x = random({3, 2}, kFloat64, -1, 1, 4);
  func::UnaryFn j =
      func::jacrev(func::UnaryFn([](const Tensor& t) { return kiln::sin(t) * t.sum(); }));
  Tensor per = func::vmap(j)(x);
  ASSERT_EQ(per.sizes(), IntArrayRef({3, 2, 2}));
  for (int64_t b = 0; b < 3; ++b) expect_close(per.select(0, b), j(x.select(0, b)), 1e-10, 1e-12);
  // Forward mode and hessian (jacfwd(jacrev)) per example.
  func::UnaryFn s = [](const Tensor& t) { return (kiln::sin(t) * t).sum() * t.sum(); };
  func::UnaryFn fwd =
      func::jacfwd(func::UnaryFn([](const Tensor& t) { return kiln::exp(t) * t.sum(); }));
  Tensor hs = func::vmap(func::hessian(s))(x), fs = func::vmap(fwd)(x);
  for (int64_t b = 0; b < 3; ++b) {
    expect_close(hs.select(0, b), func::hessian(s)(x.select(0, b)), 1e-10, 1e-12);
    expect_close(fs.select(0, b), fwd(x.select(0, b)), 1e-10, 1e-12);
  }
  // A BatchedTensor answers requires_grad for its value (what autograd records).
  func::UnaryFn probe = [](const Tensor& t) {
    EXPECT_TRUE(t.requires_grad());
    return t * 2.0;
  };
  func::grad(func::UnaryFn([&](const Tensor& t) { return func::vmap(probe)(t).sum(); }))(x);
}

// vmap over jvp: batched primals with one tangent, and one primal with batched tangents (the
// tangent sits on the primal's plain base, Note [Dual tensors under vmap]).
TEST(Vmap, VmapOfJvp) {
  Tensor x = random({4, 3}, kFloat64, -1, 1, 21), v = random({4, 3}, kFloat64, -1, 1, 22);
  func::UnaryFn f = [](const Tensor& t) { return kiln::tanh(t) * t.sum(); };
  func::Fn jv = [&](const std::vector<Tensor>& a) { return func::jvp(f, a[0], a[1]).second; };
  Tensor both = func::vmap(jv)({x, v});
  Tensor tangents_only = func::vmap(jv, {std::nullopt, 0})({x.select(0, 1), v});
  for (int64_t b = 0; b < 4; ++b) {
    expect_close(both.select(0, b), func::jvp(f, x.select(0, b), v.select(0, b)).second, 1e-12);
    expect_close(tangents_only.select(0, b), func::jvp(f, x.select(0, 1), v.select(0, b)).second,
                 1e-12);
  }
  // The tangent of a dual made inside vmap comes back batched like the primal.
  func::UnaryFn roundtrip = [](const Tensor& t) {
    autograd::forward::DualLevel level;
    Tensor d = autograd::forward::make_dual(t, t * 3.0);
    return autograd::forward::unpack_dual(kiln::sin(d)).tangent;
  };
  expect_close(func::vmap(roundtrip)(x), kiln::cos(x) * x * 3.0, 1e-12);
}

// jacrev's one batched backward equals one backward per output element (what it did before).
TEST(Vmap, JacrevEqualsTheRowLoop) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 8);
  func::UnaryFn f = [](const Tensor& t) {
    return kiln::matmul(kiln::softmax(t, -1), t.t()).exp() +
           t.sum(std::vector<int64_t>{1}).unsqueeze(0);
  };
  Tensor jac = func::jacrev(f)(x);
  auto [out, vjp_fn] = func::vjp(f, x);
  Tensor eye = kiln::eye(out.numel(), std::nullopt, kFloat64);
  std::vector<Tensor> rows;
  for (int64_t j = 0; j < out.numel(); ++j)
    rows.push_back(vjp_fn(eye.select(0, j).reshape(out.sizes())));
  DimVector shape(out.sizes());
  for (int64_t s : x.sizes()) shape.push_back(s);
  expect_close(jac, kiln::stack(rows, 0).reshape(shape), 1e-12, 1e-14);
  // jacrev of jacrev (second derivatives through a batched backward) against hessian.
  func::UnaryFn s = [](const Tensor& t) { return (kiln::sin(t) * t * t).sum(); };
  expect_close(func::jacrev(func::jacrev(s))(x), func::hessian(s)(x), 1e-10, 1e-12);
}

}  // namespace
}  // namespace kiln
