// kiln::compile (kiln/compiler/compile.h): capture and replay against eager on the same inputs,
// whole training steps with SGD and AdamW, guards and recompiles, graph breaks, random ops,
// new optimizer state, the recompile limit, passes, fused code and its cache, and bad input.
#include "kiln/compiler/compile.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compiler/graph.h"
#include "kiln/meta.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using compiler::Event;

std::string history(const compiler::CompiledFunction& f) {
  std::string h;
  for (const Event& e : f.explain()) h += std::string(compiler::event_kind_name(e.kind)) + ": " + e.reason + "\n";
  return h;
}

int count(const compiler::CompiledFunction& f, Event::Kind k) {
  int n = 0;
  for (const Event& e : f.explain()) n += e.kind == k;
  return n;
}

TEST(Compile, ReplaysAPureFunction) {
  Tensor w = random({4, 3}, kFloat32, -1, 1, 1), b = random({3}, kFloat32, -1, 1, 2);
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{relu(add(mm(in[0], w), b)) * 2.0};
  };
  auto f = compile(fn);
  for (int i = 0; i < 4; ++i) {
    Tensor x = random({5, 4}, kFloat32, -1, 1, 10 + i);
    expect_close(f({x})[0], fn({x})[0], 0, 0);
  }
  EXPECT_EQ(f.num_programs(), 1);
  EXPECT_EQ(f.num_replays(), 3);
  EXPECT_EQ(f.num_recompiles(), 0);
  EXPECT_NE(f.graph_str(0).find("mm("), std::string::npos) << f.graph_str(0);
  // A captured tensor updated in place is read again at every replay.
  w.mul_(full({}, 0.5));
  Tensor x = random({5, 4}, kFloat32, -1, 1, 99);
  expect_close(f({x})[0], fn({x})[0], 0, 0);
  EXPECT_EQ(f.num_recompiles(), 0);
}

int occurrences(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Compile, PassesRemoveDeadOpsAndMergeCommonOnes) {
  Tensor w = random({3}, kFloat32, -1, 1, 5);
  auto fn = [&](const std::vector<Tensor>& in) {
    Tensor unused = in[0].exp();  // dead
    Tensor a = in[0].sin() + in[0].sin();  // one sin
    w.add_(full({}, 1.0));  // an effect: a later sin is not merged with the first
    return std::vector<Tensor>{a * in[0].sin(), (w * in[0]).sin()};
  };
  auto f = compile(fn);
  Tensor x = random({3}, kFloat32, -1, 1, 6);
  f({x});
  const std::string g = f.graph_str(0);
  EXPECT_EQ(occurrences(g, "exp("), 0) << g;
  EXPECT_EQ(occurrences(g, "sin("), 3) << g;
  EXPECT_EQ(occurrences(g, "add_("), 1) << g;
  Tensor w_before = w.clone();
  std::vector<Tensor> got = f({x});
  std::vector<Tensor> want = [&] {
    Tensor keep = w.clone();
    w.copy_(w_before);
    std::vector<Tensor> r = fn({x});
    w.copy_(keep);
    return r;
  }();
  expect_close(got[0], want[0], 0, 0);
  expect_close(got[1], want[1], 0, 0);
}

TEST(Compile, ConstantSubgraphsFoldOnce) {
  // A causal mask built each call, as the benchmark's GPT does, and a constant that is written
  // in place: functionalized (Note [Functionalization]), so the ones fold and each run adds
  // into a fresh tensor.
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor mask = eq(ones({4, 4}).tril(), full({}, 0.0));
    Tensor acc = ones({4});
    acc.add_(in[0].sum(std::vector<int64_t>{0}));
    return std::vector<Tensor>{masked_fill(in[0], mask, -1.0), acc};
  };
  auto f = compile(fn);
  Tensor x = random({4, 4}, kFloat32, -1, 1, 7);
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> got = f({x}), want = fn({x});
    expect_close(got[0], want[0], 0, 0);
    expect_close(got[1], want[1], 0, 0);
  }
  const std::string g = f.graph_str(0);
  EXPECT_EQ(occurrences(g, "tril("), 0) << g;
  EXPECT_EQ(occurrences(g, "add_("), 0) << g;
  EXPECT_EQ(occurrences(g, "add("), 1) << g;
}

