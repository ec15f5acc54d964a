// Fused multi-tensor optimizer steps on the CPU (tensor/ops/optim.toml): _fused_sgd_,
// _fused_adam_ and _fused_adamw_, with PyTorch's update rules.
//
// Note [Fused optimizer steps]: the elements of every parameter are cut into chunks of at most
// kGrainSize, and the chunks of all parameters run in one parallel loop, so a step over many
// small tensors wakes the threads once and a big tensor is split. Each element of a parameter,
// its gradient and its state is read and written once. float16/bfloat16 compute in float32. A
// strided tensor is updated through a contiguous copy, copied back at the end.
#include <cmath>
#include <vector>

#include "kiln/generated/meta/optim.h"
#include "kiln/generated/ops/optim.h"
#include "kiln/operators.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// The tensors of a list, contiguous (the tensor itself when it already is).
class ContiguousList {
 public:
  explicit ContiguousList(TensorList ts) : orig_(ts) {
    work_.reserve(ts.size());
    for (const Tensor& t : ts) work_.push_back(t.contiguous());
  }
  template <typename T>
  T* data(size_t i) const {
    return i < work_.size() ? static_cast<T*>(work_[i].impl()->raw_data()) : nullptr;
  }
  // Copies the updated values into the tensors that were strided.
  void write_back() const {
    for (size_t i = 0; i < work_.size(); ++i)
      if (!work_[i].is_same(orig_[i])) orig_[i].copy_(work_[i]);
  }

 private:
  TensorList orig_;
  std::vector<Tensor> work_;
};

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

std::vector<Chunk> chunks_of(TensorList params) {
  std::vector<Chunk> out;
  for (size_t t = 0; t < params.size(); ++t)
    for (int64_t b = 0; b < params[t].numel(); b += kGrainSize)
      out.push_back({t, b, std::min(params[t].numel(), b + kGrainSize)});
  return out;
}

// Runs f(chunk) over every chunk of `params`, in parallel.
template <typename F>
void for_each_chunk(TensorList params, const F& f) {
  std::vector<Chunk> chunks = chunks_of(params);
  parallel_for(static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) f(chunks[c]);
  });
}

struct SgdArgs {
  double weight_decay, momentum, lr, dampening;
  bool nesterov, maximize, is_first_step;
};

// p, g, buf: elements [0, n) of one parameter (buf null without momentum).
template <typename T>
void sgd_elems(T* p, const T* g, T* buf, int64_t n, const SgdArgs& a) {
  using A = acc_t<T>;
  const A wd = static_cast<A>(a.weight_decay), mom = static_cast<A>(a.momentum);
  // 1 - x in double, then rounded once, as PyTorch passes it (A(1) - A(0.999) is off by 1e-5).
  const A lr = static_cast<A>(a.lr), damp = static_cast<A>(1 - a.dampening);
  for (int64_t i = 0; i < n; ++i) {
    A pi = static_cast<A>(p[i]);
    A gi = static_cast<A>(g[i]);
    if (a.maximize) gi = -gi;
    gi += wd * pi;
    if (buf != nullptr) {
      A bi = a.is_first_step ? gi : mom * static_cast<A>(buf[i]) + damp * gi;
      buf[i] = static_cast<T>(bi);
      gi = a.nesterov ? gi + mom * bi : bi;
    }
    p[i] = static_cast<T>(pi - lr * gi);
  }
}

void fused_sgd_cpu(TensorList self, TensorList grads, TensorList momentum_buffer_list,
                   double weight_decay, double momentum, double lr, double dampening, bool nesterov,
                   bool maximize, bool is_first_step) {
  meta::fused_sgd_(self, grads, momentum_buffer_list, weight_decay, momentum, lr, dampening,
                   nesterov, maximize, is_first_step);
  const SgdArgs args{weight_decay, momentum, lr, dampening, nesterov, maximize, is_first_step};
  ContiguousList p(self), g(grads), buf(momentum != 0 ? momentum_buffer_list : TensorList());
  for_each_chunk(self, [&](const Chunk& c) {
    KILN_DISPATCH_FLOAT_TYPES(self[c.tensor].dtype(), "_fused_sgd_", [&] {
      using T = scalar_t;
      T* bp = buf.data<T>(c.tensor);
      sgd_elems<T>(p.data<T>(c.tensor) + c.begin, g.data<T>(c.tensor) + c.begin,
                   bp ? bp + c.begin : nullptr, c.end - c.begin, args);
    });
  });
  p.write_back();
  buf.write_back();
}

struct AdamArgs {
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad, maximize, decoupled;  // decoupled: AdamW's weight decay
};

