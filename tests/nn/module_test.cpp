// kiln::nn::Module: registration, listings, state dicts, modes, moves, repr; the containers.
#include <gtest/gtest.h>

#include <sstream>

#include "kiln/autograd/grad_mode.h"
#include "kiln/nn/nn.h"
#include "test_util.h"

namespace kiln::nn {
namespace {

using testing::expect_close;
using testing::expect_error;

// Two Linears and a BatchNorm1d, with a non-persistent buffer: the PyTorch module
//   class Net(nn.Module): fc1 = Linear(3, 4); bn = BatchNorm1d(4); fc2 = Linear(4, 2, bias=False)
struct Net : Module {
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<Linear>(3, 4));
    bn = register_module("bn", std::make_shared<BatchNorm1d>(4));
    fc2 = register_module("fc2", std::make_shared<Linear>(4, 2, false));
    register_buffer("scratch", kiln::zeros({2}), &scratch, /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override {
    return fc2->forward(kiln::relu(bn->forward(fc1->forward(x))));
  }
  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<BatchNorm1d> bn;
  Tensor scratch;
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (auto& p : v) out.push_back(p.first);
  return out;
}

TEST(NnModule, ListingsUsePyTorchNamesAndOrder) {
  Net net;
  EXPECT_EQ(names_of(net.named_parameters()),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                      "fc2.weight"}));
  EXPECT_EQ(names_of(net.named_buffers()),
            (std::vector<std::string>{"scratch", "bn.running_mean", "bn.running_var",
                                      "bn.num_batches_tracked"}));
  EXPECT_EQ(net.state_dict().keys(),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                      "bn.running_mean", "bn.running_var",
                                      "bn.num_batches_tracked", "fc2.weight"}));
  std::vector<std::string> mods;
  for (auto& [n, m] : net.named_modules()) mods.push_back(n + ":" + m->type_name());
  EXPECT_EQ(mods, (std::vector<std::string>{":Net", "fc1:Linear", "bn:BatchNorm1d",
                                            "fc2:Linear"}));
  EXPECT_EQ(net.parameters(false).size(), 0u);
  EXPECT_EQ(net.children().size(), 3u);
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(net.bn->num_batches_tracked.requires_grad());
}

TEST(NnModule, SharedModulesAndParametersListOnce) {
  auto lin = std::make_shared<Linear>(2, 2);
  Sequential seq({lin, lin});
  EXPECT_EQ(seq.parameters().size(), 2u);
  EXPECT_EQ(seq.named_modules().size(), 2u);  // the Sequential and the Linear
  EXPECT_EQ(seq.state_dict().size(), 4u);     // state_dict keeps both paths, like PyTorch
}

TEST(NnModule, RegistrationErrors) {
  Module m("M");
  m.register_parameter("w", kiln::zeros({2}));
  expect_error(ErrorKind::Value, "already registered",
               [&] { m.register_buffer("w", kiln::zeros({2})); });
  expect_error(ErrorKind::Value, "contain no '.'",
               [&] { m.register_parameter("a.b", kiln::zeros({2})); });
  expect_error(ErrorKind::Type, "floating point",
               [&] { m.register_parameter("i", kiln::zeros({2}, kInt64)); });
  expect_error(ErrorKind::Index, "no parameter \"nope\"", [&] { m.param("nope"); });
  expect_error(ErrorKind::NotImplemented, "M has no single-input forward",
               [&] { m.forward(kiln::zeros({1})); });
  EXPECT_TRUE(m.param("w").requires_grad());
}

TEST(NnModule, StateDictRoundTrip) {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  Tensor x = testing::random({5, 3});
  a.eval();
  b.eval();
  { autograd::NoGradGuard g; a.bn->running_mean.copy_(testing::random({4}, kFloat32, 0, 1, 7)); }
  EXPECT_GT((a.forward(x) - b.forward(x)).abs().max().item<float>(), 1e-3);
  LoadResult r = b.load_state_dict(a.state_dict());
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  expect_close(b.forward(x), a.forward(x), 0, 0);
  // load copies values: the parameters stay the same leaf tensors
  EXPECT_TRUE(b.fc1->weight.is_leaf() && b.fc1->weight.requires_grad());
  EXPECT_TRUE(b.named_parameters()[0].second.is_same(b.fc1->weight));
  // state_dict tensors share storage but do not require grad
  StateDict sd = a.state_dict();
  EXPECT_FALSE(sd.at("fc1.weight").requires_grad());
  EXPECT_TRUE(sd.at("fc1.weight").is_alias_of(a.fc1->weight));
}

TEST(NnModule, LoadStateDictStrictReportsKeys) {
  Net net;
  StateDict sd;
  for (const auto& [k, v] : net.state_dict())
    if (k != "fc1.bias") sd.insert(k, v.clone());
  sd.insert("extra.weight", kiln::zeros({1}));
  Tensor before = net.fc1->weight.clone();
  sd.insert("fc1.weight", kiln::ones({4, 3}));
  expect_error(ErrorKind::Runtime,
               "Missing key(s) in state_dict: \"fc1.bias\". Unexpected key(s) in state_dict: "
               "\"extra.weight\".",
               [&] { net.load_state_dict(sd); });
  expect_close(net.fc1->weight, before, 0, 0);  // a failed strict load copies nothing
  LoadResult r = net.load_state_dict(sd, /*strict=*/false);
  EXPECT_EQ(r.missing_keys, std::vector<std::string>{"fc1.bias"});
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"extra.weight"});
  expect_close(net.fc1->weight, kiln::ones({4, 3}), 0, 0);
  sd.insert("fc2.weight", kiln::zeros({3, 4}));
  expect_error(ErrorKind::Runtime, "size mismatch for fc2.weight: copying a param with shape [3, 4]",
               [&] { net.load_state_dict(sd, false); });
}

