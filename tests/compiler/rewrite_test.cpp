// The compiler's functionalization and pattern rewrites (compiler/src/rewrite.cpp): what they
// change in the graph, what they must leave alone, and that the program still equals eager.
#include <gtest/gtest.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compiler/compile.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

int occurrences(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

std::string history(const compiler::CompiledFunction& f) {
  std::string h;
  for (const compiler::Event& e : f.explain())
    h += std::string(compiler::event_kind_name(e.kind)) + ": " + e.reason + "\n";
  return h;
}

// Runs `fn` compiled three times (capture, then replays) against eager.
compiler::CompiledFunction check_against_eager(const compiler::Fn& fn,
                                               const std::vector<Tensor>& in, double rtol = 0,
                                               double atol = 0) {
  auto f = compiler::compile(fn);
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> got = f(in), want = fn(in);
    EXPECT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size() && k < want.size(); ++k)
      expect_close(got[k], want[k], rtol, atol);
  }
  EXPECT_EQ(f.num_programs(), 1) << history(f);
  return f;
}

// See Note [Functionalization].
TEST(CompileFunctionalize, InPlaceOpsOnFreshStoragesBecomeFunctional) {
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor t = empty({4, 3});
    t.fill_(2.0);        // full
    t.mul_(in[0]);       // mul
    t.add_(in[0], 0.5);  // add
    Tensor c = empty({4, 3});
    c.copy_(t);  // clone
    Tensor d = empty({4, 3}, kFloat64);
    d.copy_(c);  // _to_copy
    return std::vector<Tensor>{relu_(c), d};
  };
  auto f = check_against_eager(fn, {random({4, 3}, kFloat32, -1, 1, 1)});
  const std::string g = f.graph_str(0);
  for (const char* op : {"fill_(", "mul_(", "add_(", "copy_(", "relu_(", "empty("})
    EXPECT_EQ(occurrences(g, op), 0) << op << "\n" << g;
  EXPECT_EQ(occurrences(g, "_to_copy("), 1) << g;
  // The mul, add and relu now fuse into one loop (Note [Fusion]).
  EXPECT_EQ(occurrences(g, "fused kiln_fused"), 1) << g;
}

TEST(CompileFunctionalize, WritesThatOthersSeeStayInPlace) {
  // An argument written in place: the program's effect, replayed where eager made it.
  Tensor x = random({5}, kFloat32, -1, 1, 2);
  auto f = compiler::compile([](const std::vector<Tensor>& in) {
    in[0].add_(ones({5}));
    return std::vector<Tensor>{in[0] * 2.0};
  });
  Tensor want = x.clone();
  for (int i = 0; i < 3; ++i) {
    f({x});
    want.add_(ones({5}));
    expect_close(x, want, 0, 0);
  }
  EXPECT_EQ(occurrences(f.graph_str(0), "add_("), 1) << f.graph_str(0);

  // A view taken before the write and read after it sees the written data: stays in place.
  auto g = check_against_eager(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0] * 1.0;
        Tensor row = t.select(0, 1);
        t.mul_(full({3, 4}, 3.0));
        return std::vector<Tensor>{row + 0.0};
      },
      {random({3, 4}, kFloat32, -1, 1, 3)});
  EXPECT_EQ(occurrences(g.graph_str(0), "mul_("), 1) << g.graph_str(0);

  // A write through a view of a fresh storage stays in place (no scatter rows to express it).
  auto h = check_against_eager(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0] * 1.0;
        t.select(0, 0).fill_(-1.0);
        return std::vector<Tensor>{t};
      },
      {random({3, 4}, kFloat32, -1, 1, 4)});
  EXPECT_EQ(occurrences(h.graph_str(0), "fill_("), 1) << h.graph_str(0);

  // A view taken before the write is returned: stays in place (the caller sees the written data).
  auto k = check_against_eager(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0] * 1.0;
        Tensor before = t.view({3});
        t.add_(ones({3}));
        return std::vector<Tensor>{before, t};
      },
      {random({3}, kFloat32, -1, 1, 5)});
  EXPECT_EQ(occurrences(k.graph_str(0), "add_("), 1) << k.graph_str(0);
}

// See Note [Pattern rewrites].
TEST(CompileRewrite, SigmoidTimesItsInputIsSilu) {
  auto f = check_against_eager(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{in[0] * sigmoid(in[0]) + sigmoid(in[1]) * in[1]};
      },
      {random({6, 5}, kFloat32, -4, 4, 6), random({6, 5}, kFloat32, -4, 4, 7)}, 1e-6, 1e-7);
  EXPECT_EQ(occurrences(f.graph_str(0), "silu("), 2) << f.graph_str(0);
  EXPECT_EQ(occurrences(f.graph_str(0), "sigmoid("), 0) << f.graph_str(0);
  EXPECT_NE(history(f).find("rewrites: silu x2"), std::string::npos) << history(f);

  // The sigmoid is needed anyway (it is returned): no rewrite, which would compute it twice.
  auto g = check_against_eager(
      [](const std::vector<Tensor>& in) {
        Tensor s = sigmoid(in[0]);
        return std::vector<Tensor>{in[0] * s, s};
      },
      {random({6}, kFloat32, -4, 4, 8)}, 1e-6, 1e-7);
  EXPECT_EQ(occurrences(g.graph_str(0), "silu("), 0) << g.graph_str(0);
}

