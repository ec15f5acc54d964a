"""The parallel styles of kiln.distributed.tensor.parallel (torch.distributed.tensor.parallel's
names and defaults). A style shards a module's parameters into DTensors and registers forward
hooks that convert its inputs and outputs (Note [Tensor parallel styles])."""
from kiln import _C
from kiln.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from kiln.nn.layers import Dropout, Embedding, LayerNorm, Linear, RMSNorm
from kiln.nn.parameter import Parameter

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
           "PrepareModuleInput", "PrepareModuleOutput"]

# Note [Tensor parallel styles]: a style does two things to a module.
#  - Parameters: each is replaced by a Parameter that is a DTensor with the style's placement
#    (distribute_tensor of the full value; with src_data_rank set, rank `src_data_rank` of the
#    mesh broadcasts the full value first, so every rank shards the same tensor).
#  - Inputs and outputs: a forward pre-hook makes each input a DTensor (DTensor.from_local with
#    the style's input layout, when it is a plain tensor) and redistributes it to the layout the
#    module's ops want; a forward hook redistributes the output to the style's output layout and,
#    with use_local_output, returns its local shard.
# The ops between the hooks are ordinary DTensor ops: their sharding rules make, for instance,
# a Colwise linear's output Shard(-1) and a Rowwise linear's Partial(sum), which the output hook
# all-reduces. An op without a rule yet takes the replicate path (Note [DTensor dispatch]): the
# values are the same, only slower, and the output hook still gives the style's layout.


class ParallelStyle:
    """The base of the styles: _apply(module, device_mesh) parallelizes `module` in place."""
    src_data_rank = 0

    def _check_module(self, module):
        """Raises NotImplementedError when the style does not support `module`'s type."""

    def _apply(self, module, device_mesh):
        raise NotImplementedError(f"{type(self).__name__} must define _apply")


def _is_tensor(x):
    return isinstance(x, _C.Tensor)


def _as_parameter(t, requires_grad):
    if requires_grad:
        t.requires_grad_()
    t.__class__ = Parameter  # See Parameter: the tensor itself becomes the Parameter
    return t


def _distribute_param(module, name, mesh, placement, src_data_rank):
    p = module._parameters.get(name)
    if p is None:
        return
    if isinstance(p, DTensor):
        raise ValueError(f"{type(module).__name__}.{name} is already a DTensor (placements "
                         f"{p.placements}); a module can be parallelized once")
    full = p.detach()
    # On a gang the one client's value is every worker's already (Note [Remote DTensor]).
    if src_data_rank is not None and not mesh.device_type.startswith("remote"):
        full = full.contiguous().clone()
        mesh.get_group().broadcast(full, src_data_rank).wait()
    module._parameters[name] = _as_parameter(distribute_tensor(full, mesh, [placement]),
                                             p.requires_grad)


def _to_dtensor(x, mesh, layout, what, global_shape=None):
    """x itself if a DTensor, else DTensor.from_local(x) with `layout`: global_shape(x) gives the
    global shape where known (uneven shards), else even shards are assumed."""
    if isinstance(x, DTensor):
        return x
    if not _is_tensor(x):
        raise TypeError(f"{what}: expected a kiln.Tensor or DTensor input, got {type(x).__name__}")
    shape = global_shape(x) if global_shape is not None else None
    return DTensor.from_local(x, mesh, [layout], shape=shape)


def _place(x, mesh, layout):
    if layout.is_shard() and layout.dim < 0:  # placements hold non-negative dims
        layout = Shard(layout.dim + x.ndim)
    return x if x.placements == (layout,) else x.redistribute(mesh, [layout])


def _check_mesh(style, mesh):
    if mesh.ndim != 1:
        raise ValueError(f"{style}: tensor parallel styles take a 1-d DeviceMesh, got one of shape "
                         f"{mesh.shape}; pass the tensor-parallel sub-mesh (mesh['tp'])")


