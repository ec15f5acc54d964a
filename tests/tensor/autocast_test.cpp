// Autocast (kiln/autocast.h): the guard's state, each policy's output dtype, results equal to
// doing the casts by hand, integer and in-place arguments untouched, one cast per tensor per
// op, gradients reaching float32 leaves as float32, and an MLP that trains under autocast.
#include "kiln/autocast.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "kiln/autograd/functional.h"
#include "kiln/autograd/node.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

constexpr DeviceType kCPUType = DeviceType::CPU;

// Same dtype, shape and values, bit for bit.
void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.sizes().vec(), want.sizes().vec());
  EXPECT_EQ(to_doubles(got), to_doubles(want));
}

TEST(Autocast, GuardStateNestsAndRestores) {
  EXPECT_FALSE(is_autocast_enabled(kCPUType));
  {
    AutocastGuard outer(kCPUType, kBFloat16);
    EXPECT_TRUE(is_autocast_enabled());
    EXPECT_EQ(get_autocast_dtype(), kBFloat16);
    EXPECT_TRUE(tls_local_dispatch_key_set().included.has(DispatchKey::Autocast));
    {
      AutocastGuard off(kCPUType, kBFloat16, /*enabled=*/false);
      EXPECT_FALSE(is_autocast_enabled());
      EXPECT_FALSE(tls_local_dispatch_key_set().included.has(DispatchKey::Autocast));
      EXPECT_EQ(mm(random({2, 3}), random({3, 2})).dtype(), kFloat32);
      {
        AutocastGuard half(kCPUType, kFloat16);
        EXPECT_EQ(get_autocast_dtype(), kFloat16);
      }
      EXPECT_FALSE(is_autocast_enabled());
    }
    EXPECT_TRUE(is_autocast_enabled());
    EXPECT_EQ(get_autocast_dtype(), kBFloat16);
    EXPECT_EQ(mm(random({2, 3}), random({3, 2})).dtype(), kBFloat16);
  }
  EXPECT_FALSE(is_autocast_enabled());
  EXPECT_FALSE(tls_local_dispatch_key_set().included.has(DispatchKey::Autocast));
  EXPECT_EQ(mm(random({2, 3}), random({3, 2})).dtype(), kFloat32);
}

TEST(Autocast, StateIsPerThread) {
  AutocastGuard amp(kCPUType);
  bool other_enabled = true;
  ScalarType other_dtype = kBFloat16;
  std::thread t([&] {
    other_enabled = is_autocast_enabled();
    other_dtype = mm(random({2, 2}), random({2, 2})).dtype();
  });
  t.join();
  EXPECT_FALSE(other_enabled);
  EXPECT_EQ(other_dtype, kFloat32);
}

TEST(Autocast, RejectsNonReducedDtypes) {
  expect_error(ErrorKind::Value, "AutocastGuard: dtype must be bfloat16 or float16, got float32",
               [] { AutocastGuard g(kCPUType, kFloat32); });
  EXPECT_FALSE(is_autocast_enabled());
}

TEST(Autocast, LowerPrecisionOpsRunInBFloat16) {
  Tensor x = random({4, 6}, kFloat32, -1, 1, 1), w = random({5, 6}, kFloat32, -1, 1, 2);
  Tensor b = random({5}, kFloat32, -1, 1, 3);
  Tensor img = random({2, 3, 6, 6}, kFloat32, -1, 1, 4),
         k = random({4, 3, 3, 3}, kFloat32, -1, 1, 5);
  Tensor q = random({2, 2, 5, 4}, kFloat32, -1, 1, 6);
  AutocastGuard amp(kCPUType, kBFloat16);
  EXPECT_EQ(linear(x, w, b).dtype(), kBFloat16);
  EXPECT_EQ(matmul(x, w.t()).dtype(), kBFloat16);
  EXPECT_EQ(mm(x, w.t()).dtype(), kBFloat16);
  EXPECT_EQ(addmm(b, x, w.t()).dtype(), kBFloat16);
  EXPECT_EQ(bmm(q.flatten(0, 1), q.flatten(0, 1).transpose(1, 2)).dtype(), kBFloat16);
  EXPECT_EQ(conv2d(img, k).dtype(), kBFloat16);
  EXPECT_EQ(scaled_dot_product_attention(q, q, q).dtype(), kBFloat16);
  // float64 arguments are left alone.
  EXPECT_EQ(mm(x.to(kFloat64), w.t().to(kFloat64)).dtype(), kFloat64);
}

