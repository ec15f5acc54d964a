// DTensor (kiln/dist/dtensor.h): placements, the storage-less wrapper (Note [DTensor]),
// distribute_tensor, and from_local / to_local / redistribute as differentiable functions.
#include "kiln/dist/dtensor.h"

#include <sstream>

#include "kiln/autograd/function.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/dist/remote.h"
#include "kiln/kiln.h"

namespace kiln::dist {

std::string Placement::str() const {
  switch (kind) {
    case Kind::Shard:
      return "Shard(" + std::to_string(dim) + ")";
    case Kind::Replicate:
      return "Replicate()";
    case Kind::Partial:
      return std::string("Partial(") + reduce_op_name(reduce) + ")";
  }
  return "?";
}

Placement Partial(ReduceOp op) {
  KILN_CHECK(op != ReduceOp::Product, Value,
             "Partial: the reduce op must be sum, avg, max or min, got product");
  return {Placement::Kind::Partial, 0, op};
}

std::string placements_str(const Placements& p) {
  std::string s = "[";
  for (size_t i = 0; i < p.size(); ++i) s += (i ? ", " : "") + p[i].str();
  return s + "]";
}

std::string DTensorSpec::str() const {
  std::ostringstream os;
  os << "DTensorSpec(" << mesh.str() << ", " << placements_str(placements) << ", shape "
     << IntArrayRef(shape) << ")";
  return os.str();
}

std::pair<int64_t, int64_t> chunk_of(int64_t size, int64_t n, int64_t index) {
  const int64_t c = size / n + (size % n != 0);  // ceil, without overflow at INT64_MAX
  const int64_t off = std::min(index * c, size);
  return {off, std::min(c, size - off)};
}

namespace {

// The local shape at mesh coordinate `coord` (See Note [Placements]).
DimVector local_shape_at(IntArrayRef shape, const DeviceMesh& mesh, const Placements& placements,
                         const std::vector<int64_t>& coord) {
  DimVector s(shape);
  for (size_t i = 0; i < placements.size(); ++i)
    if (placements[i].is_shard()) {
      int64_t& n = s[placements[i].dim];
      n = chunk_of(n, mesh.size(static_cast<int64_t>(i)), coord[i]).second;
    }
  return s;
}

}  // namespace

DimVector local_shape(IntArrayRef shape, const DeviceMesh& mesh, const Placements& placements) {
  std::vector<int64_t> coord = mesh.coordinate();
  KILN_CHECK(!coord.empty(), Value, "DTensor: this rank is not in ", mesh.str());
  return local_shape_at(shape, mesh, placements, coord);
}

// ---- The wrapper -------------------------------------------------------------------------------

namespace {

struct DTensorHandle final : BackendHandle {
  Tensor local;
  DTensorSpec spec;
  mutable detail::ViewKind view = detail::ViewKind::None;  // set once, by the view op's kernel
  DTensorHandle(Tensor l, DTensorSpec s) : local(std::move(l)), spec(std::move(s)) {}
  intrusive_ptr<TensorImpl> detached(const TensorImpl&) const override {
    return detail::make_dtensor(local.detach(), spec).impl_ptr();
  }
  // Zeros placed as this DTensor (Partial as Replicate), contiguous.
  std::function<intrusive_ptr<TensorImpl>()> zeros_maker() const override {
    DTensorSpec s = spec;
    for (Placement& p : s.placements)
      if (p.is_partial()) p = Replicate();
    s.stride = contiguous_strides(IntArrayRef(s.shape));
    return [s, device = local.device()] {
      return detail::make_dtensor(detail::zeros_shard(s, device), s).impl_ptr();
    };
  }
  intrusive_ptr<TensorImpl> whole_value() const override {
    return detail::redistribute_local(local, spec, Placements(spec.placements.size(), Replicate()))
        .impl_ptr();
  }
};

const DTensorHandle* handle_of(const Tensor& t) {
  if (!t.defined() || !t.key_set().has(DispatchKey::DTensor)) return nullptr;
  return static_cast<const DTensorHandle*>(t.impl()->backend_handle());
}

const DTensorHandle& need_handle(const Tensor& t) {
  const DTensorHandle* h = handle_of(t);
  KILN_CHECK(h != nullptr, Value, "expected a DTensor, got a plain tensor");
  return *h;
}

}  // namespace

bool is_dtensor(const Tensor& t) { return handle_of(t) != nullptr; }

namespace {
detail::RemoteHooks g_remote_hooks;
}

void detail::set_remote_hooks(const RemoteHooks& hooks) { g_remote_hooks = hooks; }

const detail::RemoteHooks& detail::remote_hooks() {
  KILN_CHECK(g_remote_hooks.run_op != nullptr, Runtime,
             "remote DTensors need the client's Remote backend, which this program does not link");
  return g_remote_hooks;
}

Tensor detail::make_dtensor(Tensor local, DTensorSpec spec) {
  // Sized to the global geometry, which addresses nothing (Note [Data-less tensors]).
  int64_t extent = 1;
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    if (spec.shape[d] == 0) extent = 0;
    if (extent > 0) extent += (spec.shape[d] - 1) * spec.stride[d];
  }
  auto storage = Storage::create_dataless(extent * element_size(local.dtype()), local.device());
  auto impl = TensorImpl::make_trusted(std::move(storage), local.dtype(), IntArrayRef(spec.shape),
                                       IntArrayRef(spec.stride));
  impl->add_keys(DispatchKey::DTensor);
  spec.dtype = local.dtype();
  impl->set_backend_handle(std::make_shared<DTensorHandle>(std::move(local), std::move(spec)));
  return Tensor(std::move(impl));
}