TEST(Compile, AShapeChangeRecompilesOnceAndExplainsWhy) {
  auto f = compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0].sum(std::vector<int64_t>{1})}; });
  for (int i = 0; i < 3; ++i) f({ones({8, 4})});
  for (int i = 0; i < 3; ++i) expect_close(f({ones({2, 4})})[0], full({2}, 4.0), 0, 0);
  EXPECT_EQ(f.num_recompiles(), 1);
  EXPECT_EQ(f.num_programs(), 2);
  const Event& e = f.explain().back();
  EXPECT_EQ(e.kind, Event::Kind::Recompile);
  EXPECT_NE(e.reason.find("argument 0 sizes [2, 4] (captured: [8, 4])"), std::string::npos)
      << e.reason;
  // Grad mode is guarded too.
  {
    autograd::NoGradGuard ng;
    f({ones({2, 4})});
  }
  EXPECT_NE(f.explain().back().reason.find("grad mode"), std::string::npos);
}

std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, 32), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(32, 4)});
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Trains two copies of one model for `steps` steps, one eager and one through kiln::compile,
// and compares every loss and, at the end, every parameter.
void check_training(const MakeOpt& make_opt, int steps) {
  auto eager = make_mlp(), compiled = make_mlp();
  compiled->load_state_dict(eager->state_dict());
  auto opt_e = make_opt(eager->parameters()), opt_c = make_opt(compiled->parameters());
  nn::CrossEntropyLoss criterion;
  auto step_of = [&](nn::Sequential& m, optim::Optimizer& opt) {
    return [&](const std::vector<Tensor>& in) {
      Tensor loss = criterion(m.forward(in[0]), in[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss.detach()};
    };
  };
  auto eager_step = step_of(*eager, *opt_e);
  auto f = compile(step_of(*compiled, *opt_c));
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    Tensor x = random({16, 6}, kFloat32, -1, 1, 100 + s);
    Tensor y = random({16}, kInt64, 0, 4, 200 + s);
    Tensor le = eager_step({x, y})[0];
    Tensor lc = f({x, y})[0];
    expect_close(lc, le, 1e-5, 1e-6);
  }
  auto pe = eager->named_parameters(), pc = compiled->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i) {
    SCOPED_TRACE(pe[i].first);
    expect_close(pc[i].second, pe[i].second, 1e-5, 1e-6);
  }
  EXPECT_EQ(f.num_programs(), 1) << history(f);
  EXPECT_EQ(f.num_recompiles(), 0) << history(f);
  EXPECT_GE(f.num_replays(), steps - 2);
}

// zero_grad(set_to_none) first, as PyTorch's loops do. The first call begins with no .grad, so
// zero_grad replaces none and the program guards on their absence; the second begins with
// grads, and zero_grad's set_grad tells the capture that the entry .grad does not matter. From
// then on the loop replays without recompiling.
TEST(Compile, ZeroGradFirstStillReplays) {
  auto m = make_mlp();
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  nn::CrossEntropyLoss criterion;
  auto f = compile([&](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss = criterion(m->forward(in[0]), in[1]);
    loss.backward();
    opt.step();
    return std::vector<Tensor>{loss.detach()};
  });
  Tensor x = random({4, 6}, kFloat32, -1, 1, 1), y = random({4}, kInt64, 0, 4, 2);
  for (int i = 0; i < 6; ++i) f({x, y});
  EXPECT_EQ(f.num_programs(), 2) << history(f);
  EXPECT_EQ(f.num_recompiles(), 1) << history(f);
  EXPECT_EQ(f.num_replays(), 4);
}

TEST(Compile, SGDTrainingMatchesEager) {
  check_training(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::SGD>(std::move(ps),
                                            optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      },
      30);
}

TEST(Compile, AdamWTrainingMatchesEagerAfterItsStateExists) {
  check_training(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::AdamW>(std::move(ps),
                                              optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
      },
      30);
}

