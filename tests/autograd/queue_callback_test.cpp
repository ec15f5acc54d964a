// autograd::queue_callback: callbacks queued from hooks run once, after the last node, in order.
#include <gtest/gtest.h>

#include <string>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/node.h"
#include "kiln/kiln.h"

using namespace kiln;

TEST(AutogradQueueCallback, RunsAfterTheLastNodeInOrder) {
  Tensor a = ones({2}).requires_grad_();
  Tensor b = ones({2}).requires_grad_();
  std::string log;
  auto queue = [&](const Tensor&) {
    log += "h";
    autograd::queue_callback([&] {
      log += "1";
      autograd::queue_callback([&] { log += "3"; });  // queued by a callback: runs last
    });
    autograd::queue_callback([&] { log += "2"; });
  };
  autograd::register_post_accumulate_grad_hook(a, queue);
  autograd::register_post_accumulate_grad_hook(b, [&](const Tensor&) { log += "h"; });
  (a * 2 + b).sum().backward();
  EXPECT_EQ(log, "hh123");  // both leaves done before any callback
  log.clear();
  (a * 3).sum().backward();  // the queue was emptied: one hook, its callbacks only
  EXPECT_EQ(log, "h123");
}

TEST(AutogradQueueCallback, OutsideBackwardRaises) {
  try {
    autograd::queue_callback([] {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no backward pass is running"), std::string::npos) << e.what();
  }
}

TEST(AutogradQueueCallback, GradRunsCallbacksToo) {
  Tensor x = ones({3}).requires_grad_();
  int calls = 0;
  Tensor y = (x * x).sum();
  y.grad_fn()->register_prehook([&](const autograd::variable_list&) {
    autograd::queue_callback([&] { ++calls; });
    return autograd::variable_list{};
  });
  autograd::grad({y}, {x});
  EXPECT_EQ(calls, 1);
}
