// tests/conformance/batched_path.cpp: the Batched path (builds with kiln_autograd). vmap of the
// op over a sample, each tensor argument batched at dim 0, at its last dim, or not batched
// (two assignments per sample), against the op applied to each example and stacked. A row whose
// batching rule is not "fallback" must not take the per-example loop (Note [Batching rules] in
// kiln/autograd/batched.h). vmap runs the ops' CPU kernels, so the path checks the CPU claims.
#include <set>

#include "conformance/path.h"
#include "kiln/autograd/batched.h"
#include "kiln/autograd/functional.h"

namespace kiln::conformance {
namespace {

constexpr int64_t kB = 3;

// Example b of a sample's tensor: floating values scaled per example, others copied.
Tensor example(const Tensor& t, int64_t b, bool perturb) {
  Tensor c = t.clone();
  if (perturb && is_floating(t.dtype()) && b > 0) c = (c * (1.0 + 0.125 * b)).to(t.dtype());
  return c;
}

// Where vmap takes the loop on purpose (Note [Row-wise batching]): per-example class weights of
// cross_entropy (the fused rows share one weight vector), attention with dropout.
const std::set<std::string> kLoopOnPurpose = {"cross_entropy_indices",
                                              "cross_entropy_indices_backward", "_fused_attention",
                                              "_fused_attention_backward"};
// Where vmap refuses what the loop does: batch_norm updating running statistics that every
// example shares (PyTorch's vmap refuses it too; pass batched running stats or none).
bool vmap_refuses_on_purpose(const std::string& name, const std::string& what) {
  return name == "batch_norm" && what.find("copy_(self") != std::string::npos;
}

// vmap(op) over one sample with the batching assignment `variant`, against the loop: "" when
// they agree. Random ops: shapes, and normal_/uniform_ draw differently per example. empty*:
// shapes only (uninitialized). as_strided: shapes only (its explicit storage offset addresses
// the batched value's storage, not a standalone example's).
std::string check(const OperatorHandle& op, const Stack& sample, int variant) {
  const OpInfo& info = op.info();
  const std::string name = op.name();
  const bool random_op = info.is_random;
  std::vector<Slot> slots;
  for (int i = 0; i < static_cast<int>(sample.size()); ++i) {
    if (sample[i].is_tensor()) slots.push_back({i, -1});
    if (sample[i].is_tensor_list())
      for (int k = 0; k < static_cast<int>(sample[i].to_tensor_list().size()); ++k)
        slots.push_back({i, k});
  }
  if (slots.empty()) return "";  // nothing to batch (creation ops)
  const int out_i = [&] {
    for (int i = 0; i < info.num_args; ++i)
      if (std::string(info.args[i].name) == "out") return i;
    return -1;
  }();
  // Batching mode per slot: 0 = dim 0, 1 = last dim, 2 = unbatched.
  std::vector<int> mode(slots.size());
  bool any = false;
  for (size_t k = 0; k < slots.size(); ++k) {
    const Tensor& t = get(sample, slots[k]);
    mode[k] = t.impl()->is_wrapped_number() ? 2 : static_cast<int>((k + variant) % 3);
    if ((info.is_inplace || slots[k].arg == out_i) && slots[k].arg == (out_i >= 0 ? out_i : 0))
      mode[k] = variant % 2;  // in-place self and out= must be batched
    if (name == "as_strided") mode[k] = 0;
    any = any || mode[k] != 2;
  }
  if (!any) mode[0] = 0;

  // The reference: the op on each example.
  std::vector<std::vector<Tensor>> ex(slots.size());
  for (size_t k = 0; k < slots.size(); ++k)
    for (int64_t b = 0; b < kB; ++b)
      ex[k].push_back(mode[k] == 2 ? get(sample, slots[k])
                                   : example(get(sample, slots[k]), b, !random_op));
  std::vector<std::vector<Tensor>> per;  // per example, the outputs
  bool ref_failed = false;
  // out=: the loop runs the functional op (out= is not resized inside vmap), the vmap call gets
  // an out of the result's shape.
  const OperatorHandle* ref_op = &op;
  if (out_i >= 0) ref_op = &Dispatcher::get().find_or_throw(name.substr(0, name.find('.')));
  try {
    for (int64_t b = 0; b < kB; ++b) {
      Stack s = sample;
      for (size_t k = 0; k < slots.size(); ++k) {
        Tensor e = ex[k][b];
        if (mode[k] != 2 && (info.is_inplace && slots[k].arg == 0)) e = e.clone();
        put(s, slots[k], e);
      }
      if (out_i >= 0) s.erase(s.begin() + out_i);
      ref_op->call_boxed(s);
      per.push_back(testing::outputs_of(s));
    }
  } catch (const Error&) {
    ref_failed = true;
  }

  std::vector<Tensor> inputs;
  std::vector<std::optional<int64_t>> in_dims;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (mode[k] == 2) {
      inputs.push_back(get(sample, slots[k]));
      in_dims.push_back(std::nullopt);
      continue;
    }
    Tensor first = ex[k][0];
    if (slots[k].arg == out_i && !ref_failed) {  // out= shaped and typed like the result
      for (int64_t b = 0; b < kB; ++b) ex[k][b] = kiln::zeros(per[b][0].sizes(), per[b][0].dtype());
      first = ex[k][0];
    }
    const int64_t d = mode[k] == 0 ? 0 : first.dim();
    inputs.push_back(kiln::stack(ex[k], d));
    in_dims.push_back(d);
  }
  func::MultiFn f = [&](const std::vector<Tensor>& ts) {
    Stack s = sample;
    for (size_t k = 0; k < slots.size(); ++k) put(s, slots[k], ts[k]);
    op.call_boxed(s);
    return testing::outputs_of(s);
  };
  func::clear_vmap_fallback_ops();
  std::vector<Tensor> got;
  try {
    got = func::vmap(f, in_dims)(inputs);
  } catch (const Error& e) {
    if (!ref_failed && !vmap_refuses_on_purpose(name, e.what()))
      return std::string("vmap raised ") + e.what();
    return "";
  }
  if (ref_failed) return "the loop raised but vmap did not";
  std::vector<std::string> fb = func::vmap_fallback_ops();
  if (info.batching != BatchingRule::Fallback && !fb.empty() && !kLoopOnPurpose.count(fb[0]))
    return std::string("rule ") + to_string(info.batching) + " took the per-example loop via " + fb[0];
  if (got.size() != per[0].size())
    return std::to_string(got.size()) + " outputs, the loop has " + std::to_string(per[0].size());
  for (size_t j = 0; j < got.size(); ++j) {
    std::vector<Tensor> col;
    for (int64_t b = 0; b < kB; ++b) col.push_back(per[b][j]);
    Tensor want = kiln::stack(col, 0);
    const bool shapes_only = random_op || name.rfind("empty", 0) == 0 || name == "as_strided";
    if (shapes_only) {
      if (got[j].sizes() != want.sizes() || got[j].dtype() != want.dtype())
        return compare_values({got[j]}, {want}, true);
      if ((name == "normal_" || name == "uniform_") && got[j].numel() > kB &&
          testing::to_doubles(got[j].select(0, 0)) == testing::to_doubles(got[j].select(0, 1)))
        return "examples drew the same values";
      continue;
    }
    std::string why = compare_values({got[j]}, {want}, false);
    if (!why.empty()) return "output " + std::to_string(j) + ": " + why;
  }
  return "";
}

class BatchedPath : public Path {
 public:
  std::string name() const override { return "Batched"; }
  testing::Backend claims() const override { return testing::Backend::CPU; }
  DispatchKey key() const override { return DispatchKey::Batched; }
  std::string unavailable() const override { return ""; }

  Outcome run(const Case& c) const override {
    for (int v : {2 * c.index, 2 * c.index + 1}) {
      std::string why = check(c.op(), c.sample, v);
      if (!why.empty()) return Outcome::failed("batching " + std::to_string(v % 3) + ": " + why);
    }
    return Outcome::ok();
  }
};

}  // namespace

KILN_CONFORMANCE_PATH(BatchedPath);

}  // namespace kiln::conformance