TEST(Compile, FirstStepStateIsARetryNotAWrongProgram) {
  auto m = make_mlp();
  optim::AdamW opt(m->parameters(), {.lr = 1e-2});
  nn::CrossEntropyLoss criterion;
  auto f = compile([&](const std::vector<Tensor>& in) {
    Tensor loss = criterion(m->forward(in[0]), in[1]);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return std::vector<Tensor>{loss.detach()};
  });
  Tensor x = random({4, 6}, kFloat32, -1, 1, 1), y = random({4}, kInt64, 0, 4, 2);
  f({x, y});
  ASSERT_FALSE(f.explain().empty());
  EXPECT_EQ(f.explain()[0].kind, Event::Kind::Retry) << f.explain()[0].reason;
  f({x, y});
  EXPECT_EQ(f.num_programs(), 1) << history(f);
}

TEST(Compile, ItemIsAGraphBreakAndTheCallStaysCorrect) {
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor s = in[0].sum();
    return std::vector<Tensor>{s.item<double>() > 0 ? in[0] * 2.0 : in[0] * -1.0};
  };
  auto f = compile(fn);
  Tensor pos = ones({3}), neg = full({3}, -1.0);
  expect_close(f({pos})[0], full({3}, 2.0), 0, 0);
  expect_close(f({neg})[0], full({3}, 1.0), 0, 0);  // a program would have replayed "* 2"
  EXPECT_EQ(f.num_programs(), 0);
  ASSERT_EQ(count(f, Event::Kind::GraphBreak), 1);
  EXPECT_NE(f.explain()[0].reason.find("read the data"), std::string::npos);
}

// See Note [Graph break segments]: the step reads its loss to pick a branch, so after the first
// call it runs as two segments (forward; backward and AdamW), each compiled once its key repeats.
TEST(Compile, AStepThatReadsItsLossRunsInCompiledSegmentsAndMatchesEager) {
  auto eager = make_mlp(), compiled = make_mlp();
  compiled->load_state_dict(eager->state_dict());
  optim::AdamWOptions o{.lr = 1e-2, .weight_decay = 0.1};
  optim::AdamW opt_e(eager->parameters(), o), opt_c(compiled->parameters(), o);
  nn::CrossEntropyLoss criterion;
  auto step_of = [&](nn::Sequential& m, optim::Optimizer& opt) {
    return [&](const std::vector<Tensor>& in) {
      opt.zero_grad();
      Tensor loss = criterion(m.forward(in[0]), in[1]);
      if (loss.item<double>() > 1.3) loss = loss * 2.0;
      loss.backward();
      opt.step();
      return std::vector<Tensor>{loss.detach()};
    };
  };
  auto eager_step = step_of(*eager, opt_e);
  auto f = compile(step_of(*compiled, opt_c));
  const int steps = 10;
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    Tensor x = random({16, 6}, kFloat32, -1, 1, 100 + s);
    Tensor y = random({16}, kInt64, 0, 4, 200 + s);
    expect_close(f({x, y})[0], eager_step({x, y})[0], 0, 0);
  }
  auto pe = eager->named_parameters(), pc = compiled->named_parameters();
  for (size_t i = 0; i < pe.size(); ++i) expect_close(pc[i].second, pe[i].second, 0, 0);
  EXPECT_EQ(f.num_programs(), 0) << history(f);
  EXPECT_EQ(count(f, Event::Kind::Segment), 2) << history(f);
  // Call 1 captures and breaks at the read (before AdamW makes its state), call 2 records the
  // segments' keys, the rest run both compiled.
  EXPECT_EQ(f.num_segment_runs(), 2 * (steps - 2)) << history(f);
}

TEST(Compile, RandomOpsDrawFreshNumbersAtEveryReplay) {
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{dropout(in[0], 0.5, true)};
  };
  auto f = compile(fn);
  Tensor x = ones({64});
  for (int i = 0; i < 3; ++i) {
    manual_seed(7 + i);
    Tensor c = f({x})[0];
    manual_seed(7 + i);
    expect_close(c, fn({x})[0], 0, 0);
  }
  EXPECT_EQ(f.num_replays(), 2);
}

TEST(Compile, PastTheRecompileLimitCallsRunEagerly) {
  auto f = compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + 1.0}; },
                   compiler::Options{.recompile_limit = 2});
  for (int64_t n = 1; n <= 4; ++n) expect_close(f({zeros({n})})[0], ones({n}), 0, 0);
  EXPECT_EQ(f.num_programs(), 2);
  EXPECT_EQ(count(f, Event::Kind::Fallback), 1);
  EXPECT_THROW(compile(nullptr), Error);
  EXPECT_THROW(compile([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; },
                       compiler::Options{.recompile_limit = 0}),
               Error);
  EXPECT_THROW(f.graph_str(5), Error);
}

