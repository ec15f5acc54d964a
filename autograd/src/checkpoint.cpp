// Note [Checkpointing] in checkpoint.h.
#include "kiln/autograd/checkpoint.h"

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/generator.h"
#include "forward_support.h"

namespace kiln::autograd {
namespace {

// Sets the default generator to `state` and puts the previous state back on exit.
class RngReplay {
 public:
  RngReplay(bool enabled, GeneratorState state) : enabled_(enabled) {
    if (!enabled_) return;
    prev_ = default_generator().get_state();
    default_generator().set_state(state);
  }
  ~RngReplay() {
    if (enabled_) default_generator().set_state(prev_);
  }

 private:
  bool enabled_;
  GeneratorState prev_;
};

class CheckpointBackward final : public Node {
 public:
  CheckpointBackward(CheckpointFn fn, bool preserve_rng)
      : fn_(std::move(fn)), preserve_rng_(preserve_rng) {
    if (preserve_rng_) rng_ = default_generator().get_state();
  }
  const char* name() const override { return "CheckpointFunctionBackward"; }

  void save_inputs(const variable_list& inputs) {
    for (const Tensor& x : inputs) {
      inputs_.emplace_back(x, false);
      requires_grad_.push_back(x.defined() && x.requires_grad());
    }
  }

  variable_list apply(variable_list&& grads) override {
    // The engine runs nodes with grad mode on only for create_graph: the inner backward below is
    // not recorded, so a double backward would be silently wrong.
    KILN_CHECK(!GradMode::is_enabled(), Runtime,
               "checkpoint: backward with create_graph=true through a checkpointed region is not "
               "supported (the recomputed backward is not recorded)");
    variable_list detached;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      Tensor x = inputs_[i].unpack(*this, "input");
      if (x.defined()) {
        x = x.detach();
        if (requires_grad_[i]) x.requires_grad_();
      }
      detached.push_back(std::move(x));
    }
    variable_list outs;
    {
      RngReplay replay(preserve_rng_, rng_);
      EnableGradGuard grad_on;
      outs = fn_(detached);
    }
    KILN_CHECK(outs.size() == grads.size(), Runtime,
               "checkpoint: the recomputation returned ", outs.size(), " outputs, the forward ",
               grads.size());
    variable_list roots, root_grads;
    for (size_t i = 0; i < outs.size(); ++i)
      if (outs[i].defined() && outs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outs[i]);
        root_grads.push_back(grads[i]);
      }
    if (!roots.empty()) autograd::backward(roots, root_grads);
    variable_list out(detached.size());
    for (size_t i = 0; i < detached.size(); ++i)
      if (requires_grad_[i] && should_compute_output(i)) out[i] = detached[i].grad();
    return out;
  }

  void release_variables() override {
    for (SavedVariable& sv : inputs_) sv.reset();
  }

 private:
  CheckpointFn fn_;
  bool preserve_rng_;
  GeneratorState rng_;
  std::vector<SavedVariable> inputs_;
  std::vector<bool> requires_grad_;
};

}  // namespace

variable_list checkpoint(const CheckpointFn& fn, const variable_list& inputs,
                         bool preserve_rng_state) {
  bool any = false;
  for (const Tensor& x : inputs) any = any || (x.defined() && x.requires_grad());
  if (!GradMode::is_enabled() || !any) return fn(inputs);
  auto node = std::make_shared<CheckpointBackward>(fn, preserve_rng_state);
  variable_list outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  for (const Tensor& x : inputs) collect_edge(*node, x);
  node->save_inputs(inputs);
  for (size_t i = 0; i < outs.size(); ++i) {
    Tensor& o = outs[i];
    KILN_CHECK(o.defined(), Value, "checkpoint: fn returned an undefined tensor at index ", i);
    for (const Tensor& x : inputs)
      if (x.defined() && x.impl() == o.impl()) {
        Tensor alias = o.detach();  // an input returned as is: a new alias with this history
        forward::detail::copy_tangent(o, alias);  // (and the input's tangent)
        o = std::move(alias);
        break;
      }
    if (is_floating(o.dtype())) set_history(o, node);
    else node->add_input_metadata(o);
  }
  return outs;
}

}  // namespace kiln::autograd
