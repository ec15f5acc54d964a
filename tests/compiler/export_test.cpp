// kiln::compiler::export_step (kiln/compiler/export.h): an MLP training step with SGD and AdamW,
// exported once and replayed with CompiledGraph on copies of the state, against eager steps; and
// every step a replay could not reproduce, refused with what to change.
#include "kiln/compiler/export.h"

#include <gtest/gtest.h>

#include <unordered_map>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compiler/graph.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "kiln/tensor_impl.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using compiler::export_step;
using compiler::ExportedStep;

std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(6, 32), std::make_shared<nn::GELU>(),
                                 std::make_shared<nn::Linear>(32, 32), std::make_shared<nn::Tanh>(),
                                 std::make_shared<nn::Linear>(32, 4)});
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// A PyTorch-style step: zero_grad(set_to_none) first, the loss returned as it is (it needs
// autograd; the export keeps it as a plain value).
compiler::Fn step_of(nn::Sequential& m, optim::Optimizer& opt) {
  return [&m, &opt](const std::vector<Tensor>& in) {
    opt.zero_grad();
    Tensor loss = nn::CrossEntropyLoss()(m.forward(in[0]), in[1]);
    loss.backward();
    opt.step();
    return std::vector<Tensor>{loss};
  };
}

Tensor batch_x(int k) { return random({16, 6}, kFloat32, -1, 1, 100 + k); }
Tensor batch_y(int k) { return random({16}, kInt64, 0, 4, 200 + k); }

// Copies of a model's parameters and its optimizer's state, by the identity of the originals.
std::unordered_map<const TensorImpl*, Tensor> snapshot(nn::Sequential& m,
                                                       const optim::Optimizer& opt) {
  std::unordered_map<const TensorImpl*, Tensor> copies;
  for (const Tensor& p : m.parameters()) {
    copies.emplace(p.impl(), p.detach().clone());
    for (const auto& [name, s] : opt.state_of(p)) copies.emplace(s.impl(), s.clone());
  }
  return copies;
}

// Trains one model eagerly and replays the step exported from its twin on copies of the twin's
// state: the same losses and parameters, step by step.
void check_replay(const MakeOpt& make_opt, int steps) {
  auto eager = make_mlp(), twin = make_mlp();
  twin->load_state_dict(eager->state_dict());
  auto opt_e = make_opt(eager->parameters()), opt_t = make_opt(twin->parameters());
  auto eager_step = step_of(*eager, *opt_e), twin_step = step_of(*twin, *opt_t);
  eager_step({batch_x(-1), batch_y(-1)});  // the optimizer state exists from here on
  twin_step({batch_x(-1), batch_y(-1)});
  auto state = snapshot(*twin, *opt_t);

  ExportedStep s = export_step(twin_step, {batch_x(-2), batch_y(-2)});
  ASSERT_EQ(s.arg_of_input.size(), s.graph.inputs().size());
  ASSERT_EQ(s.captured.size(), s.graph.inputs().size());
  ASSERT_EQ(s.outputs.size(), 1u);
  ASSERT_EQ(s.outputs[0], 0);
  EXPECT_EQ(s.arg_of_input[0], 0);
  EXPECT_EQ(s.arg_of_input[1], 1);
  std::vector<Tensor> inputs(s.captured.size());
  for (size_t i = 2; i < inputs.size(); ++i) {
    ASSERT_EQ(s.arg_of_input[i], -1);
    if (Tensor c = compiler::constant_input(s.graph, i); c.defined()) {
      EXPECT_TRUE(c.impl()->is_wrapped_number());
      expect_close(c, s.captured[i], 0, 0);
      inputs[i] = c;
      continue;
    }
    auto it = state.find(s.captured[i].impl());
    ASSERT_NE(it, state.end()) << "input " << i << " is not a parameter or optimizer state\n"
                               << s.graph.str();
    inputs[i] = it->second;
  }
  // No .grad assignment and nothing left over from the export's own call.
  EXPECT_EQ(s.graph.str().find("set_grad"), std::string::npos);

  compiler::CompiledGraph cg(s.graph);
  const std::vector<GeneratorState> rng(s.graph.nodes().size());
  for (int k = 0; k < steps; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    inputs[0] = batch_x(k);
    inputs[1] = batch_y(k);
    Tensor want = eager_step({batch_x(k), batch_y(k)})[0];
    std::vector<Tensor> got = cg.run(inputs, rng);
    expect_close(got[s.outputs[0]], want.detach(), 0, 0);
  }
  auto params = eager->parameters();
  auto twin_params = twin->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    expect_close(state.at(twin_params[i].impl()), params[i].detach(), 0, 0);
  }
}

TEST(ExportStep, SGDWithMomentumReplaysLikeEager) {
  check_replay(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::SGD>(std::move(ps),
                                            optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      },
      5);
}

