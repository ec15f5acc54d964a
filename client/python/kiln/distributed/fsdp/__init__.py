"""kiln.distributed.fsdp: fully_shard (torch.distributed.fsdp, FSDP2): each parameter becomes a
DTensor sharded Shard(0) over a 1-d mesh, gathered whole around the module's forward and backward,
its gradient reduce-scattered (averaged over the mesh: data parallel) onto the shard.

    from kiln.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))   # kiln run --nproc N
    for block in model.blocks:
        fully_shard(block, mesh=mesh)       # one group (one all-gather) per block
    fully_shard(model, mesh=mesh)           # the rest: embeddings, head
    opt = kiln.optim.SGD(model.parameters(), lr=0.1)            # steps on the shards
    loss_fn(model(x), y).backward()         # x: this rank's part of the batch
    opt.step()
    model.state_dict()                      # sharded DTensors, no communication

The gathering and reducing is C++'s (kiln::dist::FSDPParamGroup, kiln/dist/fsdp.h: Note [FSDP
flat all-gather], Note [FSDP resharding], Note [FSDP reshard to k ranks], Note [FSDP gradient
sync]); this module hooks it into the Python module system: fully_shard changes the module's class
to FSDP<Class> (a subclass of FSDPModule and the original class, as in PyTorch), whose __call__
puts the whole parameters into the module (and its submodules) for the forward and the shards
back after it.
"""
import operator
import warnings
from dataclasses import dataclass

import kiln.distributed.tensor  # noqa: F401  the DTensor methods (full_tensor, ...) of the shards
from kiln import _C
from kiln._C import Tensor
from kiln.nn.module import Module, in_plain_forward
from kiln.nn.parameter import Parameter

