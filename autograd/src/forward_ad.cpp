// Dual tensors and forward AD levels: Notes [Forward AD] and [Forward AD levels] in
// kiln/autograd/forward_ad.h.
#include "kiln/autograd/forward_ad.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_set>

#include "autograd_support.h"
#include "forward_support.h"
#include "kiln/autograd/batched.h"

namespace kiln::autograd::forward {
namespace {

std::atomic<uint64_t> g_next_level{1};

// Every meta holding a tangent (of any thread's level), so that leaving a level can drop its
// tangents. Guarded by registry_mutex(); both are leaked so they outlive every tensor.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_set<AutogradMeta*>& registry() {
  static auto* s = new std::unordered_set<AutogradMeta*>;
  return *s;
}

// Drops the tangents of `level` (destroyed after the lock is released: a tangent's own meta
// may take the lock again).
void clear_level(uint64_t level) {
  std::vector<Tensor> dropped;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto& reg = registry();
    for (auto it = reg.begin(); it != reg.end();) {
      AutogradMeta* m = *it;
      if (m->fw_level_ != level) {
        ++it;
        continue;
      }
      dropped.push_back(std::move(m->fw_grad_));
      m->fw_grad_ = Tensor();
      m->fw_level_ = 0;
      if (!m->requires_grad() && m->fw_owner_ != nullptr)
        m->fw_owner_->remove_keys(DispatchKey::Autograd);
      it = reg.erase(it);
    }
  }
}

// Note [Dual tensors under vmap]: autograd, and so forward AD, only sees the plain bases of
// BatchedTensors (Note [vmap and autograd]), so a tangent must sit on the primal's base, laid out
// like it. make_dual batches primal and tangent at every active vmap level, moves the levels'
// dims to the front of both bases in level order, pairs the bases and wraps the dual again;
// unpack_dual reads the tangent of the base and wraps it at the dual's levels.
Tensor levels_to_front(const Tensor& t, std::vector<std::pair<int64_t, int64_t>>& levels) {
  PhysicalView p = to_physical(promote_to_active_levels(t));
  std::vector<int64_t> perm;
  levels.clear();
  for (const auto& [level, dim] : p.levels) {
    levels.emplace_back(level, static_cast<int64_t>(perm.size()));
    perm.push_back(dim);
  }
  for (int64_t d = 0; d < p.base.dim(); ++d)
    if (std::find(perm.begin(), perm.end(), d) == perm.end()) perm.push_back(d);
  return p.base.permute(perm);
}

Tensor make_batched_dual(const Tensor& primal, const Tensor& tangent) {
  std::vector<std::pair<int64_t, int64_t>> levels, tangent_levels;
  Tensor base_dual, tangent_base;
  {
    detail::ForwardADDisabledGuard off;
    base_dual = kiln::alias(levels_to_front(primal, levels));
    tangent_base = levels_to_front(tangent, tangent_levels);
  }
  KILN_ASSERT(levels == tangent_levels, "make_dual: primal and tangent levels differ");
  detail::set_tangent(base_dual, tangent_base);
  return from_physical(base_dual, levels);
}

}  // namespace

namespace detail {

void set_tangent(const Tensor& t, const Tensor& tangent) {
  const uint64_t level = autograd::detail::autograd_tls().fw_level;
  KILN_ASSERT(level != 0);
  AutogradMeta& m = materialize_meta(t);
  Tensor old;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (!m.fw_grad_.defined()) registry().insert(&m);
    old = std::move(m.fw_grad_);
    m.fw_grad_ = tangent;
    m.fw_level_ = level;
    m.fw_owner_ = t.impl();
  }
  t.impl()->add_keys(DispatchKey::Autograd);
}

void forget_tangent(AutogradMeta* m) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(m);
}

}  // namespace detail

DualLevel::DualLevel() {
  auto& s = autograd::detail::autograd_tls();
  KILN_CHECK(s.fw_level == 0, NotImplemented,
             "DualLevel: nested forward AD levels are not supported (level ", s.fw_level,
             " is already active on this thread); compute the tangents you need inside one level");
  id_ = g_next_level.fetch_add(1, std::memory_order_relaxed);
  s.fw_level = id_;
  s.refresh();
}

DualLevel::~DualLevel() {
  auto& s = autograd::detail::autograd_tls();
  s.fw_level = 0;
  s.refresh();
  clear_level(id_);
}

uint64_t current_level() { return autograd::detail::autograd_tls().fw_level; }

Tensor make_dual(const Tensor& primal, const Tensor& tangent) {
  KILN_CHECK(current_level() != 0, Runtime,
             "make_dual: no forward AD level is active on this thread; enter one with "
             "kiln::autograd::forward::DualLevel");
  KILN_CHECK(primal.defined(), Value, "make_dual: the primal is an undefined tensor");
  KILN_CHECK(tangent.defined(), Value, "make_dual: the tangent is an undefined tensor");
  KILN_CHECK(tangent.sizes() == primal.sizes(), Value, "make_dual: the tangent has shape ",
             tangent.sizes(), " but the primal has shape ", primal.sizes(),
             "; they must be the same");
  KILN_CHECK(is_floating(tangent.dtype()), Value,
             "make_dual: expected a floating point tangent, got dtype ",
             scalar_type_name(tangent.dtype()), " (shape ", tangent.sizes(), ")");
  KILN_CHECK(tangent.dtype() == primal.dtype(), Value, "make_dual: the tangent has dtype ",
             scalar_type_name(tangent.dtype()), " but the primal has dtype ",
             scalar_type_name(primal.dtype()), " (shapes ", tangent.sizes(), " and ",
             primal.sizes(), ")");
  KILN_CHECK(tangent.device() == primal.device(), Value, "make_dual: the tangent is on ",
             tangent.device(), " but the primal is on ", primal.device(), " (shapes ",
             tangent.sizes(), " and ", primal.sizes(), ")");
  KILN_CHECK(!detail::has_tangent(tangent), NotImplemented, "make_dual: the tangent (shape ",
             tangent.sizes(),
             ") has a tangent itself; tangents "
             "of tangents at one level are not supported");
  if (is_batched(primal) || is_batched(tangent)) return make_batched_dual(primal, tangent);
  Tensor dual;
  {
    detail::ForwardADDisabledGuard off;  // the alias keeps primal's history, not its tangent
    dual = kiln::alias(primal);
  }
  detail::set_tangent(dual, tangent);
  return dual;
}

UnpackedDual unpack_dual(const Tensor& t) {
  KILN_CHECK(t.defined(), Value, "unpack_dual: got an undefined tensor");
  if (is_batched(t)) {  // Note [Dual tensors under vmap]
    PhysicalView p = to_physical(t);
    UnpackedDual u = unpack_dual(p.base);
    return {from_physical(u.primal, p.levels),
            u.tangent.defined() ? from_physical(u.tangent, p.levels) : Tensor()};
  }
  Tensor tangent = detail::tangent_of(t);
  if (!tangent.defined()) return {t, Tensor()};
  detail::ForwardADDisabledGuard off;
  return {kiln::alias(t), tangent};
}

}  // namespace kiln::autograd::forward
