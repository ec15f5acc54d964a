// Every differentiable op of the generated manifest, gradchecked through the autograd engine in
// float64 on its manifest samples (floating Tensor arguments converted to float64 and requiring
// grad; integer/bool arguments kept), plus a broadcast variant (a floating argument with its
// leading dimension reduced to 1, where the op accepts it and the output shape is unchanged) and
// a non-contiguous variant (every floating argument with strided storage). In-place variants
// run on a clone of their first argument. A differentiable op without a passing gradcheck fails
// the coverage test unless listed in kSkipped below.
// Second derivatives (gradgradcheck) for a representative set of ops at the end.
#include <iostream>
#include <set>

#include "autograd/gradgradcheck.h"
#include "samples/manifest.h"

namespace kiln::testing {
namespace {

// Differentiable ops that finite differences cannot check. Removing an entry is all it takes
// to check the op (its samples then run like every other op's).
const std::map<std::string, std::string> kSkipped = {
    // Random: every call draws new values, so f(x + eps) - f(x - eps) is noise.
    {"bernoulli", "random"},
    {"normal_", "random"},
    {"uniform_", "random"},
    // Note [Straight-through gradients]: fake quantization is piecewise constant (its finite
    // differences are 0, or huge across a rounding step); its derivative is by definition the
    // straight-through estimator (grad inside the quantization range), which
    // tests/kernels/quantized_test.cpp (QuantizedTest.FakeQuantize*Gradient) checks against the
    // finite differences of the function it stands for, x clamped to the range.
    {"fake_quantize_per_tensor_affine", "straight-through estimator"},
    {"fake_quantize_per_channel_affine", "straight-through estimator"},
};

// Composite rows whose result does not depend on the input's values: as in PyTorch they record
// nothing (checked below: their outputs never require grad), so there is nothing to gradcheck.
const std::set<std::string> kNotRecorded = {"empty_like", "zeros_like", "ones_like", "full_like"};

// The op as a function of its floating arguments (See run_on in tests/samples/manifest.h).
MultiFn op_fn(OperatorHandle& op, const Stack& sample) {
  return [&op, sample](const std::vector<Tensor>& xs) { return run_on(op, sample, xs); };
}

bool all_finite(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (is_floating(t.dtype()))
      for (double v : to_doubles(t))
        if (!std::isfinite(v)) return false;
  return true;
}

struct Variant {
  std::string label;
  std::vector<Tensor> inputs;
};

// The sample's floating arguments as they are, each in turn with its leading dimension cut to
// 1 (broadcast: kept only where the op accepts it and the output shape does not change), and all
// of them non-contiguous.
std::vector<Variant> variants(OperatorHandle& op, const Stack& sample) {
  std::vector<Tensor> xs = floating_tensors(sample);
  std::vector<Variant> out{{"sample", xs}};
  std::vector<int64_t> base_shape;
  std::vector<Tensor> base_outs;
  try {
    autograd::NoGradGuard ng;
    base_outs = op_fn(op, sample)(xs);
  } catch (const Error&) {
    return out;
  }
  const bool self_fixed = mutates_self(op.info());  // self of an in-place op cannot broadcast
  for (size_t i = self_fixed ? 1 : 0; i < xs.size() && xs.size() > 1; ++i) {
    if (xs[i].dim() == 0 || xs[i].size(0) <= 1) continue;
    std::vector<Tensor> b = xs;
    b[i] = xs[i].narrow(0, 0, 1).contiguous();
    try {
      autograd::NoGradGuard ng;
      auto outs = op_fn(op, sample)(b);
      bool same = outs.size() == base_outs.size();
      for (size_t o = 0; same && o < outs.size(); ++o) same = outs[o].sizes() == base_outs[o].sizes();
      if (same) out.push_back({"broadcast arg " + std::to_string(i), b});
    } catch (const Error&) {
    }
  }
  std::vector<Tensor> nc;
  bool any = false;
  for (const Tensor& x : xs) {
    nc.push_back(x.numel() > 1 ? non_contiguous(x) : x);
    any = any || !nc.back().is_contiguous();
  }
  if (any) out.push_back({"non-contiguous", nc});
  return out;
}

TEST(ManifestGradcheck, EveryDifferentiableOpIsCheckedInFloat64) {
  std::set<std::string> differentiable_ops, checked;
  std::map<std::string, int> variants_checked, by_kind;
  for (const std::string& name : manifest_names()) {
    OperatorHandle& op = Dispatcher::get().find_or_throw(name);
    if (!differentiable(op.info())) continue;
    differentiable_ops.insert(name);
    if (kSkipped.count(name)) continue;
    if (kNotRecorded.count(name)) {
      for (const Stack& raw : op_sample_registry().at(name)()) {
        Stack sample = to_float64(raw);
        std::vector<Tensor> in;
        for (const Tensor& x : floating_tensors(sample)) in.push_back(x.detach().requires_grad_());
        if (in.empty()) continue;
        for (const Tensor& o : op_fn(op, sample)(in)) EXPECT_FALSE(o.requires_grad()) << name;
      }
      continue;
    }
    std::vector<Stack> samples = differentiable_samples(name);
    int n = 0;
    for (const Stack& raw : samples) {
      Stack sample = to_float64(raw);
      int idx = n++;
      if (floating_tensors(sample).empty()) continue;
      for (const Variant& v : variants(op, sample)) {
        SCOPED_TRACE(name + " sample " + std::to_string(idx) + " (" + v.label + ")");
        // Outputs that need no grad (integer results, all-zero-size inputs) check nothing.
        std::vector<Tensor> probe_in;
        for (const Tensor& x : v.inputs) probe_in.push_back(x.detach().requires_grad_());
        std::vector<Tensor> probe = op_fn(op, sample)(probe_in);
        bool records = false;
        int64_t in_elems = 0;
        for (const Tensor& o : probe) records = records || (o.requires_grad() && o.numel() > 0);
        for (const Tensor& x : v.inputs) in_elems += x.numel();
        // Outside the real domain (NaN/inf outputs) finite differences mean nothing.
        if (!records || in_elems == 0 || !all_finite(probe)) continue;
        ::testing::AssertionResult r = ::testing::AssertionFailure();
        try {
          r = gradcheck_n(op_fn(op, sample), v.inputs);
        } catch (const Error& e) {
          r = ::testing::AssertionFailure() << "threw: " << e.what();
        }
        EXPECT_TRUE(r);
        if (r) {
          checked.insert(name);
          ++variants_checked[name];
          ++by_kind[v.label.substr(0, v.label.find(' '))];
        }
      }
    }
  }
  std::string missing;
  for (const std::string& name : differentiable_ops)
    if (!checked.count(name) && !kSkipped.count(name) && !kNotRecorded.count(name)) missing += name + " ";
  EXPECT_TRUE(missing.empty()) << "differentiable ops without a passing gradcheck: " << missing;
  for (const auto& [name, why] : kSkipped)
    EXPECT_TRUE(differentiable_ops.count(name)) << name << " is skipped but not differentiable";
  int total_variants = 0;
  for (const auto& [name, c] : variants_checked) total_variants += c;
  std::cout << "gradchecked " << checked.size() << " of " << differentiable_ops.size()
            << " differentiable ops (" << kSkipped.size() << " skipped, " << kNotRecorded.size()
            << " record nothing), " << total_variants
            << " sample variants (";
  for (const auto& [kind, c] : by_kind) std::cout << kind << " " << c << " ";
  std::cout << ")\n";
  EXPECT_GT(by_kind["broadcast"], 0);
  EXPECT_GT(by_kind["non-contiguous"], 0);
}

// Boxed calls (the interpreter's, the manifest's) of every op that mutates its first argument
// bump its version counter, as typed calls do: saved-tensor checks depend on it. (Composite
// in-place rows such as zero_ bump once more through the op they call, typed or boxed.)
TEST(ManifestGradcheck, BoxedMutatingCallsBumpTheVersionCounter) {
  int checked = 0;
  for (const std::string& name : manifest_names()) {
    OperatorHandle& op = Dispatcher::get().find_or_throw(name);
    if (!mutates_self(op.info()) || op.info().is_random) continue;
    for (const Stack& sample : op_sample_registry().at(name)()) {
      Stack s = sample;
      s[0] = IValue(sample[0].to_tensor().clone());
      Tensor self = s[0].to_tensor();
      const uint32_t before = self.impl()->version();
      op.call_boxed(s);
      EXPECT_GT(self.impl()->version(), before) << name;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

// Second derivatives of a representative set (both through create_graph and w.r.t. the cotangent).
TEST(ManifestGradcheck, GradGradRepresentativeOps) {
  using V = std::vector<Tensor>;
  Tensor a = random({2, 3}, kFloat64, -1, 1, 41);
  Tensor b = random({2, 3}, kFloat64, 0.5, 2, 42);
  Tensor c = random({3, 2}, kFloat64, -1, 1, 43);
  Tensor row = random({3}, kFloat64, -1, 1, 44);
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{mul(v[0], v[1])}; }, {a, b}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{mul(v[0], v[1])}; }, {a, row}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{exp(v[0])}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{tanh(v[0])}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{sigmoid(v[0])}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{mm(v[0], v[1])}; }, {a, c}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{v[0].sum()}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{(v[0] * v[0]).sum({1})}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{softmax(v[0], 1)}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{log_softmax(v[0], 0)}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{gelu(v[0])}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{gelu(v[0], "tanh")}; }, {a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{pow(v[0], v[1])}; }, {b, a}));
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{div(v[0], v[1])}; }, {a, b}));
  // Non-contiguous inputs keep their layout in gradcheck_n / gradgradcheck.
  EXPECT_TRUE(gradgradcheck([](const V& v) { return V{mul(v[0], v[1])}; },
                            {non_contiguous(a), non_contiguous(b)}));
}

// The checker itself: a wrong derivative must be caught (x * x recorded as mul with a detached
// second factor has half the true gradient).
TEST(ManifestGradcheck, CheckersRejectWrongGradients) {
  using V = std::vector<Tensor>;
  Tensor a = random({2, 3}, kFloat64, -1, 1, 45);
  EXPECT_FALSE(gradcheck_n([](const V& v) { return V{mul(v[0], v[0].detach() + 0)}; }, {a}));
  // First derivative right (x^2 -> 2x), second wrong: d/dx of (2 * detach(x)) * v is 0, not 2v.
  EXPECT_FALSE(gradgradcheck(
      [](const V& v) {
        Tensor x = v[0];
        return V{mul(x, x.detach()) + (mul(x, x.detach()) - mul(x, x.detach()).detach())};
      },
      {a}));
}

}  // namespace
}  // namespace kiln::testing