__all__ = ["fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy",
           "CPUOffloadPolicy"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """param_dtype: the dtype of the gathered parameters (forward and backward compute in it);
    reduce_dtype: the dtype gradients are reduce-scattered in (default: param_dtype);
    output_dtype: casts the module's floating outputs; cast_forward_inputs: casts its floating
    inputs to param_dtype. The shards, their gradients and optimizer states keep their dtype."""
    param_dtype: object = None
    reduce_dtype: object = None
    output_dtype: object = None
    cast_forward_inputs: bool = True


@dataclass(frozen=True)
class OffloadPolicy:
    """No offloading (the default)."""


@dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """Keeps the shards and optimizer states on the host (for CUDA). Not supported yet: Kiln's
    FSDP runs on CPU meshes, where everything is on the host already."""
    pin_memory: bool = True


_classes = {}  # original class -> FSDP<class>
_forward_depth = [0]  # FSDP forwards now running (the outermost one is the root's)


def _map_tensors(obj, fn):
    if isinstance(obj, Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map_tensors(o, fn) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


class _State:
    def __init__(self, group, sharded, slots, mesh, reshard_after_forward, mp_policy):
        self.group = group
        self.sharded = sharded  # the Parameter objects (identity matters to optimizers)
        self.slots = slots  # (owner module, parameter name), one per group parameter
        self.mesh = mesh
        self.reshard_after_forward = reshard_after_forward
        self.mp_policy = mp_policy

    def put(self, tensors):
        for (owner, name), t in zip(self.slots, tensors):
            owner._parameters[name] = t


class FSDPModule:
    """The methods fully_shard adds to a module (isinstance(m, FSDPModule) after fully_shard)."""

    def __call__(self, *args, **kwargs):
        if in_plain_forward():  # Note [Plain forward] (kiln/nn/module.py)
            return super().__call__(*args, **kwargs)
        st = self.__dict__["_fsdp_state"]
        mp = st.mp_policy
        root = _forward_depth[0] == 0
        if root:  # Note [FSDP prefetch] (kiln/dist/fsdp.h)
            _C._FSDPParamGroup.begin_root_forward()
        try:
            full = st.group.unshard()
        except BaseException:
            if root:
                _C._FSDPParamGroup.end_root_forward()
            raise
        st.put(full)
        _forward_depth[0] += 1
        try:
            if mp.param_dtype is not None and mp.cast_forward_inputs:
                def cast(t):
                    return t.to(mp.param_dtype) if t.dtype.is_floating_point else t
                args, kwargs = _map_tensors(args, cast), _map_tensors(kwargs, cast)
            out = super().__call__(*args, **kwargs)
            if mp.output_dtype is not None:
                out = _map_tensors(out, lambda t: t.to(mp.output_dtype)
                                   if t.dtype.is_floating_point else t)
        except BaseException:
            st.put(st.sharded)
            st.group.reshard()
            raise
        finally:
            _forward_depth[0] -= 1
            if root:
                _C._FSDPParamGroup.end_root_forward()
        st.put(st.sharded)
        outs = []
        _map_tensors(out, lambda t: outs.append(t) if t.requires_grad else None)
        if not outs:  # no backward will come: nothing needs the whole parameters
            st.group.reshard()
        elif st.reshard_after_forward and not root:
            # The root keeps its parameters: backward needs them first (as in PyTorch).
            st.group.post_forward_reshard()  # frees them, or keeps 1/k (an int k)
            st.group.register_pre_backward_hooks(outs)  # gathers them again for backward
        return out

    def _fsdp_modules(self, recurse):
        mods = self.modules() if recurse else [self]
        return [m for m in mods if isinstance(m, FSDPModule)]

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        """False: backward only accumulates whole gradients on each rank (no communication, the
        shards get no .grad); the next backward with True reduces the sum (gradient
        accumulation)."""
        for m in self._fsdp_modules(recurse):
            m.__dict__["_fsdp_state"].group.requires_gradient_sync = bool(requires_gradient_sync)

    def set_reshard_after_forward(self, reshard_after_forward, *, recurse=True):
        """True, False or an int k (see fully_shard). Collective for an int: call it on every
        rank, in the same order."""
        for m in self._fsdp_modules(recurse):
            st = m.__dict__["_fsdp_state"]
            st.reshard_after_forward = _set_reshard(st.group, st.mesh, reshard_after_forward)

    def to_empty(self, *, device="cpu", recurse=True):
        """Meta-device init: gives every shard still on the meta device (a model built with
        device="meta", then fully_shard-ed) memory on the mesh's device, `device` (uninitialised
        on "cpu"; zeros on each worker of a gang's "remote:N"), only this rank's shard of each
        parameter, and buffers on meta uninitialised tensors there (on a gang, each worker's may
        differ). Initialise the shards afterwards (kiln.nn.init functions on the DTensor
        parameters, or copy into p.to_local())."""
        device = str(device)
        for m in self._fsdp_modules(recurse):
            mesh_device = m.__dict__["_fsdp_state"].mesh.device_type
            if device != mesh_device:
                raise NotImplementedError(f"FSDPModule.to_empty: the shards live on the mesh's "
                                          f"device, {mesh_device!r}; got device={device!r}")
        for m in self._fsdp_modules(recurse):
            st = m.__dict__["_fsdp_state"]
            st.group.materialize()
            st.sharded = list(st.group.sharded_params)
            for s in st.sharded:
                s.__class__ = Parameter
            st.put(st.sharded)
        for m in self.modules():
            for name, b in m._buffers.items():
                if b is not None and str(b.device) == "meta":
                    m._buffers[name] = _C.empty(list(b.shape), dtype=b.dtype, device=device)
        return self

    def unshard(self):
        """Gathers the whole parameters into the module (outside forward; no autograd link)."""
        st = self.__dict__["_fsdp_state"]
        from kiln.autograd.grad_mode import no_grad
        with no_grad():
            st.put(st.group.unshard())

    def reshard(self):
        """Puts the shards back and frees the whole parameters."""
        st = self.__dict__["_fsdp_state"]
        st.put(st.sharded)
        st.group.reshard()


def _set_reshard(group, mesh, value):
    """Checks reshard_after_forward, gives it to the group (which checks that an int divides the
    mesh size) and returns it as the module keeps it: a bool, or an int k with 1 < k < N."""
    if not isinstance(value, bool):
        try:
            value = operator.index(value)  # an int (numpy's too), not a float
        except TypeError:
            raise TypeError(f"fully_shard: reshard_after_forward must be a bool or an int (the "
                            f"size of the groups to reshard to after forward, a divisor of the "
                            f"mesh size {mesh.size()}), got {type(value).__name__} "
                            f"{value!r}") from None
        if value == 1:
            warnings.warn("fully_shard: reshard_after_forward=1 (an int) keeps the whole "
                          "parameters after forward, as reshard_after_forward=False does; "
                          "pass True to free them", stacklevel=3)
    group.set_reshard_after_forward(value)
    k = group.reshard_after_forward_size
    if isinstance(value, bool) or k in (1, mesh.size()):
        return k != 1
    return k


def _fsdp_class(cls):
    if cls not in _classes:
        _classes[cls] = type("FSDP" + cls.__name__, (FSDPModule, cls), {})
    return _classes[cls]


def _default_mesh():
    import os
    from kiln.distributed import get_world_size, is_initialized
    from kiln.distributed.device_mesh import init_device_mesh
    n = get_world_size() if is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    return init_device_mesh("cpu", (n,))


def _collect_params(m, prefix, seen, slots, params, names):
    """Appends m's parameters, and its submodules' outside other FSDP modules, to slots (owner,
    name), params and names. A module-level function: a self-recursive closure is a reference
    cycle, which kept the unsharded parameters alive after fully_shard until the next collection."""
    for name, p in m._parameters.items():
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        slots.append((m, name))
        params.append(p)
        names.append(prefix + name)
    for name, child in m._modules.items():
        if child is not None and not isinstance(child, FSDPModule):
            _collect_params(child, prefix + name + ".", seen, slots, params, names)


def fully_shard(module, mesh=None, *, reshard_after_forward=True, mp_policy=MixedPrecisionPolicy(),
                offload_policy=OffloadPolicy()):
    """Shards `module`'s parameters (those not already managed by a fully_shard call on a
    submodule) Shard(0) over `mesh` (default: a 1-d mesh over the world) and returns the module,
    now an FSDPModule. Each parameter's rows are split as torch.chunk splits them (uneven shards
    are fine); the module's parameters() and state_dict() then give DTensors.

    reshard_after_forward: free the gathered parameters after forward and gather them again for
    backward (saves memory; the root module always keeps them, backward needs them first). An int
    k (a divisor of the mesh size N, as in PyTorch) keeps 1/k of each parameter, sharded over
    groups of k consecutive ranks, so that backward gathers over k ranks only (e.g. within a
    node); k == N is True, k == 1 False. Collective like the rest of fully_shard."""
    from kiln.distributed.device_mesh import DeviceMesh
    if not isinstance(module, Module):
        raise TypeError(f"fully_shard: expected a kiln.nn.Module, got {type(module).__name__}")
    if isinstance(module, FSDPModule):
        raise ValueError(f"fully_shard: this {type(module).__name__} is already fully sharded")
    if mesh is None:
        mesh = _default_mesh()
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"fully_shard: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if mesh.ndim != 1:
        raise ValueError(f"fully_shard: the mesh must be 1-d (FSDP shards over one mesh dim; pass "
                         f"mesh['dp'] of a larger mesh), got {mesh}")
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError("fully_shard: mp_policy must be a MixedPrecisionPolicy")
    if isinstance(offload_policy, CPUOffloadPolicy):
        raise NotImplementedError("fully_shard: CPUOffloadPolicy is not supported yet (Kiln's FSDP "
                                  "runs on CPU meshes, whose shards are on the host already)")
    # The parameters this call manages: not inside a submodule fully_shard already took.
    slots, params, names = [], [], []
    _collect_params(module, "", set(), slots, params, names)
    group = _C._FSDPParamGroup.create(params, mesh._c, mp_policy.param_dtype,
                                      mp_policy.reduce_dtype, names)
    reshard_after_forward = _set_reshard(group, mesh, reshard_after_forward)
    sharded = list(group.sharded_params)
    for (owner, name), s in zip(slots, sharded):
        s.__class__ = Parameter  # the group's own DTensor: its .grad is where backward writes
        owner._parameters[name] = s
    module.__dict__["_fsdp_state"] = _State(group, sharded, slots, mesh, reshard_after_forward, mp_policy)
    module.__class__ = _fsdp_class(type(module))
    return module
