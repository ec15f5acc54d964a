"""parallelize_module (torch.distributed.tensor.parallel.parallelize_module)."""
from fnmatch import fnmatch

from kiln.distributed.device_mesh import DeviceMesh
from kiln.distributed.tensor.parallel.style import ParallelStyle
from kiln.nn.module import Module

__all__ = ["parallelize_module"]


def _targets(module, path, where=""):
    """The (dotted name, submodule) pairs that the dotted `path` names under `module`; its parts
    may hold fnmatch wildcards ("layers.*.mlp"). `where` is the path walked so far."""
    atom, _, rest = path.partition(".")
    if atom == "":
        raise ValueError(f"parallelize_module: the plan key {where + path!r} has an empty part")
    matched = [(name, m) for name, m in module.named_children() if fnmatch(name, atom)]
    if not matched:
        kids = [name for name, _ in module.named_children()]
        raise ValueError(f"parallelize_module: the plan names a missing submodule: "
                         f"{type(module).__name__} at {where.rstrip('.') or '<root>'!r} has no "
                         f"child matching {atom!r} (its children: {kids})")
    out = []
    for name, child in matched:
        if rest:
            out += _targets(child, rest, where + name + ".")
        else:
            out.append((where + name, child))
    return out


def _apply_style(module, mesh, style, where, check_only=False):
    try:
        style._check_module(module)
        if not check_only:
            style._apply(module, mesh)
    except (NotImplementedError, ValueError, TypeError) as e:
        raise type(e)(f"parallelize_module: {type(style).__name__} on {where!r}: {e}") from None


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *, src_data_rank=0):
    """Parallelizes `module` in place by `parallelize_plan`, and returns it: a ParallelStyle
    applies to the module itself; a dict maps dotted submodule names (fnmatch wildcards allowed
    in each part) to styles. Each style shards the parameters it covers into DTensors and hooks
    the module's inputs and outputs (Note [Tensor parallel styles]). `device_mesh` is a 1-d
    DeviceMesh (the tensor-parallel dim of a larger mesh: mesh["tp"]). With src_data_rank set
    (0, the default), the parameters are taken from that mesh rank; None uses each rank's own
    values (which must then agree)."""
    if not isinstance(module, Module):
        raise TypeError(f"parallelize_module: expected a kiln.nn.Module, got "
                        f"{type(module).__name__}")
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError("parallelize_module: device_mesh must be a DeviceMesh (init_device_mesh), "
                        f"got {type(device_mesh).__name__}")
    if device_mesh.ndim != 1:
        raise ValueError(f"parallelize_module: expected a 1-d DeviceMesh, got one of shape "
                         f"{device_mesh.shape}; pass the tensor-parallel dim (mesh['tp'])")
    if src_data_rank is not None and not 0 <= src_data_rank < device_mesh.size():
        raise ValueError(f"parallelize_module: src_data_rank {src_data_rank} is not a rank of a "
                         f"mesh of size {device_mesh.size()}")
    if parallelize_plan is None:
        return module

    def with_source(style):
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: expected a ParallelStyle in the plan, got "
                            f"{type(style).__name__}")
        style.src_data_rank = src_data_rank
        return style

    if isinstance(parallelize_plan, ParallelStyle):
        _apply_style(module, device_mesh, with_source(parallelize_plan), "<root>")
        return module
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict "
                        f"of them, got {type(parallelize_plan).__name__}")
    for path, style in parallelize_plan.items():
        if not isinstance(path, str):
            raise TypeError(f"parallelize_module: plan keys are dotted module names, got "
                            f"{type(path).__name__}")
        with_source(style)
    # Resolve every key before changing anything, so a bad key leaves the module as it was.
    work = [(name, sub, style) for path, style in parallelize_plan.items()
            for name, sub in _targets(module, path)]
    for name, sub, style in work:
        _apply_style(sub, device_mesh, style, name, check_only=True)
    for name, sub, style in work:
        _apply_style(sub, device_mesh, style, name)
    return module