TEST(ExportStep, AdamWReplaysLikeEager) {
  check_replay(
      [](std::vector<Tensor> ps) {
        return std::make_unique<optim::AdamW>(std::move(ps),
                                              optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
      },
      5);
}

TEST(ExportStep, NewOptimizerStateAsksForAnEagerStepFirst) {
  auto m = make_mlp();
  optim::AdamW opt(m->parameters(), {.lr = 1e-2});
  expect_error(ErrorKind::Value, "run one step eagerly first so the optimizer state exists", [&] {
    export_step(step_of(*m, opt), {batch_x(0), batch_y(0)});
  });
}

TEST(ExportStep, AGraphBreakIsRefused) {
  auto fn = [](const std::vector<Tensor>& in) {
    Tensor s = in[0].sum();
    return std::vector<Tensor>{s.item<double>() > 0 ? in[0] * 2.0 : in[0]};
  };
  expect_error(ErrorKind::Value, "read the data", [&] { export_step(fn, {ones({3})}); });
}

TEST(ExportStep, ReadingAnOldGradIsRefused) {
  auto m = make_mlp();
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  auto fn = [&](const std::vector<Tensor>& in) {
    opt.zero_grad(/*set_to_none=*/false);  // zero-fills the .grad of the last step in place
    Tensor loss = nn::CrossEntropyLoss()(m->forward(in[0]), in[1]);
    loss.backward();
    opt.step();
    return std::vector<Tensor>{loss.detach()};
  };
  fn({batch_x(0), batch_y(0)});
  expect_error(ErrorKind::Value, "zero the gradients with set_to_none at the start of the step",
               [&] {
                 export_step(fn, {batch_x(1), batch_y(1)});
               });
}

TEST(ExportStep, AnOutputThatNeedsABackwardIsRefused) {
  auto m = make_mlp();
  auto fn = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{m->forward(in[0]).sum()};
  };
  expect_error(ErrorKind::NotImplemented, "runs no backward",
               [&] { export_step(fn, {batch_x(0)}); });
}

TEST(ExportStep, RandomOpsKeepTheirBlockAndExplicitGeneratorsAreRefused) {
  auto fn = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{dropout(in[0], 0.5, true) + randn({8})};
  };
  const GeneratorState before = default_generator().get_state();
  ExportedStep s = export_step(fn, {ones({8})});
  const GeneratorState after = default_generator().get_state();
  // The block the step reserved (Note [Random ops in a program]): a replay rebases onto its own.
  EXPECT_EQ(s.rng_seed, before.seed);
  EXPECT_EQ(s.rng_offset, before.offset);
  EXPECT_EQ(s.rng_count, after.offset - before.offset);
  EXPECT_GT(s.rng_count, 0u);
  // Replayed onto another block, the step draws what eager draws from the default generator
  // at that block's start; a block that misses a random node is refused naming it.
  compiler::CompiledGraph cg(s.graph, {s.rng_seed, s.rng_offset, s.rng_count});
  default_generator().set_state({7, 4096});
  Tensor want = fn({ones({8})})[0];
  expect_close(cg.run({ones({8})}, 7, 4096)[0], want, 0, 0);
  EXPECT_GT((cg.run({ones({8})}, 7, 4096 + s.rng_count)[0] - want).abs().max().item<double>(), 0);
  expect_error(ErrorKind::Value, "draws outside the graph's block", [&] {
    compiler::CompiledGraph(s.graph, {s.rng_seed + 1, s.rng_offset, s.rng_count});
  });
  expect_error(ErrorKind::Value, "built without its block",
               [&] { compiler::CompiledGraph(s.graph).run({ones({8})}, 7, 4096); });
  Generator gen(5);
  auto with_gen = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{add(in[0], randn({8}, gen))};
  };
  expect_error(ErrorKind::NotImplemented, "explicit generator",
               [&] { export_step(with_gen, {ones({8})}); });
}

TEST(ExportStep, GradAssignmentsAreLeftOutAndDeadOpsDropped) {
  Tensor w = random({4, 3}, kFloat32, -1, 1, 1);
  w.requires_grad_();
  auto fn = [&](const std::vector<Tensor>& in) {
    w.set_grad(Tensor());
    Tensor unused = exp(in[0]);
    (void)unused;
    Tensor loss = mm(in[0], w).sum();
    loss.backward();
    autograd::NoGradGuard no_grad;
    w.sub_(w.grad() * 0.1);
    return std::vector<Tensor>{loss.detach()};
  };
  Tensor x = random({2, 4}, kFloat32, -1, 1, 2);
  ExportedStep s = export_step(fn, {x});
  EXPECT_EQ(s.graph.str().find("exp("), std::string::npos) << s.graph.str();
  EXPECT_NE(s.graph.str().find("sub_("), std::string::npos) << s.graph.str();
  ASSERT_GE(s.captured.size(), 2u);
  EXPECT_TRUE(s.captured[1].is_same(w));
  EXPECT_FALSE(compiler::constant_input(s.graph, 1).defined());
  for (size_t i = 2; i < s.captured.size(); ++i)  // `* 0.1`
    EXPECT_TRUE(compiler::constant_input(s.graph, i).defined()) << s.graph.str();
}

TEST(ExportStep, BadInputIsAClearError) {
  expect_error(ErrorKind::Value, "the function is empty", [] { export_step(nullptr, {}); });
  expect_error(ErrorKind::Value, "undefined tensor",
               [] { export_step([](const std::vector<Tensor>& in) { return in; }, {Tensor()}); });
}

}  // namespace
}  // namespace kiln::testing