TEST(NnModule, TrainEvalApplyZeroGrad) {
  Net net;
  EXPECT_TRUE(net.bn->is_training());
  net.eval();
  EXPECT_FALSE(net.is_training() || net.bn->is_training() || net.fc1->is_training());
  net.train();
  EXPECT_TRUE(net.fc2->is_training());
  std::vector<std::string> order;
  net.apply([&](Module& m) { order.push_back(m.type_name()); });
  EXPECT_EQ(order, (std::vector<std::string>{"Linear", "BatchNorm1d", "Linear", "Net"}));

  net.forward(testing::random({4, 3})).sum().backward();
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.grad().defined());
  net.zero_grad(/*set_to_none=*/false);
  for (const Tensor& p : net.parameters()) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.f);
  net.zero_grad();
  for (const Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(net.bn->num_batches_tracked.item<int64_t>(), 1);
}

TEST(NnModule, ToDtypeConvertsFloatingTensorsOnly) {
  Net net;
  net.forward(testing::random({4, 3})).sum().backward();
  Tensor w32 = net.fc1->weight.detach().clone();
  net.to(kFloat64);
  for (const auto& [k, p] : net.named_parameters()) {
    EXPECT_EQ(p.dtype(), kFloat64) << k;
    EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << k;
    EXPECT_EQ(p.grad().dtype(), kFloat64) << k;
  }
  EXPECT_EQ(net.bn->running_var.dtype(), kFloat64);
  EXPECT_EQ(net.bn->num_batches_tracked.dtype(), kInt64);
  EXPECT_EQ(net.scratch.dtype(), kFloat64);
  expect_close(net.fc1->weight.to(kFloat32), w32, 0, 0);
  // the module's own tables see the replaced members
  EXPECT_TRUE(net.parameters()[0].is_same(net.fc1->weight));
  Tensor y = net.forward(testing::random({4, 3}, kFloat64));
  EXPECT_EQ(y.dtype(), kFloat64);
  net.to(Device(kCPU));  // same device: nothing changes
  EXPECT_EQ(net.fc2->weight.dtype(), kFloat64);
}

TEST(NnModule, ReprLikePyTorch) {
  Net net;
  EXPECT_EQ(net.repr(),
            "Net(\n"
            "  (fc1): Linear(in_features=3, out_features=4, bias=True)\n"
            "  (bn): BatchNorm1d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)\n"
            "  (fc2): Linear(in_features=4, out_features=2, bias=False)\n"
            ")");
  Sequential outer({std::make_shared<Sequential>(std::vector<ModulePtr>{
                        std::make_shared<Conv2d>(1, 8, std::vector<int64_t>{3},
                                                 ConvArgs{.padding = {1}, .bias = false}),
                        std::make_shared<ReLU>()}),
                    std::make_shared<Dropout>(0.25), std::make_shared<Flatten>()});
  std::ostringstream os;
  os << outer;
  EXPECT_EQ(os.str(),
            "Sequential(\n"
            "  (0): Sequential(\n"
            "    (0): Conv2d(1, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=False)\n"
            "    (1): ReLU()\n"
            "  )\n"
            "  (1): Dropout(p=0.25, inplace=False)\n"
            "  (2): Flatten(start_dim=1, end_dim=-1)\n"
            ")");
}

TEST(NnContainers, SequentialModuleListModuleDict) {
  auto l1 = std::make_shared<Linear>(3, 5);
  auto l2 = std::make_shared<Linear>(5, 2);
  Sequential seq({l1, std::make_shared<Tanh>(), l2});
  Tensor x = testing::random({4, 3});
  expect_close(seq.forward(x), l2->forward(kiln::tanh(l1->forward(x))), 0, 0);
  EXPECT_TRUE(seq[-1] == l2);
  expect_error(ErrorKind::Index, "index 3 is out of range for 3 modules", [&] { seq[3]; });

  ModuleList list({l1});
  list.push_back(l2);
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.state_dict().keys(),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
  int n = 0;
  for (const ModulePtr& m : list) n += m->type_name() == "Linear";
  EXPECT_EQ(n, 2);
  expect_error(ErrorKind::NotImplemented, "ModuleList has no single-input forward",
               [&] { list.forward(x); });

  ModuleDict dict({{"enc", l1}, {"act", std::make_shared<ReLU>()}});
  dict.insert("act", std::make_shared<GELU>());
  EXPECT_EQ(dict.keys(), (std::vector<std::string>{"enc", "act"}));
  EXPECT_EQ(dict["act"]->type_name(), "GELU");
  EXPECT_TRUE(dict.contains("enc") && !dict.contains("dec"));
  EXPECT_EQ(dict.state_dict().keys(), (std::vector<std::string>{"enc.weight", "enc.bias"}));
}

}  // namespace
}  // namespace kiln::nn