class ColwiseParallel(ParallelStyle):
    """Shards nn.Linear by output features (weight and bias Shard(0)) and nn.Embedding by
    embedding dim (weight Shard(1)). Input: input_layouts (default Replicate()), redistributed
    to Replicate(); output: output_layouts (default Shard(-1)), its local shard if
    use_local_output."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self.input_layouts = (Replicate() if input_layouts is None else input_layouts,)
        self.output_layouts = (Shard(-1) if output_layouts is None else output_layouts,)
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = use_local_output

    def _check_module(self, module):
        if not isinstance(module, (Linear, Embedding)):
            raise NotImplementedError(f"{type(self).__name__} supports nn.Linear and nn.Embedding "
                                      f"only, got {type(module).__name__}")

    def _shard_params(self, module, mesh):
        """Shards the parameters; returns (the input's layout, the layout the module wants)."""
        if isinstance(module, Linear):
            _distribute_param(module, "weight", mesh, Shard(0), self.src_data_rank)
            _distribute_param(module, "bias", mesh, Shard(0), self.src_data_rank)
        else:
            _distribute_param(module, "weight", mesh, Shard(1), self.src_data_rank)
        return self.input_layouts[0], self.desired_input_layouts[0]

    def _global_input_shape(self, module, in_layout):
        """A function from a plain input to its global shape, where the module tells it."""
        return None

    def _apply(self, module, device_mesh):
        _check_mesh(type(self).__name__, device_mesh)
        self._check_module(module)
        in_layout, want = self._shard_params(module, device_mesh)
        what = f"{type(self).__name__}({type(module).__name__})"
        out_layout, local = self.output_layouts[0], self.use_local_output
        global_shape = self._global_input_shape(module, in_layout)

        def pre(mod, args):
            if not args:
                raise TypeError(f"{what}: the module was called without a positional input")
            x = _to_dtensor(args[0], device_mesh, in_layout, what, global_shape)
            x = _place(x, device_mesh, want)
            return (x,) + tuple(args[1:])

        def post(mod, args, out):
            if not isinstance(out, DTensor):
                raise TypeError(f"{what}: expected the module's output to be a DTensor, got "
                                f"{type(out).__name__}")
            out = _place(out, device_mesh, out_layout)
            return out.to_local() if local else out

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module

    def __repr__(self):
        return (f"{type(self).__name__}(input_layouts={self.input_layouts[0]}, "
                f"output_layouts={self.output_layouts[0]}, "
                f"use_local_output={self.use_local_output})")


class RowwiseParallel(ColwiseParallel):
    """Shards nn.Linear by input features (weight Shard(1), bias Replicate()) and nn.Embedding by
    rows (weight Shard(0), the vocabulary). Input: input_layouts (default Shard(-1); Replicate()
    for an Embedding's indices); output: the Partial(sum) result redistributed to
    output_layouts (default Replicate(): an all-reduce), its local shard if use_local_output."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        super().__init__(input_layouts=Shard(-1) if input_layouts is None else input_layouts,
                         output_layouts=Replicate() if output_layouts is None else output_layouts,
                         use_local_output=use_local_output)
        self.desired_input_layouts = (Shard(-1),)
        self._default_input = input_layouts is None

    def _shard_params(self, module, mesh):
        if isinstance(module, Linear):
            _distribute_param(module, "weight", mesh, Shard(1), self.src_data_rank)
            _distribute_param(module, "bias", mesh, Replicate(), self.src_data_rank)
            return self.input_layouts[0], Shard(-1)
        _distribute_param(module, "weight", mesh, Shard(0), self.src_data_rank)
        return (Replicate() if self._default_input else self.input_layouts[0]), Replicate()

    def _global_input_shape(self, module, in_layout):
        # A Linear's input sharded on its last dim has in_features there: uneven shards (the
        # output of a ColwiseParallel Linear with out_features not divisible by the mesh size)
        # need no communication to find the global shape.
        if not isinstance(module, Linear) or not in_layout.is_shard():
            return None

        def shape(x):
            if in_layout.dim not in (-1, x.ndim - 1):
                return None
            return tuple(x.shape[:-1]) + (module.in_features,)
        return shape


class SequenceParallel(ParallelStyle):
    """For modules that act on each position alone (LayerNorm, RMSNorm, Dropout): parameters are
    replicated, the input is sharded along sequence_dim (a plain tensor is taken as this rank's
    Shard(sequence_dim) piece), and the output is Shard(sequence_dim) (its local shard if
    use_local_output)."""

    _supported = (LayerNorm, RMSNorm, Dropout)

    def __init__(self, *, sequence_dim=1, use_local_output=False):
        self.sequence_dim = sequence_dim
        self.use_local_output = use_local_output

    def _check_module(self, module):
        if not isinstance(module, self._supported):
            raise NotImplementedError(
                f"SequenceParallel supports nn.LayerNorm, nn.RMSNorm and nn.Dropout (modules that "
                f"act on each position alone), got {type(module).__name__}")

    def _apply(self, module, device_mesh):
        _check_mesh(type(self).__name__, device_mesh)
        self._check_module(module)
        for name in list(module._parameters):
            _distribute_param(module, name, device_mesh, Replicate(), self.src_data_rank)
        layout = Shard(self.sequence_dim)
        what = f"SequenceParallel({type(module).__name__})"

        def pre(mod, args):
            if not args:
                raise TypeError(f"{what}: the module was called without a positional input")
            return (_to_dtensor(args[0], device_mesh, layout, what),) + tuple(args[1:])

        def post(mod, args, out):
            out = _place(out, device_mesh, layout)
            return out.to_local() if self.use_local_output else out

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module

    def __repr__(self):
        return (f"SequenceParallel(sequence_dim={self.sequence_dim}, "
                f"use_local_output={self.use_local_output})")


def _layouts(what, name, layouts):
    if layouts is None:
        return None
    one = isinstance(layouts, _C._Placement)
    layouts = (layouts,) if one else tuple(layouts)
    for p in layouts:
        if p is not None and not isinstance(p, _C._Placement):
            raise TypeError(f"{what}: {name} must hold placements or None, got "
                            f"{type(p).__name__}")
    return layouts


def _convert(what, mesh, x, layout, desired, use_local):
    if layout is None:
        return x
    if not _is_tensor(x):
        raise TypeError(f"{what}: a layout was given for an input that is not a tensor "
                        f"({type(x).__name__})")
    x = _to_dtensor(x, mesh, layout, what)
    if desired is not None:
        x = _place(x, mesh, desired)
    return x.to_local() if use_local else x


class PrepareModuleInput(ParallelStyle):
    """Converts a module's inputs: input i, when input_layouts[i] is not None, becomes a DTensor
    (from_local with that layout if it is a plain tensor) redistributed to
    desired_input_layouts[i]; its local shard if use_local_output. input_kwarg_layouts and
    desired_input_kwarg_layouts do the same for keyword inputs, by name."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts=None, desired_input_kwarg_layouts=None,
                 use_local_output=False):
        what = "PrepareModuleInput"
        self.input_layouts = _layouts(what, "input_layouts", input_layouts)
        self.desired_input_layouts = _layouts(what, "desired_input_layouts", desired_input_layouts)
        if (self.input_layouts is None) != (self.desired_input_layouts is None) or (
                self.input_layouts is not None
                and len(self.input_layouts) != len(self.desired_input_layouts)):
            raise ValueError(f"{what}: input_layouts and desired_input_layouts must have the same "
                             f"length, got {input_layouts} and {desired_input_layouts}")
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if set(self.input_kwarg_layouts) != set(self.desired_input_kwarg_layouts):
            raise ValueError(f"{what}: input_kwarg_layouts and desired_input_kwarg_layouts must "
                             f"name the same inputs, got {sorted(self.input_kwarg_layouts)} and "
                             f"{sorted(self.desired_input_kwarg_layouts)}")
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(type(self).__name__, device_mesh)
        what = f"PrepareModuleInput({type(module).__name__})"

        def pre(mod, args, kwargs):
            if self.input_layouts is not None:
                if len(args) != len(self.input_layouts):
                    raise ValueError(f"{what}: {len(self.input_layouts)} input layouts were given "
                                     f"but the module got {len(args)} positional inputs")
                args = tuple(_convert(what, device_mesh, x, lay, want, self.use_local_output)
                             for x, lay, want in zip(args, self.input_layouts,
                                                     self.desired_input_layouts))
            if self.input_kwarg_layouts:
                kwargs = dict(kwargs)
                for k, lay in self.input_kwarg_layouts.items():
                    if k in kwargs:
                        kwargs[k] = _convert(what, device_mesh, kwargs[k], lay,
                                             self.desired_input_kwarg_layouts[k],
                                             self.use_local_output)
            return args, kwargs

        module.register_forward_pre_hook(pre, with_kwargs=True)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Converts a module's outputs (one tensor, or a tuple): output i, when output_layouts[i] is
    not None, becomes a DTensor (from_local with that layout if it is a plain tensor)
    redistributed to desired_output_layouts[i]; its local shard if use_local_output."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output=True):
        what = "PrepareModuleOutput"
        self.output_layouts = _layouts(what, "output_layouts", output_layouts)
        self.desired_output_layouts = _layouts(what, "desired_output_layouts",
                                               desired_output_layouts)
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError(f"{what}: output_layouts and desired_output_layouts must have the "
                             f"same length, got {output_layouts} and {desired_output_layouts}")
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh):
        _check_mesh(type(self).__name__, device_mesh)
        what = f"PrepareModuleOutput({type(module).__name__})"

        def post(mod, args, out):
            one = not isinstance(out, tuple)
            outs = (out,) if one else out
            if len(outs) != len(self.output_layouts):
                raise ValueError(f"{what}: {len(self.output_layouts)} output layouts were given "
                                 f"but the module returned {len(outs)} outputs")
            outs = tuple(_convert(what, device_mesh, x, lay, want, self.use_local_output)
                         for x, lay, want in zip(outs, self.output_layouts,
                                                 self.desired_output_layouts))
            return outs[0] if one else outs

        module.register_forward_hook(post)
        return module
