#include "op_support.h"

#include "kiln/default_device.h"
#include "kiln/generated/ops.h"

namespace kiln::detail {

DispatchKeySet key_of_list(TensorList ts) {
  // An empty list has no device: run on CPU (like ops without tensor arguments), so the
  // op's meta function reports the empty list instead of the dispatcher finding no kernel.
  if (ts.empty()) return DispatchKeySet(DispatchKey::CPU);
  DispatchKeySet ks;
  for (const Tensor& t : ts) {
    KILN_CHECK(t.defined(), Value, "a tensor list contains an undefined tensor");
    ks = ks | t.key_set();
  }
  return ks;
}

DispatchKeySet device_key(const std::optional<Device>& d) {
  return DispatchKeySet(backend_key(d ? d->type() : default_device().type()));
}

// torch.can_cast: no float -> integer, no non-bool -> bool.
static bool can_cast(ScalarType from, ScalarType to) {
  if (is_floating(from) && !is_floating(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

TensorSpec inplace_spec(const char* op, const Tensor& self, const TensorSpec& spec) {
  KILN_CHECK(spec.sizes.ref() == self.sizes(), Value, op, ": output with shape ", self.sizes(),
             " doesn't match the broadcast shape ", spec.sizes.ref());
  KILN_CHECK(can_cast(spec.dtype, self.dtype()), Type, op, ": result type ", spec.dtype,
             " can't be cast to the desired output type ", self.dtype());
  TensorSpec s;
  s.sizes = self.sizes();
  s.strides = self.strides();
  s.offset = self.storage_offset();
  s.dtype = self.dtype();
  s.device = self.device();
  s.alias_of = 0;
  return s;
}

void prepare_out(const char* op, const Tensor& out, const TensorSpec& spec) {
  out.check_defined("out");
  KILN_CHECK(out.device() == spec.device, Value, op, ": out is on ", out.device(),
             " but the result is on ", spec.device);
  KILN_CHECK(can_cast(spec.dtype, out.dtype()), Type, op, ": result type ", spec.dtype,
             " can't be cast to the desired output type ", out.dtype());
  if (out.sizes() != spec.sizes.ref()) out.impl()->resize(spec.sizes);
}

Tensor out_target(const Tensor& dst, const TensorSpec& spec) {
  if (dst.dtype() == spec.dtype) return dst;
  return empty_on(spec.sizes, spec.dtype, dst.device());
}

void finish_out(const Tensor& dst, const Tensor& tmp) {
  if (!tmp.is_same(dst)) dst.copy_(tmp);
}

Tensor make_view(const Tensor& base, const TensorSpec& spec) {
  intrusive_ptr<TensorImpl> v = TensorImpl::make(base.impl()->storage(), base.dtype(), spec.sizes,
                                                 spec.strides, spec.offset);
  v->set_view_of(base.impl_ptr());  // Note [View bases]
  return Tensor(std::move(v));
}

std::vector<Tensor> make_views(const Tensor& base, const std::vector<TensorSpec>& specs) {
  std::vector<Tensor> out;
  out.reserve(specs.size());
  for (const TensorSpec& spec : specs) out.push_back(make_view(base, spec));
  return out;
}

int register_view_kernel(OperatorHandle& op, void* fn) {
  for (DispatchKey k : {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::Metal, DispatchKey::Meta})
    Dispatcher::get().register_kernel(op, k, fn, nullptr);
  return 0;
}

int register_composite(OperatorHandle& op, void* fn) {
  // A row with an autocast policy leaves its Autocast slot to the fallback, which casts the
  // arguments before the decomposition runs (See Note [Autocast] in kiln/autocast.h).
  const bool autocast_casts = op.info().autocast != AutocastPolicy::None;
  for (int k = 0; k < kNumDispatchKeys; ++k) {
    if (autocast_casts && static_cast<DispatchKey>(k) == DispatchKey::Autocast) continue;
    Dispatcher::get().register_kernel(op, static_cast<DispatchKey>(k), fn, nullptr);
  }
  return 0;
}

}  // namespace kiln::detail