// The benchmark GPT's attention, written out: (B, H, T, D) heads from a strided split.
std::vector<Tensor> written_attention(const Tensor& qkv, int64_t heads,
                                      const Tensor* mask_override) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  std::vector<Tensor> parts = qkv.split(C, 2);
  auto head = [&](const Tensor& t) { return t.view({B, T, heads, C / heads}).transpose(1, 2); };
  Tensor q = head(parts[0]), k = head(parts[1]), v = head(parts[2]);
  Tensor att = matmul(q, k.transpose(-2, -1)) / std::sqrt(double(C / heads));
  Tensor mask = mask_override ? *mask_override : eq(ones({T, T}).tril(), full({}, 0.0));
  att = softmax(masked_fill(att, mask, -std::numeric_limits<double>::infinity()), -1);
  return {matmul(att, v).transpose(1, 2).reshape({B, T, C})};
}

// See Note [Attention rewrite].
TEST(CompileRewrite, WrittenOutAttentionBecomesFusedAttention) {
  autograd::NoGradGuard no_grad;
  Tensor qkv = random({2, 8, 48}, kFloat32, -1, 1, 9);
  auto f = check_against_eager(
      [](const std::vector<Tensor>& in) { return written_attention(in[0], 4, nullptr); }, {qkv},
      1e-5, 1e-6);
  const std::string g = f.graph_str(0);
  EXPECT_EQ(occurrences(g, "_fused_attention("), 1) << g;
  EXPECT_NE(g.find(", True, 0.5,"), std::string::npos) << g;  // causal, scale 1/sqrt(16 / 4)
  EXPECT_EQ(occurrences(g, "softmax("), 0) << g;
  EXPECT_EQ(occurrences(g, "bmm("), 0) << g;

  // A mask that is not the causal one: the attention stays written out.
  Tensor other = random({8, 8}, kFloat32, 0, 1, 10) > 0.5;
  auto h = check_against_eager(
      [&](const std::vector<Tensor>& in) { return written_attention(in[0], 4, &other); }, {qkv});
  EXPECT_EQ(occurrences(h.graph_str(0), "_fused_attention("), 0) << h.graph_str(0);
}

// See Note [Rewrites before the backward]: a compiled forward with the attention gets the fused
// kernel's own backward, and the gradients equal eager's.
TEST(CompileRewrite, AttentionInACompiledForwardGetsTheFusedBackward) {
  Tensor w = random({16, 48}, kFloat32, -0.5, 0.5, 11).requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    return written_attention(matmul(in[0], w), 2, nullptr);
  };
  auto f = compiler::compile(fn);
  for (int i = 0; i < 3; ++i) {
    Tensor x = random({2, 6, 16}, kFloat32, -1, 1, 20 + i).requires_grad_();
    Tensor xe = x.detach().requires_grad_();
    w.set_grad(Tensor());
    Tensor yc = f({x})[0];
    (yc * yc).sum().backward();
    Tensor gw = w.grad();
    w.set_grad(Tensor());
    Tensor ye = fn({xe})[0];
    (ye * ye).sum().backward();
    expect_close(yc, ye, 1e-5, 1e-6);
    expect_close(x.grad(), xe.grad(), 1e-4, 1e-5);
    expect_close(gw, w.grad(), 1e-4, 1e-5);
  }
  EXPECT_EQ(f.num_programs(), 1) << history(f);
  const std::string g = f.graph_str(0);
  EXPECT_EQ(occurrences(g, "_fused_attention_backward("), 1) << g;
  EXPECT_EQ(occurrences(g, "softmax"), 0) << g;
  EXPECT_NE(history(f).find("rewrites: attention x1"), std::string::npos) << history(f);
}

TEST(CompileRewrite, AWholeTrainingStepKeepsItsWrittenOutAttention) {
  // The backward is part of the function: it reads the probabilities, so the forward's
  // attention is not rewritten (it would be computed twice).
  Tensor w = random({16, 48}, kFloat32, -0.5, 0.5, 12).requires_grad_();
  auto step = [&](const std::vector<Tensor>& in) {
    Tensor y = written_attention(matmul(in[0], w), 2, nullptr)[0];
    (y * y).sum().backward();
    Tensor g = w.grad();
    w.set_grad(Tensor());
    return std::vector<Tensor>{g};
  };
  auto f = check_against_eager(step, {random({2, 6, 16}, kFloat32, -1, 1, 13)}, 1e-5, 1e-6);
  EXPECT_EQ(occurrences(f.graph_str(0), "_fused_attention("), 0) << f.graph_str(0);
}

}  // namespace
}  // namespace kiln::testing
