// The autograd graph is freed after backward: 1,000 MLP forward+backward iterations leave the CPU
// allocator's in-use bytes, the heap's in-use bytes (TensorImpls, Nodes, saved variables: a
// stand-in for a live-object counter, which tensor/ does not have) and the parameters'
// reference counts where they were after a few warm-up iterations, and every iteration's graph
// root is destroyed once its loss is dropped.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <memory>

#include "kiln/autograd/autograd.h"
#include "test_util.h"

namespace kiln {
namespace {

enum class Mode { Default, NoRetain, Retain, DoubleBackward };

struct SmallMlp {
  Tensor x, w1, b1, w2, b2, target;
  SmallMlp() {
    x = testing::random({4, 32}, kFloat64, -1, 1, 51);
    w1 = testing::random({16, 32}, kFloat64, -0.3, 0.3, 52).requires_grad_();
    b1 = testing::random({16}, kFloat64, -0.1, 0.1, 53).requires_grad_();
    w2 = testing::random({10, 16}, kFloat64, -0.3, 0.3, 54).requires_grad_();
    b2 = testing::random({10}, kFloat64, -0.1, 0.1, 55).requires_grad_();
    target = testing::from_vector<int64_t>({1, 4, 7, 0}, {4});
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  // x: (4, 32) -> (4, 16) -> (4, 10) -> loss ()
  Tensor loss() const {
    Tensor h = relu(add(mm(x, w1.t()), b1));
    Tensor logits = add(mm(h, w2.t()), b2);
    return neg(log_softmax(logits, 1).gather(1, target.unsqueeze(1)).mean());
  }
};

// One iteration; returns a weak reference to the graph root (expired once the graph is freed).
std::weak_ptr<autograd::Node> step(const SmallMlp& m, Mode mode) {
  Tensor loss = m.loss();
  std::weak_ptr<autograd::Node> root = loss.grad_fn();
  switch (mode) {
    case Mode::Default: loss.backward(); break;
    case Mode::NoRetain: autograd::backward({loss}, {}, /*retain_graph=*/false); break;
    case Mode::Retain: autograd::backward({loss}, {}, /*retain_graph=*/true); break;
    case Mode::DoubleBackward: {
      auto gs = autograd::grad({loss}, m.params(), {}, std::nullopt, /*create_graph=*/true);
      Tensor penalty = (gs[0] * gs[0]).sum() + (gs[2] * gs[2]).sum();
      penalty.backward();
      break;
    }
  }
  for (const Tensor& p : m.params()) p.set_grad(Tensor());  // zero_grad(set_to_none=True)
  return root;
}

struct Snapshot {
  size_t allocator_bytes, heap_bytes;
  std::vector<int> param_refs;
};

Snapshot snapshot(const SmallMlp& m) {
  Snapshot s{cpu_allocator()->stats().in_use_bytes, mallinfo2().uordblks, {}};
  for (const Tensor& p : m.params()) s.param_refs.push_back(p.impl()->use_count());
  return s;
}

void run(Mode mode) {
  SmallMlp m;
  for (int i = 0; i < 5; ++i) step(m, mode);  // warm-up: allocator caches, thread-locals
  Snapshot before = snapshot(m);
  int alive_roots = 0;
  for (int i = 0; i < 1000; ++i) alive_roots += !step(m, mode).expired();
  Snapshot after = snapshot(m);
  EXPECT_EQ(alive_roots, 0) << "graphs outlived their loss";
  EXPECT_EQ(after.allocator_bytes, before.allocator_bytes) << "CPU allocator in-use bytes grew";
  EXPECT_EQ(after.param_refs, before.param_refs) << "something still holds the parameters";
  // A leak of one small object (a TensorImpl, a Node) per iteration would grow the heap by
  // ~100 KB over 1,000 iterations; allow a little malloc bookkeeping noise.
  const long growth = static_cast<long>(after.heap_bytes) - static_cast<long>(before.heap_bytes);
  EXPECT_LT(growth, 8 * 1024) << "heap in-use bytes grew by " << growth;
  // Backward ran and produced finite gradients (the loop did something).
  Tensor loss = m.loss();
  loss.backward();
  for (const Tensor& p : m.params()) {
    ASSERT_TRUE(p.grad().defined());
    for (double v : testing::to_doubles(p.grad())) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(AutogradMemory, BackwardFreesTheGraph) { run(Mode::Default); }
TEST(AutogradMemory, BackwardWithoutRetainGraphFreesTheGraph) { run(Mode::NoRetain); }
TEST(AutogradMemory, RetainedGraphIsFreedWithItsLoss) { run(Mode::Retain); }
TEST(AutogradMemory, DoubleBackwardGraphIsFreed) { run(Mode::DoubleBackward); }

// With retain_graph=false the saved tensors are released by backward itself, before the loss
// is dropped: the allocator holds no more than with the graph never built.
TEST(AutogradMemory, BackwardReleasesSavedTensorsBeforeTheLossDies) {
  SmallMlp m;
  for (int i = 0; i < 3; ++i) step(m, Mode::Default);
  size_t base = cpu_allocator()->stats().in_use_bytes;
  Tensor loss = m.loss();
  size_t with_graph = cpu_allocator()->stats().in_use_bytes;
  EXPECT_GT(with_graph, base) << "the graph saves activations";
  loss.backward();
  for (const Tensor& p : m.params()) p.set_grad(Tensor());
  size_t after = cpu_allocator()->stats().in_use_bytes;
  // Left: the loss value itself (one block).
  EXPECT_LE(after, base + 64) << "saved tensors outlived backward";
  std::weak_ptr<autograd::Node> root = loss.grad_fn();
  loss = Tensor();
  EXPECT_TRUE(root.expired());
}

}  // namespace
}  // namespace kiln
