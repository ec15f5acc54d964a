// The derivative helper of _fused_attention (kiln/autograd/formulas_attention.h): Note [Fused
// attention gradients].
#include <array>

#include "kiln/autograd/formulas.h"

namespace kiln::autograd {
namespace {

constexpr size_t kArgs = 7;  // grad_out, grad_logsumexp, query, key, value, output, logsumexp

// One backward pass's gradients that its node has not taken yet, with what they were computed
// from.
struct Slot {
  std::array<Tensor, kArgs> args;
  std::array<uint32_t, kArgs> versions{};
  double dropout_p = 0;
  bool is_causal = false;
  std::optional<double> scale;
  int64_t seed = 0, offset = 0;
  std::array<Tensor, 3> grads;

  bool matches(const std::array<const Tensor*, kArgs>& a, double p, bool causal,
               std::optional<double> sc, int64_t sd, int64_t off) const {
    if (p != dropout_p || causal != is_causal || sc != scale || sd != seed || off != offset)
      return false;
    for (size_t i = 0; i < kArgs; ++i) {
      if (!args[i].is_same(*a[i])) return false;
      if (args[i].defined() && args[i].impl()->version() != versions[i]) return false;
    }
    return true;
  }
};

thread_local std::optional<Slot> t_slot;

}  // namespace

Tensor fused_attention_grad(int64_t which, const Tensor& grad_out, const Tensor& grad_logsumexp,
                            const Tensor& query, const Tensor& key, const Tensor& value,
                            const Tensor& output, const Tensor& logsumexp, double dropout_p,
                            bool is_causal, std::optional<double> scale, int64_t seed,
                            int64_t offset) {
  KILN_ASSERT(which >= 0 && which < 3, "fused_attention_grad: input ", which);
  const std::array<const Tensor*, kArgs> args = {&grad_out, &grad_logsumexp, &query,    &key,
                                                 &value,    &output,         &logsumexp};
  if (t_slot && t_slot->matches(args, dropout_p, is_causal, scale, seed, offset) &&
      t_slot->grads[which].defined()) {
    Tensor g = std::move(t_slot->grads[which]);
    t_slot->grads[which] = Tensor();
    bool rest = false;
    for (const Tensor& t : t_slot->grads) rest = rest || t.defined();
    if (!rest) t_slot.reset();
    return g;
  }
  t_slot.reset();
  auto [gq, gk, gv] = kiln::_fused_attention_backward(
      grad_out.defined() ? grad_out : zeros_like(output),
      grad_logsumexp.defined() ? grad_logsumexp : zeros_like(logsumexp), query, key, value, output,
      logsumexp, dropout_p, is_causal, scale, seed, offset);
  const std::array<Tensor, 3> all = {gq, gk, gv};
  Slot slot;
  bool keep = false;
  for (int64_t i = 0; i < 3; ++i) {
    if (i == which || !args[2 + i]->requires_grad()) continue;
    slot.grads[i] = all[i];
    keep = true;
  }
  if (keep) {
    for (size_t i = 0; i < kArgs; ++i) {
      slot.args[i] = *args[i];
      if (args[i]->defined()) slot.versions[i] = args[i]->impl()->version();
    }
    slot.dropout_p = dropout_p;
    slot.is_causal = is_causal;
    slot.scale = scale;
    slot.seed = seed;
    slot.offset = offset;
    t_slot = std::move(slot);
  }
  return all[which];
}

}  // namespace kiln::autograd
