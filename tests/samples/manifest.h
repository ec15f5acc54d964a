// tests/samples/manifest.h: the op table as the tests walk it (no GoogleTest): one row per op
// with its kind and the dtypes it claims per backend, samples in a given dtype, and the helpers
// the manifest-walking suites share (tests/tensor/manifest_test.cpp, the conformance driver,
// tests/autograd/manifest_gradcheck_test.cpp and forward_ad_test.cpp).
//
//   for (const testing::ManifestRow& row : testing::manifest())
//     for (ScalarType d : row.claimed(testing::Backend::CUDA)) ...
//   std::optional<Stack> s = testing::sample_in_dtype(sample, kBFloat16);
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dispatcher.h"
#include "samples/op_samples.h"

namespace kiln::testing {

// The backends a row claims dtypes for (the `dtypes` field of the op table).
enum class Backend { CPU, CUDA, Meta };
constexpr int kNumBackends = 3;
const char* backend_name(Backend b);

struct ManifestRow {
  std::string name;
  OperatorHandle* op;
  bool composite;                                // kind == OpKind::Composite
  std::vector<ScalarType> claims[kNumBackends];  // per Backend, in ScalarType order

  const std::vector<ScalarType>& claimed(Backend b) const { return claims[static_cast<int>(b)]; }
  bool claims_dtype(Backend b, ScalarType t) const;
};

// Every row of the op table, in table order.
//
// Note [Manifest claims]: manifest.cpp's read_manifest() is the one place that reads a row's kind and dtype claims (the typed
// values of the generated manifest.inc, the same as OpInfo's: Manifest.AgreesWithOpInfo).
const std::vector<ManifestRow>& manifest();
const ManifestRow* manifest_row(std::string_view name);  // nullptr when absent
std::vector<std::string> manifest_names();

// Note [Sample dtypes]: the sample of an op in dtype D is its written sample with every floating
// tensor (lists included) cast to D; integer and bool tensors (indices, masks, targets),
// wrapped numbers and every non-tensor argument stay as written. A sample without floating
// tensors is the sample of one dtype only, that of its first tensor (bitwise ops, integer
// creation...). A sample without tensors (a factory) is the sample of D with its `dtype`
// argument set to D. So samples are written once, in float32 unless the op needs otherwise,
// and the driver runs them in every dtype a row claims. Returns nullopt where the sample has no
// version in D.
//
// Note [Variant dtypes]: the variants of a functional op F follow F's type promotion, as
// PyTorch's do. An out= variant's `out` tensor is no data (it never makes a sample floating);
// in D it takes F's result dtype on the sample's inputs in D (exp.out writes an int32 input's
// exp into a float32 `out`). An in-place variant writes F's result into self, so it claims D
// only where F's result on the sample in D (functional_result_dtype) can be cast to D by
// torch.can_cast's rule (no floating -> integral, no non-bool -> bool): exp_ on an integer
// tensor cannot hold its float result (eager CPU refuses it, as PyTorch does), while eq_ and
// logical_not_ on a float tensor can hold their bool one. The generated variant row inherits
// F's claims; the driver counts a cell F's result cannot fit as not claimed
// (tests/conformance/driver.cpp, run()). An out= sample whose inputs are all integer counts for
// their dtype only, so with_out (pointwise_samples.cpp) gives it a float32 companion.
std::optional<Stack> sample_in_dtype(const Stack& sample, ScalarType d, const OpInfo& info);

// For an in-place ("exp_", "round_.decimals") or out= ("exp.out") variant: the dtype of the
// first result of its functional op ("exp", "round.decimals") on `sample`'s inputs (the out=
// tensor dropped), computed on Meta. nullopt for other ops, or when the functional op is absent
// or raises.
std::optional<ScalarType> functional_result_dtype(const OpInfo& info, const Stack& sample);

// The sample with each floating tensor of more than one element (wrapped numbers aside) laid out
// non-contiguously (same values); nullopt when no such tensor was contiguous.
std::optional<Stack> non_contiguous_variant(const Stack& sample);

// A copy of `t` in `dtype` on `device` with the same sizes, strides and storage offset, in a
// storage of the same size (as_strided samples address it); wrapped numbers stay wrapped.
Tensor copy_tensor(const Tensor& t, ScalarType dtype, Device device);

// A generator of its own in the state of `g` (it draws what `g` would draw next).
Generator copy_generator(const Generator& g);

// A deep copy, each tensor by copy_tensor (in-place ops mutate their inputs), each generator by
// copy_generator (every run of a sample draws the same values).
Stack clone_stack(const Stack& s);

// out= variants do not record (as in PyTorch), nor do ops without a Tensor argument
// (factories); the others are differentiable unless the row says "non_differentiable".
bool differentiable(const OpInfo& info);

// Mutates its first argument: in-place variants and standalone rows such as fill_ and copy_
// (OpInfo::is_inplace is set for the variants only), by the schema's Tensor(a!) self.
bool mutates_self(const OpInfo& info);

// The floating tensors of a stack (lists flattened), in order.
std::vector<Tensor> floating_tensors(const Stack& s);

// `s` with its floating tensors replaced, in order, by `xs`.
Stack substitute(const Stack& s, const std::vector<Tensor>& xs);

// The op on `xs` in place of the sample's floating tensors (an op that mutates self mutates a
// clone of it, so the sample stays unchanged): its output tensors.
std::vector<Tensor> run_on(const OperatorHandle& op, const Stack& sample,
                           const std::vector<Tensor>& xs);

// The samples the autograd suites check an op on: its own, those of its in-place and .out
// variants for a functional row (same arguments; the trailing `out` dropped), and extra ones
// where the manifest's samples have no floating argument (max.dim) or lie outside the op's real
// domain (pow: negative bases with fractional exponents).
std::vector<Stack> differentiable_samples(const std::string& name);

}  // namespace kiln::testing
