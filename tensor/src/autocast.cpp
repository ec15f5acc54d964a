// The Autocast key: the thread-local autocast state, its guard, and the one boxed kernel that
// applies each row's autocast policy (Note [Autocast] in autocast.h).
#include "kiln/autocast.h"

#include <utility>
#include <vector>

#include "kiln/dispatcher.h"
#include "kiln/tensor.h"

namespace kiln {
namespace {

struct DeviceAutocast {
  bool enabled = false;
  ScalarType dtype = kBFloat16;
};
thread_local DeviceAutocast tls_autocast[kNumDeviceTypes];

// The Autocast key is in the included set exactly while some device type is enabled.
void sync_autocast_key() {
  bool any = false;
  for (const DeviceAutocast& d : tls_autocast) any = any || d.enabled;
  LocalDispatchKeySet& tls = tls_local_dispatch_key_set();
  tls.included =
      any ? tls.included.add(DispatchKey::Autocast) : tls.included.remove(DispatchKey::Autocast);
}

DeviceAutocast& state(DeviceType t) { return tls_autocast[static_cast<int>(t)]; }

using Policy = AutocastPolicy;

Policy policy_of(const OpInfo& info) {
  // In-place and out= variants keep the dtype of the tensor they write (See Note [Autocast]).
  if (info.is_inplace || info.is_out) return Policy::None;
  return info.autocast;
}

// A floating tensor on a device type that autocast currently covers.
bool eligible(const Tensor& t) {
  return t.defined() && is_floating(t.dtype()) && !t.impl()->is_wrapped_number() &&
         state(t.device().type()).enabled;
}

// The dtype `t` is cast to under `policy` (`widest`: the promote target), or t's own dtype.
ScalarType target_dtype(const Tensor& t, Policy policy, ScalarType widest) {
  const ScalarType d = t.dtype();
  switch (policy) {
    case Policy::LowerPrecision:
      return d == kFloat64 ? d : state(t.device().type()).dtype;
    case Policy::Fp32:
      return d == kFloat16 || d == kBFloat16 ? kFloat32 : d;
    case Policy::Promote:
      return widest;
    case Policy::None:
      break;
  }
  return d;
}

// Applies `fn` to every tensor argument of the op on top of `stack` (lists included).
template <typename Fn>
void for_each_tensor(const OpInfo& info, Stack& stack, Fn fn) {
  const size_t first = stack.size() - info.num_args;
  for (size_t i = first; i < stack.size(); ++i) {
    IValue& v = stack[i];
    if (v.is_tensor()) {
      Tensor t = v.to_tensor();
      if (fn(t)) v = IValue(std::move(t));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts = v.to_tensor_list();
      bool changed = false;
      for (Tensor& t : ts) changed = fn(t) || changed;
      if (changed) v = IValue(std::move(ts));
    }
  }
}

// fp32 ops given an explicit output dtype (sum(x, dtype=...)) run as asked, as in PyTorch.
bool has_dtype_arg(const OpInfo& info, const Stack& stack) {
  const size_t first = stack.size() - info.num_args;
  for (int i = 0; i < info.num_args; ++i)
    if (info.args[i].role == ArgRole::Dtype) return !stack[first + i].is_none();
  return false;
}

void cast_arguments(const OpInfo& info, Policy policy, Stack& stack) {
  if (policy == Policy::Fp32 && has_dtype_arg(info, stack)) return;
  ScalarType widest = kFloat16;
  bool any = false;
  if (policy == Policy::Promote) {
    for_each_tensor(info, stack, [&](Tensor& t) {
      if (!eligible(t)) return false;
      widest = any ? promote_types(widest, t.dtype()) : t.dtype();
      any = true;
      return false;
    });
  }
  // One cast per distinct tensor within this call (See Note [Autocast]).
  std::vector<std::pair<const TensorImpl*, Tensor>> casts;
  for_each_tensor(info, stack, [&](Tensor& t) {
    if (!eligible(t)) return false;
    const ScalarType want = target_dtype(t, policy, widest);
    if (want == t.dtype()) return false;
    for (const auto& [impl, cast] : casts) {
      if (impl != t.impl()) continue;
      t = cast;
      return true;
    }
    Tensor cast = t.to(want);
    casts.emplace_back(t.impl(), cast);
    t = std::move(cast);
    return true;
  });
}

void autocast_kernel(const OperatorHandle& op, DispatchKeySet ks, Stack& stack) {
  ExcludeDispatchKeyGuard no_autocast(DispatchKey::Autocast);
  const Policy policy = policy_of(op.info());
  if (policy != Policy::None) cast_arguments(op.info(), policy, stack);
  op.redispatch_boxed(ks & DispatchKeySet::below(DispatchKey::Autocast), stack);
}

KILN_LIBRARY(Autocast, m) { m.fallback(&autocast_kernel); }

}  // namespace

bool is_autocast_enabled(DeviceType device_type) { return state(device_type).enabled; }

ScalarType get_autocast_dtype(DeviceType device_type) { return state(device_type).dtype; }

AutocastGuard::AutocastGuard(DeviceType device_type, ScalarType dtype, bool enabled)
    : device_type_(device_type),
      prev_enabled_(state(device_type).enabled),
      prev_dtype_(state(device_type).dtype) {
  KILN_CHECK(dtype == kBFloat16 || dtype == kFloat16, Value,
             "AutocastGuard: dtype must be bfloat16 or float16, got ", dtype);
  state(device_type) = DeviceAutocast{enabled, dtype};
  sync_autocast_key();
}

AutocastGuard::~AutocastGuard() {
  state(device_type_) = DeviceAutocast{prev_enabled_, prev_dtype_};
  sync_autocast_key();
}

}  // namespace kiln