const Tensor& detail::local_of(const Tensor& t) { return need_handle(t).local; }
const DTensorSpec& detail::spec_of(const Tensor& t) { return need_handle(t).spec; }
detail::ViewKind detail::view_kind(const Tensor& t) { return need_handle(t).view; }
void detail::set_view_kind(const Tensor& t, ViewKind kind) { need_handle(t).view = kind; }

Tensor detail::zeros_shard(const DTensorSpec& spec, Device device) {
  Placements p = spec.placements;
  for (Placement& pl : p)
    if (pl.is_partial()) pl = Replicate();
  if (device.type() != DeviceType::Remote)
    return zeros(local_shape(IntArrayRef(spec.shape), spec.mesh, p), spec.dtype, device);
  // A plain op that takes sizes would record rank 0's; a scalar expanded to the whole shape is
  // the same everywhere, and its redistribution leaves each worker its own piece.
  autograd::NoGradGuard no_grad;
  DTensorSpec whole = spec;
  whole.placements.assign(p.size(), Replicate());
  whole.stride = DimVector(spec.shape.size(), 0);
  Tensor z = zeros({}, spec.dtype, device).expand(IntArrayRef(spec.shape));
  return redistribute_local(z, whole, p).contiguous();
}

Placements detail::check_placements(const char* what, const DeviceMesh& mesh, Placements p,
                                    int64_t ndim) {
  KILN_CHECK(mesh.defined(), Value, what, ": the device mesh is undefined");
  KILN_CHECK(static_cast<int64_t>(p.size()) <= mesh.ndim(), Value, what, ": ", p.size(),
             " placements ", placements_str(p), " for a mesh of ", mesh.ndim(), " dims");
  p.resize(mesh.ndim(), Replicate());
  for (Placement& pl : p) {
    if (!pl.is_shard()) continue;
    KILN_CHECK(pl.dim >= -ndim && pl.dim < ndim, Index, what, ": placement ", pl.str(),
               " is out of range for a tensor of ", ndim, " dims");
    if (pl.dim < 0) pl.dim += ndim;
  }
  return p;
}

// ---- Differentiable entry points (Note [DTensor]: autograd records the DTensors) ---------------

