// kiln/nn/loss.h: the loss modules (torch.nn's *Loss classes) over the functional losses.
//
//   kiln::nn::CrossEntropyLoss criterion({.ignore_index = 0, .label_smoothing = 0.1});
//   kiln::Tensor loss = criterion(logits, target);        // logits (N, C), target (N) int64
//   kiln::nn::SmoothL1Loss smooth("sum", /*beta=*/0.5);
//   kiln::nn::BCEWithLogitsLoss bce({.pos_weight = kiln::full({C}, 3.0)});
//   std::cout << criterion;                                // CrossEntropyLoss()
//
// Each module validates its reduction when built ('none', 'mean' or 'sum'; KLDivLoss also takes
// 'batchmean') and leaves every other check to the functional form at forward time. Class
// weights and pos_weight are buffers named as in PyTorch ("weight", "pos_weight"), so they move
// with to() and appear in state dicts; like PyTorch, the modules print with empty parentheses.
#pragma once

#include <string>

#include "kiln/nn/module.h"

namespace kiln::nn {

// The shared part: a reduction and forward(input, target).
class Loss : public Module {
 public:
  Loss(std::string type_name, std::string reduction, bool allow_batchmean = false);
  using Module::forward;
  using Module::operator();
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  Tensor operator()(const Tensor& input, const Tensor& target) { return forward(input, target); }
  std::string reduction;

 protected:
  // The registered weight-like buffer as the functional forms take it (None when undefined).
  static std::optional<Tensor> opt(const Tensor& t);
};

struct CrossEntropyLossOptions {
  Tensor weight;  // (C) class weights, or undefined
  int64_t ignore_index = -100;
  std::string reduction = "mean";
  double label_smoothing = 0.0;
};

// input: (N, C) or (N, C, d1, ...) logits; target: class indices (N, d1, ...) or probabilities
// shaped like input.
class CrossEntropyLoss : public Loss {
 public:
  explicit CrossEntropyLoss(CrossEntropyLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight;
  int64_t ignore_index;
  double label_smoothing;
};

struct NLLLossOptions {
  Tensor weight;
  int64_t ignore_index = -100;
  std::string reduction = "mean";
};

// input: (N, C, ...) log-probabilities; target: (N, ...) class indices.
class NLLLoss : public Loss {
 public:
  explicit NLLLoss(NLLLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight;
  int64_t ignore_index;
};

class MSELoss : public Loss {
 public:
  explicit MSELoss(std::string reduction = "mean") : Loss("MSELoss", std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

class L1Loss : public Loss {
 public:
  explicit L1Loss(std::string reduction = "mean") : Loss("L1Loss", std::move(reduction)) {}
  Tensor forward(const Tensor& input, const Tensor& target) override;
};

// 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta >= 0; 0 is L1).
class SmoothL1Loss : public Loss {
 public:
  explicit SmoothL1Loss(std::string reduction = "mean", double beta = 1.0);
  Tensor forward(const Tensor& input, const Tensor& target) override;
  double beta;
};

// 0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta), delta > 0. The table has no
// huber_loss row: this is delta * smooth_l1_loss(beta = delta), the same function.
class HuberLoss : public Loss {
 public:
  explicit HuberLoss(std::string reduction = "mean", double delta = 1.0);
  Tensor forward(const Tensor& input, const Tensor& target) override;
  double delta;
};

struct BCELossOptions {
  Tensor weight;  // broadcast against input, or undefined
  std::string reduction = "mean";
};

// input: probabilities in [0, 1]; target: same shape.
class BCELoss : public Loss {
 public:
  explicit BCELoss(BCELossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight;
};

struct BCEWithLogitsLossOptions {
  Tensor weight;
  std::string reduction = "mean";
  Tensor pos_weight;  // weight of the positive class, broadcast along the last dim
};

class BCEWithLogitsLoss : public Loss {
 public:
  explicit BCEWithLogitsLoss(BCEWithLogitsLossOptions options = {});
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor weight, pos_weight;
};

// input: log-probabilities; target: probabilities, or log-probabilities with log_target.
// reduction 'batchmean' divides the sum by the batch size (the KL divergence proper).
class KLDivLoss : public Loss {
 public:
  explicit KLDivLoss(std::string reduction = "mean", bool log_target = false);
  Tensor forward(const Tensor& input, const Tensor& target) override;
  bool log_target;
};

}  // namespace kiln::nn