// Per parameter: its step's bias corrections.
struct AdamStep {
  double step_size, bias_correction2_sqrt;
};

template <typename T>
void adam_elems(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, const AdamArgs& a,
                const AdamStep& s) {
  using A = acc_t<T>;
  const A b2 = static_cast<A>(a.beta2);
  const A wd = static_cast<A>(a.weight_decay), eps = static_cast<A>(a.eps);
  // 1 - x in double, then rounded once, as PyTorch passes it (A(1) - A(0.999) is off by 1e-5).
  const A decay = static_cast<A>(1 - a.lr * a.weight_decay);
  const A one_minus_b1 = static_cast<A>(1 - a.beta1), one_minus_b2 = static_cast<A>(1 - a.beta2);
  const A step_size = static_cast<A>(s.step_size), bc2 = static_cast<A>(s.bias_correction2_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    A pi = static_cast<A>(p[i]);
    A gi = static_cast<A>(g[i]);
    if (a.maximize) gi = -gi;
    if (a.decoupled)
      pi *= decay;
    else
      gi += wd * pi;
    A mi = static_cast<A>(m[i]);
    mi += one_minus_b1 * (gi - mi);  // lerp, as PyTorch
    A vi = b2 * static_cast<A>(v[i]) + one_minus_b2 * gi * gi;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    if (vmax != nullptr) {
      vi = std::max(static_cast<A>(vmax[i]), vi);
      vmax[i] = static_cast<T>(vi);
    }
    p[i] = static_cast<T>(pi - step_size * mi / (std::sqrt(vi) / bc2 + eps));
  }
}

// Adds one to a one-element step counter (floating or int64); returns the new step.
double advance_step(const Tensor& step) {
  Tensor next = step.to(kFloat64) + 1.0;
  step.copy_(next.reshape(step.sizes()));
  return next.item<double>();
}

void fused_adam_cpu(TensorList self, TensorList grads, TensorList exp_avgs, TensorList exp_avg_sqs,
                    TensorList max_exp_avg_sqs, TensorList state_steps, double lr, double beta1,
                    double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                    bool decoupled) {
  const AdamArgs args{lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled};
  std::vector<AdamStep> steps;
  for (const Tensor& s : state_steps) {
    const double t = advance_step(s);
    steps.push_back({lr / (1 - std::pow(beta1, t)), std::sqrt(1 - std::pow(beta2, t))});
  }
  ContiguousList p(self), g(grads), m(exp_avgs), v(exp_avg_sqs);
  ContiguousList vmax(amsgrad ? max_exp_avg_sqs : TensorList());
  for_each_chunk(self, [&](const Chunk& c) {
    KILN_DISPATCH_FLOAT_TYPES(
        self[c.tensor].dtype(), decoupled ? "_fused_adamw_" : "_fused_adam_", [&] {
          using T = scalar_t;
          const size_t t = c.tensor;
          T* vm = vmax.data<T>(t);
          adam_elems<T>(p.data<T>(t) + c.begin, g.data<T>(t) + c.begin, m.data<T>(t) + c.begin,
                        v.data<T>(t) + c.begin, vm ? vm + c.begin : nullptr, c.end - c.begin, args,
                        steps[t]);
        });
  });
  for (const ContiguousList* l : {&p, &m, &v, &vmax}) l->write_back();
}

void fused_adam_entry(TensorList self, TensorList grads, TensorList exp_avgs,
                      TensorList exp_avg_sqs, TensorList max_exp_avg_sqs, TensorList state_steps,
                      double lr, double beta1, double beta2, double weight_decay, double eps,
                      bool amsgrad, bool maximize) {
  meta::fused_adam_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
                    beta2, weight_decay, eps, amsgrad, maximize);
  fused_adam_cpu(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, false);
}

void fused_adamw_entry(TensorList self, TensorList grads, TensorList exp_avgs,
                       TensorList exp_avg_sqs, TensorList max_exp_avg_sqs, TensorList state_steps,
                       double lr, double beta1, double beta2, double weight_decay, double eps,
                       bool amsgrad, bool maximize) {
  meta::fused_adamw_(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1,
                     beta2, weight_decay, eps, amsgrad, maximize);
  fused_adam_cpu(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
                 weight_decay, eps, amsgrad, maximize, true);
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::_fused_sgd_>(fused_sgd_cpu);
  m.impl<ops::_fused_adam_>(fused_adam_entry);
  m.impl<ops::_fused_adamw_>(fused_adamw_entry);
}

}  // namespace
}  // namespace kiln::kernels