// See Note [Compiled backward]: a compiled forward whose outputs need autograd gets a compiled
// backward, and the usual loop (loss and optimizer outside) trains as eager does.
TEST(Compile, AForwardThatNeedsAutogradCompilesItsBackward) {
  auto eager = make_mlp(), compiled = make_mlp();
  compiled->load_state_dict(eager->state_dict());
  optim::AdamW opt_e(eager->parameters(), {.lr = 1e-2}), opt_c(compiled->parameters(), {.lr = 1e-2});
  nn::CrossEntropyLoss criterion;
  auto forward = compile([&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{compiled->forward(in[0])};
  });
  for (int s = 0; s < 10; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    Tensor x = random({16, 6}, kFloat32, -1, 1, 100 + s), y = random({16}, kInt64, 0, 4, 200 + s);
    Tensor le = criterion(eager->forward(x), y), lc = criterion(forward({x})[0], y);
    expect_close(lc, le, 1e-5, 1e-6);
    le.backward();
    lc.backward();
    auto pe = eager->named_parameters(), pc = compiled->named_parameters();
    for (size_t i = 0; i < pe.size(); ++i) expect_close(pc[i].second.grad(), pe[i].second.grad(), 1e-5, 1e-6);
    opt_e.step();
    opt_c.step();
    opt_e.zero_grad();
    opt_c.zero_grad();
  }
  EXPECT_EQ(forward.num_programs(), 1) << history(forward);
  EXPECT_EQ(forward.num_replays(), 9);
  // Gradients reach the function's arguments too.
  Tensor x = random({4, 6}, kFloat32, -1, 1, 5).requires_grad_();
  auto g = compile([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(in[0]) * in[0]}; });
  for (int i = 0; i < 3; ++i) {
    Tensor xi = x.detach().requires_grad_();
    g({xi})[0].sum().backward();
    Tensor xe = x.detach().requires_grad_();
    (tanh(xe) * xe).sum().backward();
    expect_close(xi.grad(), xe.grad(), 1e-6, 1e-6);
  }
  EXPECT_EQ(g.num_replays(), 2) << history(g);
}

