// BatchedTensor (Note [BatchedTensor] in batched.h), vmap levels, and the translation of
// autograd::grad calls on BatchedTensors to their plain values (Note [Batched gradients]).
#include "kiln/autograd/batched.h"

#include <algorithm>

#include "batched_internal.h"
#include "kiln/autograd/engine.h"
#include "kiln/generated/ops.h"

namespace kiln::autograd {
namespace {

struct BatchedHandle final : BackendHandle {
  Tensor value;
  int64_t bdim;
  int64_t level;
  BatchedHandle(Tensor v, int64_t d, int64_t l) : value(std::move(v)), bdim(d), level(l) {}
  intrusive_ptr<TensorImpl> detached(const TensorImpl&) const override {
    return make_batched(value.detach(), bdim, level).impl_ptr();
  }
  bool requires_grad() const override { return value.requires_grad(); }
};

const BatchedHandle* handle_of(const Tensor& t) {
  if (!t.defined() || !t.key_set().has(DispatchKey::Batched)) return nullptr;
  return static_cast<const BatchedHandle*>(t.impl()->backend_handle());
}

const BatchedHandle& need_handle(const Tensor& t) {
  const BatchedHandle* h = handle_of(t);
  KILN_CHECK(h != nullptr, Value, "expected a tensor batched by vmap (a BatchedTensor)");
  return *h;
}

thread_local std::vector<VmapLevel> g_levels;

}  // namespace

Tensor make_batched(const Tensor& value, int64_t bdim, int64_t level) {
  value.check_defined("make_batched(): the value");
  KILN_CHECK(bdim >= 0 && bdim < value.dim(), Index, "make_batched: batch dim ", bdim,
             " out of range for a value of shape ", value.sizes());
  KILN_ASSERT(batched_level(value) < level, "a BatchedTensor's value must be of a lower level");
  DimVector sizes, strides;
  for (int64_t d = 0; d < value.dim(); ++d) {
    if (d == bdim) continue;
    sizes.push_back(value.size(d));
    strides.push_back(value.stride(d));
  }
  // Storage-less: the logical geometry only describes the examples, it addresses nothing.
  auto storage = Storage::create_dataless(0, value.device());
  auto impl = TensorImpl::make_trusted(std::move(storage), value.dtype(), sizes, strides);
  impl->add_keys(DispatchKey::Batched);
  impl->set_backend_handle(std::make_shared<BatchedHandle>(value, bdim, level));
  return Tensor(std::move(impl));
}

bool is_batched(const Tensor& t) { return handle_of(t) != nullptr; }
int64_t batched_level(const Tensor& t) {
  const BatchedHandle* h = handle_of(t);
  return h ? h->level : 0;
}
const Tensor& batched_value(const Tensor& t) { return need_handle(t).value; }
int64_t batched_bdim(const Tensor& t) { return need_handle(t).bdim; }

PhysicalView to_physical(const Tensor& t) {
  std::vector<const BatchedHandle*> chain;  // outermost first
  Tensor base = t;
  while (const BatchedHandle* h = handle_of(base)) {
    chain.push_back(h);
    base = h->value;
  }
  PhysicalView p{base, {}};
  std::vector<int64_t> logical_to_base(base.dim());
  for (int64_t d = 0; d < base.dim(); ++d) logical_to_base[d] = d;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {  // lowest level first
    p.levels.emplace_back((*it)->level, logical_to_base[(*it)->bdim]);
    logical_to_base.erase(logical_to_base.begin() + (*it)->bdim);
  }
  return p;
}

Tensor from_physical(const Tensor& base, const std::vector<std::pair<int64_t, int64_t>>& levels) {
  std::vector<int64_t> logical_to_base(base.dim());
  for (int64_t d = 0; d < base.dim(); ++d) logical_to_base[d] = d;
  Tensor t = base;
  for (const auto& [level, dim] : levels) {
    auto it = std::find(logical_to_base.begin(), logical_to_base.end(), dim);
    KILN_ASSERT(it != logical_to_base.end(), "from_physical: dim used twice");
    t = make_batched(t, it - logical_to_base.begin(), level);
    logical_to_base.erase(it);
  }
  return t;
}

const std::vector<VmapLevel>& active_vmap_levels() { return g_levels; }

VmapLevelGuard::VmapLevelGuard(int64_t batch_size)
    : level_(static_cast<int64_t>(g_levels.size()) + 1) {
  g_levels.push_back(VmapLevel{level_, batch_size});
}
VmapLevelGuard::~VmapLevelGuard() { g_levels.pop_back(); }

Tensor promote_to_active_levels(const Tensor& t) {
  PhysicalView p = to_physical(t);
  bool changed = false;
  for (const VmapLevel& l : g_levels) {
    bool has = false;
    for (const auto& pl : p.levels) has = has || pl.first == l.level;
    if (has) continue;
    DimVector sizes(p.base.sizes());
    sizes.insert(0, l.batch_size);
    p.base = p.base.unsqueeze(0).expand(IntArrayRef(sizes));
    for (auto& pl : p.levels) ++pl.second;
    p.levels.emplace_back(l.level, 0);
    changed = true;
  }
  if (!changed) return t;
  std::sort(p.levels.begin(), p.levels.end());
  return from_physical(p.base, p.levels);
}

// Note [Batched gradients]: autograd recorded the plain bases of the outputs and inputs
// (Note [vmap and autograd]). A cotangent is laid out like its output's base: at each level the
// output has, the cotangent's examples move to the output's base dim (expanded where the
// cotangent is not batched at that level). Levels only the cotangent has (a vmap over vjp
// started after the forward, as jacrev does) stay BatchedTensors: the backward itself then runs
// batched, each example a different cotangent. The gradient of an input's base comes back the
// same way and is wrapped again at the input's levels.
namespace {

bool has_level(const PhysicalView& p, int64_t level, int64_t* dim = nullptr) {
  for (const auto& [l, d] : p.levels)
    if (l == level) {
      if (dim) *dim = d;
      return true;
    }
  return false;
}

Tensor align_cotangent(const Tensor& ct, const Tensor& out) {
  PhysicalView c = to_physical(ct), o = to_physical(out);
  Tensor x = c.base;
  std::vector<int64_t> order;
  DimVector target;
  std::vector<std::pair<int64_t, int64_t>> kept;
  for (const auto& [l, d] : c.levels) {
    if (has_level(o, l)) continue;
    kept.emplace_back(l, static_cast<int64_t>(order.size()));
    order.push_back(d);
    target.push_back(x.size(d));
  }
  std::vector<int64_t> c_logical;  // base dims of ct's logical dims
  for (int64_t d = 0; d < x.dim(); ++d) {
    bool batch = false;
    for (const auto& pl : c.levels) batch = batch || pl.second == d;
    if (!batch) c_logical.push_back(d);
  }
  size_t next_logical = 0;
  const int64_t base_rank = x.dim();
  int64_t appended = 0;
  for (int64_t j = 0; j < o.base.dim(); ++j) {
    int64_t level = -1;
    for (const auto& [l, d] : o.levels)
      if (d == j) level = l;
    target.push_back(o.base.size(j));
    int64_t cd;
    if (level < 0) {
      KILN_ASSERT(next_logical < c_logical.size(), "cotangent rank mismatch");
      order.push_back(c_logical[next_logical++]);
    } else if (has_level(c, level, &cd)) {
      order.push_back(cd);
    } else {
      order.push_back(base_rank + appended++);
    }
  }
  for (int64_t i = 0; i < appended; ++i) x = x.unsqueeze(-1);
  x = x.permute(order).expand(IntArrayRef(target));
  return from_physical(x, kept);
}

Tensor gradient_back(const Tensor& g, const Tensor& input) {
  if (!g.defined()) return g;
  PhysicalView gp = to_physical(g), ip = to_physical(input);
  std::vector<int64_t> g_logical;
  for (int64_t d = 0; d < gp.base.dim(); ++d) {
    bool batch = false;
    for (const auto& pl : gp.levels) batch = batch || pl.second == d;
    if (!batch) g_logical.push_back(d);
  }
  std::vector<std::pair<int64_t, int64_t>> levels = gp.levels;
  for (const auto& [l, d] : ip.levels) {
    KILN_CHECK(!has_level(gp, l), NotImplemented,
               "autograd::grad inside vmap: the gradient of an input batched at vmap level ", l,
               " came back batched at that level too");
    levels.emplace_back(l, g_logical[d]);
  }
  std::sort(levels.begin(), levels.end());
  return from_physical(gp.base, levels);
}

}  // namespace

bool any_batched(const variable_list& ts) {
  for (const Tensor& t : ts)
    if (is_batched(t)) return true;
  return false;
}

variable_list grad_of_batched(const variable_list& outputs, const variable_list& inputs,
                              const variable_list& grad_outputs, std::optional<bool> retain_graph,
                              bool create_graph, bool allow_unused) {
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), Runtime, "got ",
             grad_outputs.size(), " gradients for ", outputs.size(), " tensors");
  variable_list outs, ins, cts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i].check_defined("grad(): an output");
    Tensor ct = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!ct.defined()) {
      KILN_CHECK(o.numel() == 1, Runtime,
                 "grad can be implicitly created only for scalar outputs (got an output of shape ",
                 o.sizes(), ")");
      ct = kiln::ones_like(o);
    }
    KILN_CHECK(ct.sizes() == o.sizes(), Runtime, "Mismatch in shape: grad_output[", i,
               "] has a shape of ", ct.sizes(), " and output[", i, "] has a shape of ", o.sizes());
    outs.push_back(to_physical(o).base);
    cts.push_back(align_cotangent(ct, o));
  }
  for (const Tensor& t : inputs)
    ins.push_back(to_physical(t.check_defined("grad(): an input")).base);
  variable_list gs = grad(outs, ins, cts, retain_graph, create_graph, allow_unused);
  for (size_t i = 0; i < gs.size(); ++i) gs[i] = gradient_back(gs[i], inputs[i]);
  return gs;
}

}  // namespace kiln::autograd