namespace {

// Gradients of a DTensor flow back as Replicate where the forward was Partial: the gradient of
// a sum (or avg, max, min) of pieces with respect to the global value is the same everywhere.
Placements grad_placements(const Placements& p) {
  Placements g = p;
  for (Placement& pl : g)
    if (pl.is_partial()) pl = Replicate();
  return g;
}

Tensor redistribute_dtensor(const Tensor& t, const Placements& to) {
  const DTensorSpec& spec = detail::spec_of(t);
  if (spec.placements == to) return t;
  DTensorSpec out = spec;
  out.placements = to;
  return detail::make_dtensor(detail::redistribute_local(detail::local_of(t), spec, to),
                              std::move(out));
}

struct FromLocal : autograd::Function<FromLocal> {
  static Tensor forward(autograd::AutogradContext* ctx, Tensor local, DTensorSpec spec) {
    ctx->saved_data["placements"] = spec.placements;
    return detail::make_dtensor(local.detach(), std::move(spec));
  }
  static autograd::variable_list backward(autograd::AutogradContext* ctx,
                                          autograd::variable_list grads) {
    auto p = std::any_cast<Placements>(ctx->saved_data["placements"]);
    return {detail::local_of(redistribute_dtensor(grads[0], grad_placements(p)))};
  }
};

struct ToLocal : autograd::Function<ToLocal> {
  static Tensor forward(autograd::AutogradContext* ctx, Tensor t) {
    ctx->saved_data["spec"] = detail::spec_of(t);
    return detail::local_of(t).detach();
  }
  static autograd::variable_list backward(autograd::AutogradContext* ctx,
                                          autograd::variable_list grads) {
    auto spec = std::any_cast<DTensorSpec>(ctx->saved_data["spec"]);
    return {detail::make_dtensor(grads[0].contiguous(), std::move(spec))};
  }
};

struct Redistribute : autograd::Function<Redistribute> {
  static Tensor forward(autograd::AutogradContext* ctx, Tensor t, Placements to) {
    ctx->saved_data["placements"] = detail::spec_of(t).placements;
    Tensor out = redistribute_dtensor(t, to);
    // A new wrapper even when nothing moves, so the output has this node's history.
    return out.is_same(t) ? detail::make_dtensor(detail::local_of(t), detail::spec_of(t)) : out;
  }
  static autograd::variable_list backward(autograd::AutogradContext* ctx,
                                          autograd::variable_list grads) {
    auto p = std::any_cast<Placements>(ctx->saved_data["placements"]);
    return {redistribute_dtensor(grads[0], grad_placements(p))};
  }
};

}  // namespace

DTensor::DTensor(Tensor t) : Tensor(std::move(t)) {
  KILN_CHECK(is_dtensor(*this), Value, "DTensor: expected a DTensor, got a plain tensor of shape ",
             defined() ? sizes() : IntArrayRef());
}

const DTensorSpec& DTensor::spec() const { return detail::spec_of(*this); }