TEST(Autocast, Fp32OpsRunInFloat32) {
  Tensor logits = random({4, 5}, kBFloat16, -2, 2, 7);
  Tensor target = from_vector<int64_t>({0, 3, 1, 4}, {4});
  AutocastGuard amp(kCPUType);
  EXPECT_EQ(softmax(logits, 1).dtype(), kFloat32);
  EXPECT_EQ(log_softmax(logits, 1).dtype(), kFloat32);
  EXPECT_EQ(cross_entropy(logits, target).dtype(), kFloat32);
  EXPECT_EQ(mse_loss(logits, random({4, 5}, kBFloat16)).dtype(), kFloat32);
  EXPECT_EQ(layer_norm(logits, {5}).dtype(), kFloat32);
  EXPECT_EQ(exp(logits).dtype(), kFloat32);
  EXPECT_EQ(log(logits.abs()).dtype(), kFloat32);
  EXPECT_EQ(sum(logits).dtype(), kFloat32);
  // An explicit output dtype wins over the policy (PyTorch's fp32_set_opt_dtype).
  EXPECT_EQ(sum(logits, std::nullopt, false, kBFloat16).dtype(), kBFloat16);
  // The cross-entropy of a linear layer's bfloat16 output: float32, as in PyTorch.
  Tensor x = random({4, 6}), w = random({5, 6});
  EXPECT_EQ(cross_entropy(linear(x, w), target).dtype(), kFloat32);
}

TEST(Autocast, PromoteWidensMixedArguments) {
  Tensor h = random({3, 4}, kBFloat16, -1, 1, 8), f = random({3, 4}, kFloat32, -1, 1, 9);
  AutocastGuard amp(kCPUType);
  EXPECT_EQ(cat({h, f}).dtype(), kFloat32);
  EXPECT_EQ(stack({h, f}).dtype(), kFloat32);
  EXPECT_EQ(add(h, f).dtype(), kFloat32);
  EXPECT_EQ(add(h, h).dtype(), kBFloat16);
  EXPECT_EQ((h * 2.0).dtype(), kBFloat16);  // a wrapped number does not widen
  expect_same(cat({h, f}), cat({h.to(kFloat32), f}));
  // Integer tensors neither widen nor get cast.
  Tensor i = ones({3, 4}, kInt64);
  EXPECT_EQ(cat({i, i}).dtype(), kInt64);
  EXPECT_EQ(add(h, i).dtype(), kBFloat16);
  // where's bool condition stays bool; the branches promote.
  EXPECT_EQ(where(gt(f, zeros_like(f)), h, f).dtype(), kFloat32);
}

TEST(Autocast, PolicyNoneAndInPlacePassThrough) {
  Tensor h = random({3, 4}, kBFloat16), f = random({3, 4});
  Tensor table = random({10, 4}), idx = from_vector<int64_t>({1, 7, 2}, {3});
  AutocastGuard amp(kCPUType);
  EXPECT_EQ(relu(h).dtype(), kBFloat16);
  EXPECT_EQ(relu(f).dtype(), kFloat32);
  EXPECT_EQ(embedding(table, idx).dtype(), kFloat32);
  EXPECT_EQ(f.reshape({12}).dtype(), kFloat32);
  // In-place and out= variants keep the dtype of the tensor they write.
  Tensor acc = zeros({3, 4});
  acc.add_(h);
  EXPECT_EQ(acc.dtype(), kFloat32);
  Tensor out = zeros({3, 4});
  add_out(out, h, h);
  EXPECT_EQ(out.dtype(), kFloat32);
  expect_same(out, add(h, h).to(kFloat32));
}

TEST(Autocast, NoEffectOutsideTheGuard) {
  Tensor x = random({4, 6}), w = random({5, 6}), h = random({4, 5}, kBFloat16);
  { AutocastGuard amp(kCPUType); }
  EXPECT_EQ(linear(x, w).dtype(), kFloat32);
  EXPECT_EQ(softmax(h, 1).dtype(), kBFloat16);
  EXPECT_EQ(cat({h, h}).dtype(), kBFloat16);
}

TEST(Autocast, MatchesCastingByHand) {
  Tensor x = random({7, 6}, kFloat32, -1, 1, 10), w = random({5, 6}, kFloat32, -1, 1, 11);
  Tensor b = random({5}, kFloat32, -1, 1, 12);
  Tensor target = from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1}, {7});
  Tensor by_hand_y = linear(x.to(kBFloat16), w.to(kBFloat16), b.to(kBFloat16));
  Tensor by_hand_loss = cross_entropy(by_hand_y.to(kFloat32), target);
  Tensor y, loss;
  {
    AutocastGuard amp(kCPUType);
    y = linear(x, w, b);
    loss = cross_entropy(y, target);
  }
  expect_same(y, by_hand_y);
  expect_same(loss, by_hand_loss);
}

