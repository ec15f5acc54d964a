// The Meta backend: every op runs its meta function only (DESIGN.md "The dispatcher").
// Outputs are data-less tensors (Note [Data-less tensors]); views, in-place and out= results
// alias their inputs exactly as on a real backend.
#include "op_support.h"

namespace kiln {
namespace {

size_t span_bytes(const TensorSpec& s) {
  int64_t hi = s.offset;
  for (size_t i = 0; i < s.sizes.size(); ++i) {
    if (s.sizes[i] == 0) return 0;
    hi += (s.sizes[i] - 1) * s.strides[i];
  }
  return static_cast<size_t>(hi + 1) * element_size(s.dtype);
}

void meta_fallback(const OperatorHandle& op, DispatchKeySet, Stack& s) {
  const OpInfo& info = op.info();
  std::vector<TensorSpec> specs = op.run_meta(s);
  std::vector<Tensor> outs;
  outs.reserve(specs.size());
  for (const TensorSpec& spec : specs) {
    if (spec.alias_of < 0) {
      auto storage = Storage::create_dataless(span_bytes(spec), Device(DeviceType::Meta));
      outs.emplace_back(TensorImpl::make(storage, spec.dtype, spec.sizes, spec.strides, spec.offset));
      continue;
    }
    const Tensor& base = s[s.size() - info.num_args + spec.alias_of].to_tensor();
    if (info.is_view) {
      outs.push_back(detail::make_view(base, spec));
    } else {
      if (info.is_out && base.sizes() != spec.sizes.ref()) base.impl()->resize(spec.sizes);
      outs.push_back(base);
    }
  }
  detail::drop_args(s, info.num_args);
  if (info.returns_list) {
    s.emplace_back(std::move(outs));
  } else {
    for (Tensor& t : outs) s.emplace_back(std::move(t));
  }
}

KILN_LIBRARY(Meta, m) { m.fallback(&meta_fallback); }

}  // namespace
}  // namespace kiln