DTensor DTensor::from_local(const Tensor& local, const DeviceMesh& mesh, Placements placements,
                            std::optional<DimVector> shape, std::optional<DimVector> stride) {
  local.check_defined("DTensor.from_local: the local tensor");
  KILN_CHECK(!is_dtensor(local), Value, "DTensor.from_local: the local tensor is a DTensor");
  KILN_CHECK(mesh.defined(), Value, "DTensor.from_local: the device mesh is undefined");
  if (mesh.device_type().starts_with("remote") && local.device() != Device(mesh.device_type())) {
    // Every worker gets this one tensor: its shape must be every rank's (See Note [Remote
    // DTensor]); checked here, before a worker finds out alone and leaves the others waiting.
    if (shape) {
      Placements p = detail::check_placements("DTensor.from_local", mesh, placements, local.dim());
      std::vector<int64_t> coord(mesh.ndim(), 0);
      for (int64_t r = 0; r < mesh.size(); ++r) {
        for (int64_t d = mesh.ndim() - 1, q = r; d >= 0; --d) {
          coord[d] = q % mesh.size(d);
          q /= mesh.size(d);
        }
        DimVector want = local_shape_at(IntArrayRef(*shape), mesh, p, coord);
        KILN_CHECK(IntArrayRef(want) == local.sizes(), Value, "DTensor.from_local on ",
                   mesh.str(), ": the local tensor of shape ", local.sizes(),
                   " goes to every worker from this one process, but placements ",
                   placements_str(p), " of global shape ", IntArrayRef(*shape), " give rank ",
                   mesh.ranks()[r], " the shape ", IntArrayRef(want),
                   "; make uneven shards on the workers (distribute_tensor)");
      }
    }
    return from_local(local.to(std::nullopt, Device(mesh.device_type())), mesh,
                      std::move(placements), std::move(shape), std::move(stride));
  }
  placements =
      detail::check_placements("DTensor.from_local", mesh, std::move(placements), local.dim());
  DTensorSpec spec{mesh, placements, {}, {}, local.dtype()};
  if (shape) {
    KILN_CHECK(static_cast<int64_t>(shape->size()) == local.dim(), Value,
               "DTensor.from_local: global shape ", IntArrayRef(*shape), " and local shape ",
               local.sizes(), " differ in rank");
    spec.shape = *shape;
    DimVector expect = local_shape(IntArrayRef(spec.shape), mesh, placements);
    KILN_CHECK(IntArrayRef(expect) == local.sizes(), Value, "DTensor.from_local: rank ",
               default_group()->rank(), " holds a local shape ", local.sizes(), " but placements ",
               placements_str(placements), " of global shape ", IntArrayRef(spec.shape),
               " give it ", IntArrayRef(expect));
  } else {
    spec.shape = DimVector(local.sizes());
    for (size_t i = 0; i < placements.size(); ++i)
      if (placements[i].is_shard()) spec.shape[placements[i].dim] *= mesh.size(i);
  }
  spec.stride = stride ? *stride : contiguous_strides(IntArrayRef(spec.shape));
  KILN_CHECK(spec.stride.size() == spec.shape.size(), Value, "DTensor.from_local: stride ",
             IntArrayRef(spec.stride), " does not match shape ", IntArrayRef(spec.shape));
  return DTensor(FromLocal::apply(local, std::move(spec)));
}

Tensor DTensor::to_local() const { return ToLocal::apply(static_cast<const Tensor&>(*this)); }

Tensor DTensor::full_tensor() const {
  return redistribute(device_mesh(), Placements(device_mesh().ndim(), Replicate())).to_local();
}

DTensor DTensor::redistribute(const DeviceMesh& mesh, Placements placements) const {
  KILN_CHECK(mesh == device_mesh(), Value, "redistribute: the DTensor is on ", device_mesh().str(),
             ", not on ", mesh.str(), " (moving between meshes is not supported)");
  placements = detail::check_placements("redistribute", mesh, std::move(placements), dim());
  return DTensor(Redistribute::apply(static_cast<const Tensor&>(*this), std::move(placements)));
}

DTensor distribute_tensor(const Tensor& t, const DeviceMesh& mesh, Placements placements) {
  t.check_defined("distribute_tensor: the tensor");
  KILN_CHECK(!is_dtensor(t), Value, "distribute_tensor: the tensor is a DTensor already");
  KILN_CHECK(mesh.defined(), Value, "distribute_tensor: the device mesh is undefined");
  if (mesh.device_type().starts_with("remote") && t.device() != Device(mesh.device_type()))
    return distribute_tensor(t.to(std::nullopt, Device(mesh.device_type())), mesh,
                             std::move(placements));  // every worker gets all of `t`
  placements = detail::check_placements("distribute_tensor", mesh, std::move(placements), t.dim());
  DTensorSpec spec{mesh, Placements(mesh.ndim(), Replicate()), DimVector(t.sizes()),
                   contiguous_strides(t.sizes()), t.dtype()};
  // A replicated DTensor over `t`, redistributed to `placements` (pieces and partial values
  // come from Replicate without communication). The local is made contiguous, as the spec says:
  // a rule reads the spec's strides (a view of a transposed `t` must not view its storage).
  Tensor replicated = FromLocal::apply(t.contiguous(), spec);
  bool shard = false, partial = false;
  for (const Placement& p : placements) {
    shard = shard || p.is_shard();
    partial = partial || p.is_partial();
  }
  Tensor out = DTensor(replicated).redistribute(mesh, std::move(placements));
  // A Shard's piece is a narrow of `t`: copy it (clone keeps Shard and Replicate placements; it
  // would reduce a Partial, whose rank 0 keeps viewing `t`).
  return shard && !partial ? DTensor(out.clone()) : DTensor(out);
}

}  // namespace kiln::dist