TEST(Autocast, GradientsReachFloat32LeavesAsFloat32) {
  Tensor x = random({7, 6}, kFloat32, -1, 1, 13);
  Tensor target = from_vector<int64_t>({0, 1, 2, 3, 4, 0, 1}, {7});
  auto make = [] {
    Tensor w = random({5, 6}, kFloat32, -1, 1, 14), b = random({5}, kFloat32, -1, 1, 15);
    w.requires_grad_(true);
    b.requires_grad_(true);
    return std::pair{w, b};
  };
  // Reference: the casts written out, backward outside any guard.
  auto [w_ref, b_ref] = make();
  cross_entropy(linear(x.to(kBFloat16), w_ref.to(kBFloat16), b_ref.to(kBFloat16)).to(kFloat32),
                target)
      .backward();
  for (bool backward_inside : {false, true}) {
    SCOPED_TRACE(backward_inside ? "backward inside the guard" : "backward after the guard");
    auto [w, b] = make();
    Tensor loss;
    {
      AutocastGuard amp(kCPUType);
      loss = cross_entropy(linear(x, w, b), target);
      if (backward_inside) loss.backward();
    }
    if (!backward_inside) loss.backward();
    ASSERT_TRUE(w.grad().defined());
    expect_same(w.grad(), w_ref.grad());
    expect_same(b.grad(), b_ref.grad());
  }
}

TEST(Autocast, ATensorPassedTwiceIsCastOnce) {
  Tensor x = random({4, 4});
  x.requires_grad_(true);
  Tensor y;
  {
    AutocastGuard amp(kCPUType);
    y = mm(x, x);
  }
  EXPECT_EQ(y.dtype(), kBFloat16);
  const auto& edges = y.grad_fn()->next_edges();
  ASSERT_EQ(edges.size(), 2u);
  EXPECT_EQ(edges[0].fn, edges[1].fn);  // one cast node feeds both inputs
  y.sum().backward();
  Tensor x_ref = x.detach();
  x_ref.requires_grad_(true);
  Tensor xb = x_ref.to(kBFloat16);
  mm(xb, xb).sum().backward();
  expect_same(x.grad(), x_ref.grad());
}

// Batched sits above Autocast: the batching rules run first, and each physical op is autocast.
TEST(Autocast, ComposesWithVmap) {
  Tensor xs = random({3, 4, 6}, kFloat32, -1, 1, 18), w = random({5, 6}, kFloat32, -1, 1, 19);
  func::Fn f = [&](const std::vector<Tensor>& v) { return softmax(linear(v[0], w), 1); };
  Tensor got;
  {
    AutocastGuard amp(kCPUType);
    got = func::vmap(f)({xs});
  }
  EXPECT_EQ(got.dtype(), kFloat32);
  expect_same(got, softmax(linear(xs.to(kBFloat16), w.to(kBFloat16)).to(kFloat32), 2));
}

TEST(Autocast, MlpTrainingStepLowersTheLoss) {
  Tensor x = random({64, 8}, kFloat32, -1, 1, 16);
  Tensor target = argmax(mm(x, random({8, 3}, kFloat32, -1, 1, 17)), 1);
  auto model = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(8, 32), std::make_shared<nn::ReLU>(),
                                 std::make_shared<nn::Linear>(32, 3)});
  optim::SGD opt(model->parameters(), {.lr = 0.5});
  std::vector<float> losses;
  for (int step = 0; step < 30; ++step) {
    Tensor loss;
    {
      AutocastGuard amp(kCPUType);
      loss = cross_entropy(model->forward(x), target);
    }
    EXPECT_EQ(loss.dtype(), kFloat32);
    loss.backward();
    for (const Tensor& p : model->parameters()) ASSERT_EQ(p.grad().dtype(), kFloat32);
    opt.step();
    opt.zero_grad();
    losses.push_back(loss.item<float>());
  }
  for (const Tensor& p : model->parameters()) EXPECT_EQ(p.dtype(), kFloat32);
  EXPECT_LT(losses.back(), 0.6f * losses.front());
}

}  // namespace
}  // namespace kiln::testing