TEST(Compile, AForwardWithEffectsThatNeedsAutogradStaysEager) {
  auto bn = std::make_shared<nn::BatchNorm1d>(4);
  auto f = compile([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{bn->forward(in[0])}; });
  Tensor x = random({8, 4}, kFloat32, -1, 1, 3);
  f({x})[0].sum().backward();  // the eager graph is intact
  EXPECT_TRUE(bn->parameters()[0].grad().defined());
  EXPECT_EQ(f.num_programs(), 0);
  ASSERT_EQ(count(f, Event::Kind::Fallback), 1) << history(f);
  EXPECT_NE(f.explain()[0].reason.find("the forward has effects ('"), std::string::npos) << history(f);
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln-compile-test-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

// A pointwise chain, its backward included, fused into generated loops.
std::vector<Tensor> chain(const std::vector<Tensor>& in) {
  Tensor h = gelu(in[0] * in[1] + in[2]);
  return {relu(h - 0.25) * 2.0, tanh(h).exp()};
}

TEST(Compile, PointwiseChainsFuseAndMatchEager) {
  ScopedEnv cache("KILN_CACHE_DIR", fresh_dir("fuse").string());
  auto f = compile(chain);
  Tensor x = random({64, 33}, kFloat32, -2, 2, 1), w = random({64, 33}, kFloat32, -2, 2, 2),
         b = random({33}, kFloat32, -1, 1, 3).reshape({1, 33}).expand({64, 33}).contiguous();
  Tensor scalar_b = full({}, 0.5);
  for (int i = 0; i < 3; ++i) {
    std::vector<Tensor> got = f({x, w, b}), want = chain({x, w, b});
    expect_close(got[0], want[0], 1e-6, 1e-6);
    expect_close(got[1], want[1], 1e-6, 1e-6);
  }
  EXPECT_NE(f.graph_str(0).find("fused kiln_fused_0"), std::string::npos) << f.graph_str(0);
  EXPECT_NE(f.explain()[0].reason.find("1 fused loops"), std::string::npos) << history(f);
  // Inside a training step: the MLP's backward has relu/threshold chains.
  auto g = compile([](const std::vector<Tensor>& in) { return chain({in[0], in[1], in[2]}); });
  std::vector<Tensor> got = g({x, w, scalar_b}), want = chain({x, w, scalar_b});
  expect_close(g({x, w, scalar_b})[1], want[1], 1e-6, 1e-6);
  // NaN goes through fused relu as through the eager kernel.
  Tensor nan = full({64, 33}, std::nan(""));
  EXPECT_TRUE(std::isnan(f({nan, w, b})[0].flatten().select(0, 0).item<double>()));
}

// See Note [Broadcast inputs]: a conv-style bias (1, C, 1, 1), a row, a column and an expanded
// value join the loops, each read at the right place; a transposed input (its inner stride is
// not 1: runs of one element) stays outside them.
TEST(Compile, BroadcastInputsFuseAndMatchEager) {
  ScopedEnv cache("KILN_CACHE_DIR", fresh_dir("broadcast").string());
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor h = relu(in[0] + in[1].view({1, 6, 1, 1}));                 // in[0]: (4, 6, 5, 8)
    Tensor y = (h * in[2] - in[3]) * in[4].transpose(2, 3);            // (8,), (5, 1), (4, 6, 8, 5)
    return std::vector<Tensor>{y.exp() + in[5].expand({4, 6, 5, 8})};  // (6, 1, 8)
  };
  std::vector<Tensor> in = {
      random({4, 6, 5, 8}, kFloat32, -2, 2, 11), random({6}, kFloat32, -1, 1, 12),
      random({8}, kFloat32, -1, 1, 13),          random({5, 1}, kFloat32, -1, 1, 14),
      random({4, 6, 8, 5}, kFloat32, -1, 1, 15), random({6, 1, 8}, kFloat32, -1, 1, 16)};
  auto f = compile(fn);
  for (int i = 0; i < 2; ++i) expect_close(f(in)[0], fn(in)[0], 1e-6, 1e-6);
  const std::string g = f.graph_str(0);
  EXPECT_NE(g.find("fused kiln_fused_0: nodes 1 2 4 5 ->"), std::string::npos) << g;
  EXPECT_NE(g.find("fused kiln_fused_1: nodes 8 9 ->"), std::string::npos) << g;
  // Larger than the parallel threshold, with the bias of a conv.
  Tensor x = random({8, 32, 32, 32}, kFloat32, -1, 1, 17), b = random({32}, kFloat32, -1, 1, 18);
  auto conv_like = [](const std::vector<Tensor>& v) {
    return std::vector<Tensor>{relu(v[0] + v[1].view({1, 32, 1, 1})) * 0.5};
  };
  auto c = compile(conv_like);
  for (int i = 0; i < 2; ++i) expect_close(c({x, b})[0], conv_like({x, b})[0], 0, 0);
  EXPECT_NE(c.graph_str(0).find("fused kiln_fused_0"), std::string::npos) << c.graph_str(0);
}

// See Note [Buffer reuse]: a loop whose input dies with it writes its output into that input's
// buffer; an argument's buffer is never taken.
TEST(Compile, AFusedLoopReusesTheBufferOfAnInputThatDiesWithIt) {
  ScopedEnv cache("KILN_CACHE_DIR", fresh_dir("reuse").string());
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor h = mm(in[0], in[1]);  // made by the program, read last by the loop
    return std::vector<Tensor>{relu(h * 2.0 - in[2]) + in[2]};
  };
  Tensor a = random({32, 16}, kFloat32, -1, 1, 4), b = random({16, 8}, kFloat32, -1, 1, 5),
         c = random({32, 8}, kFloat32, -1, 1, 6);
  Tensor c_before = c.clone();
  auto f = compile(fn);
  for (int i = 0; i < 3; ++i) expect_close(f({a, b, c})[0], fn({a, b, c})[0], 1e-6, 1e-6);
  expect_close(c, c_before, 0, 0);
  const std::string g = f.graph_str(0);
  EXPECT_NE(g.find(" (in %"), std::string::npos) << g;
  // The output is held by the caller: the next call's loop must not write into it.
  Tensor first = f({a, b, c})[0], kept = first.clone();
  f({a, b, c});
  expect_close(first, kept, 0, 0);
}

