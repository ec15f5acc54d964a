// tests/golden/optim_golden_gen.cpp: PyTorch's (libtorch C++ API) optimizer updates, 5 steps
// each on fixed float32 parameters and gradients, and a StepLR curve, written to
// optim_golden.bin for tests/optim/optim_golden_test.cpp. Built and run by
// make_optim_golden.sh; CI never runs it (the committed file is what the test reads).
// libtorch 1.13's C++ API has no OneCycleLR or CosineAnnealingLR (only StepLR), so those curves
// are checked against closed forms in tests/optim/lr_scheduler_test.cpp instead.
//
// The values (golden_writer.h's fill(), float64 rounded to float32):
//   "p0.init" (4, 5) = fill(.37, .1),  "p1.init" (3) = fill(.91, -.4)
//   "p<j>.grad<k>", k = 1..5: fill(.53 + .07k, .3k) * 2 / k (shrinking, so amsgrad's max matters)
// Per configuration C (the table below): "C.p<j>.step<k>", both parameters after step k.
// "step_lr.lr" (12): SGD(lr .5) under StepLR(step_size 3, gamma .5), the lr after 0..11 steps
// (libtorch's C++ StepLR trails Python's by one step; the test says how).
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "golden_writer.h"

namespace {

using torch::optim::Optimizer;
using Make = std::function<std::unique_ptr<Optimizer>(std::vector<torch::Tensor>)>;

torch::Tensor f32(torch::Tensor t) { return t.detach().to(torch::kFloat32); }

template <typename Opt, typename Options>
Make make(Options o) {
  return [o](std::vector<torch::Tensor> params) {
    return std::unique_ptr<Optimizer>(new Opt(params, o));
  };
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "optim_golden.bin";
  using namespace torch::optim;
  golden::Writer out;
  const std::vector<torch::Tensor> init = {f32(golden::fill({4, 5}, .37, .1)),
                                           f32(golden::fill({3}, .91, -.4))};
  std::vector<std::vector<torch::Tensor>> grads(5);
  for (int k = 1; k <= 5; ++k)
    for (size_t j = 0; j < init.size(); ++j) {
      grads[k - 1].push_back(
          f32(golden::fill(init[j].sizes().vec(), .53 + .07 * k, .3 * k, 2.0 / k)));
      out.add("p" + std::to_string(j) + ".grad" + std::to_string(k), grads[k - 1][j]);
    }
  for (size_t j = 0; j < init.size(); ++j) out.add("p" + std::to_string(j) + ".init", init[j]);

  const std::vector<std::pair<std::string, Make>> configs = {
      {"sgd", make<SGD>(SGDOptions(.1))},
      {"sgd_momentum", make<SGD>(SGDOptions(.1).momentum(.9).dampening(.1).weight_decay(.01))},
      {"sgd_nesterov", make<SGD>(SGDOptions(.1).momentum(.9).nesterov(true).weight_decay(.01))},
      {"adam", make<Adam>(AdamOptions(.01).betas({.8, .99}).weight_decay(.05))},
      {"adam_amsgrad", make<Adam>(AdamOptions(.01).amsgrad(true))},
      {"adamw", make<AdamW>(AdamWOptions(.01).weight_decay(.1))},
      {"adamw_amsgrad", make<AdamW>(AdamWOptions(.01).weight_decay(.1).amsgrad(true).eps(1e-6))},
      {"rmsprop", make<RMSprop>(RMSpropOptions(.01).alpha(.9).weight_decay(.01))},
      {"rmsprop_centered_momentum", make<RMSprop>(RMSpropOptions(.01).centered(true).momentum(.9))},
      {"adagrad",
       make<Adagrad>(
           AdagradOptions(.1).lr_decay(.01).weight_decay(.01).initial_accumulator_value(.1))},
  };
  for (const auto& [name, make_opt] : configs) {
    std::vector<torch::Tensor> params;
    for (const torch::Tensor& p : init) params.push_back(p.clone().requires_grad_(true));
    std::unique_ptr<Optimizer> opt = make_opt(params);
    for (int k = 1; k <= 5; ++k) {
      for (size_t j = 0; j < params.size(); ++j) params[j].mutable_grad() = grads[k - 1][j].clone();
      opt->step();
      for (size_t j = 0; j < params.size(); ++j)
        out.add(name + ".p" + std::to_string(j) + ".step" + std::to_string(k),
                params[j].detach().clone());  // add() keeps a view; the update is in place
    }
  }

  torch::Tensor w = torch::zeros({1}, torch::requires_grad());
  SGD sgd({w}, SGDOptions(.5));
  StepLR sched(sgd, /*step_size=*/3, /*gamma=*/.5);
  std::vector<double> lrs;
  for (int e = 0; e < 12; ++e) {
    lrs.push_back(sgd.param_groups()[0].options().get_lr());
    sgd.step();
    sched.step();
  }
  out.add("step_lr.lr", torch::tensor(lrs, torch::kFloat64));
  return out.save(path);
}