TEST(Compile, AWarmCacheLoadsAndACorruptEntryIsRebuilt) {
  const fs::path dir = fresh_dir("cache");
  ScopedEnv cache("KILN_CACHE_DIR", dir.string());
  Tensor x = random({16, 8}, kFloat32, -1, 1, 1);
  std::vector<Tensor> args{x, x, x};
  compile(chain)(args);
  fs::path so;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".so") so = e.path();
  ASSERT_FALSE(so.empty()) << "no shared object in " << dir;
  // Warm: no compiler runs, so a capture takes well under a second.
  auto t0 = std::chrono::steady_clock::now();
  auto warm = compile(chain);
  warm(args);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  EXPECT_EQ(warm.explain()[0].reason.find("rebuilt"), std::string::npos) << history(warm);
  // Truncated: detected by its hash and rebuilt.
  fs::resize_file(so, fs::file_size(so) / 2);
  auto again = compile(chain);
  expect_close(again(args)[0], chain(args)[0], 1e-6, 1e-6);
  EXPECT_NE(again.explain()[0].reason.find("did not match its hash; rebuilt"), std::string::npos)
      << history(again);
  fs::remove_all(dir);
}

TEST(Compile, AnUnwritableCacheFallsBackAndNoCompilerIsAClearError) {
  Tensor x = random({16, 8}, kFloat32, -1, 1, 1);
  std::vector<Tensor> args{x, x, x};
  {
    ScopedEnv cache("KILN_CACHE_DIR", "/proc/kiln-cannot-write-here");
    auto f = compile(chain);
    expect_close(f(args)[0], chain(args)[0], 1e-6, 1e-6);
    EXPECT_EQ(f.num_programs(), 1);
  }
  {
    ScopedEnv cache("KILN_CACHE_DIR", fresh_dir("nocxx").string());
    ScopedEnv cxx("CXX", "/nonexistent/c++");
    ScopedEnv path("PATH", "/nonexistent");
    try {
      compile(chain);  // raised before any call runs the function
      ADD_FAILURE() << "no error without a compiler";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no C++ compiler found"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("apt-get install g++"), std::string::npos) << e.what();
    }
    ScopedEnv unfused("KILN_COMPILE_FUSE", "0");
    auto plain = compile(chain);
    expect_close(plain(args)[0], chain(args)[0], 0, 0);
    EXPECT_EQ(plain.num_programs(), 1);
  }
}

// Note [CUDA fusion]'s kernels are generated and compiled by NVRTC; no GPU is needed for that
// (launching them is not wired yet).
TEST(Compile, FusedLoopsCompileForCudaWithNvrtc) {
  ir::Graph g;
  auto x = g.add_input(meta::contiguous_spec({64, 33}, kFloat32, kCPU));
  auto w = g.add_input(meta::contiguous_spec({64, 33}, kFloat32, kCPU));
  auto c = g.add_input(meta::contiguous_spec({}, kFloat32, kCPU));
  auto h = g.add_node("gelu", {g.add_node("mul", {x, w})[0], std::string("tanh")})[0];
  auto r = g.add_node("relu", {g.add_node("sub", {h, c, Scalar(1)})[0]})[0];
  auto e = g.add_node("gelu_backward", {r, h, std::string("none")})[0];
  g.set_outputs({e, h});
  const std::string src = compiler::CompiledGraph::cuda_source(g);
  ASSERT_NE(src.find("__global__ void kiln_fused_0"), std::string::npos) << src;
  std::string ptx;
  const std::string err = compiler::CompiledGraph::compile_cuda(src, "compute_80", &ptx);
  if (err.find("NVRTC not found") != std::string::npos) GTEST_SKIP() << err;
  ASSERT_EQ(err, "") << src;
  EXPECT_NE(ptx.find(".entry kiln_fused_0"), std::string::npos) << ptx.substr(0, 2000);
  std::string bad_ptx;
  EXPECT_NE(compiler::CompiledGraph::compile_cuda("this is not CUDA", "compute_80", &bad_ptx)
                .find("NVRTC could not compile"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
