"""kiln.nn.Module: the base class of layers and models, subclassed in Python as torch.nn.Module.

    class Net(kiln.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = kiln.nn.Linear(4, 2)            # a submodule, by assignment
            self.scale = kiln.nn.Parameter(kiln.ones(2))
            self.register_buffer("count", kiln.zeros([]))
        def forward(self, x):
            return self.fc(x) * self.scale

Parameters, buffers and submodules live in the _parameters, _buffers and _modules dicts (in
assignment order) and are read back through __getattr__, as in PyTorch. Forward pre-hooks and
forward hooks (register_forward_pre_hook, register_forward_hook) run around forward when the
module is called; they may replace its inputs and output (kiln.distributed.tensor.parallel
converts tensors to and from DTensors with them)."""
import contextlib
import threading
from collections import OrderedDict, namedtuple

from kiln import _C
from kiln._C import Tensor
from kiln._tensor import _parse_to
from kiln.autograd.grad_mode import no_grad
from kiln.nn.parameter import Parameter

# Note [Plain forward]: a pipeline infers a stage's shapes by running its forward on meta tensors
# (See Note [Pipeline shapes] in kiln/dist/pipelining.h). A stage that is tensor parallel or
# fully sharded has hooks that communicate (TP's redistributions, FSDP's gathers in its
# __call__); with its parameters swapped for meta tensors of their global shapes, its forward
# must run as the plain module it was. Within plain_forward(), on this thread, modules skip
# their forward hooks and FSDP modules their gathering. A stage whose hooks change its output's
# shape (a sharded output handed on as its local piece) then differs from its real forward,
# which the runner reports as such rather than sending the wrong sizes.
_plain = threading.local()


@contextlib.contextmanager
def plain_forward():
    before = getattr(_plain, "on", False)
    _plain.on = True
    try:
        yield
    finally:
        _plain.on = before


def in_plain_forward():
    return getattr(_plain, "on", False)

_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class RemovableHandle:
    """What register_forward_(pre_)hook returns: remove() unregisters the hook."""
    _next_id = 0

    def __init__(self, hooks_dict):
        self._hooks = hooks_dict
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self):
        self._hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _addindent(s, n):
    lines = s.split("\n")
    return lines[0] + "".join("\n" + " " * n + line for line in lines[1:])


class Module:
    training: bool

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments (Module "
                            "takes none)")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        d["_forward_pre_hooks"] = {}  # id -> (hook, with_kwargs)
        d["_forward_hooks"] = {}

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  '"forward" function')

    def __call__(self, *args, **kwargs):
        d = self.__dict__
        if not d.get("_forward_pre_hooks") and not d.get("_forward_hooks") or in_plain_forward():
            return self.forward(*args, **kwargs)
        for hook, with_kwargs in list(d.get("_forward_pre_hooks", {}).values()):
            if with_kwargs:
                r = hook(self, args, kwargs)
                if r is not None:
                    if not (isinstance(r, tuple) and len(r) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of "
                                           f"(new_args, new_kwargs), but got {r}.")
                    args, kwargs = r
            else:
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
        out = self.forward(*args, **kwargs)
        for hook, with_kwargs in list(d.get("_forward_hooks", {}).values()):
            r = hook(self, args, kwargs, out) if with_kwargs else hook(self, args, out)
            if r is not None:
                out = r
        return out

    # ---- hooks -------------------------------------------------------------------------------
    def _add_hook(self, kind, hook, prepend, with_kwargs):
        if not callable(hook):
            raise TypeError(f"{kind[1:-1].replace('_', ' ')}: expected a callable hook, got "
                            f"{type(hook).__name__}")
        hooks = self.__dict__.setdefault(kind, {})
        handle = RemovableHandle(hooks)
        hooks[handle.id] = (hook, with_kwargs)
        if prepend:
            items = list(hooks.items())
            hooks.clear()
            hooks.update([items[-1]] + items[:-1])
        return handle

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """hook(module, args) -> None or new args (a tuple, or one value); with_kwargs:
        hook(module, args, kwargs) -> None or (new_args, new_kwargs). Runs before forward."""
        return self._add_hook("_forward_pre_hooks", hook, prepend, with_kwargs)

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False):
        """hook(module, args, output) -> None or a new output; with_kwargs:
        hook(module, args, kwargs, output). Runs after forward."""
        return self._add_hook("_forward_hooks", hook, prepend, with_kwargs)

    # ---- registration ----------------------------------------------------------------------
    def _check_name(self, name, kind):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
        if name == "" or "." in name:
            raise KeyError(f'{kind} name can\'t be empty or contain ".", got "{name}"')

    def register_parameter(self, name, param):
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(kiln.nn.Parameter or None required)")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(kiln.Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_module(self, name, module):
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._modules[name] = module

    add_module = register_module

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            d.pop(name, None)
            self._buffers.pop(name, None)
            self._modules.pop(name, None)
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            if params is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            d.pop(name, None)
            params.pop(name, None)
            self._buffers.pop(name, None)
            self._modules[name] = value
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(kiln.nn.Parameter or None expected)")
            params[name] = None
        elif params is not None and name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(kiln.nn.Module or None expected)")
            self._modules[name] = None
        elif params is not None and name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(kiln.Tensor or None expected)")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for kind in ("_parameters", "_buffers", "_modules"):
            members = d.get(kind)
            if members is not None and name in members:
                return members[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for members in (self._parameters, self._buffers, self._modules):
            if name in members:
                del members[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(self._parameters) | set(self._buffers)
                      | set(self._modules))

    def get_submodule(self, target):
        mod = self
        for item in target.split(".") if target else []:
            if item not in mod._modules:
                raise AttributeError(f"{type(mod).__name__} has no submodule `{item}`")
            mod = mod._modules[item]
        return mod

    def get_parameter(self, target):
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter `{name}`")
        return mod._parameters[name]

    # ---- iteration ---------------------------------------------------------------------------
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, prefix + ("." if prefix else "") + name,
                                           remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and m not in seen:
                seen.add(m)
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, kind, prefix, recurse, remove_duplicate=True):
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        seen = set()
        for mod_prefix, m in mods:
            for name, v in getattr(m, kind).items():
                if v is None or (remove_duplicate and id(v) in seen):
                    continue
                seen.add(id(v))
                yield mod_prefix + ("." if mod_prefix else "") + name, v

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ---- state -------------------------------------------------------------------------------
    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """Parameters and persistent buffers by dotted name (detached unless keep_vars)."""
        if destination is None:
            destination = OrderedDict()
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copies `state_dict`'s tensors into the parameters and persistent buffers (assign: the
        state dict's tensors replace them). Returns (missing_keys, unexpected_keys); with strict,
        raises RuntimeError naming them instead."""
        if not hasattr(state_dict, "items"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}")
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        for k, target in own.items():
            if k not in state_dict:
                continue
            src = state_dict[k]
            if not isinstance(src, Tensor):
                errors.append(f'While copying the parameter named "{k}", expected a Tensor, '
                              f"got {type(src).__name__}")
            elif tuple(src.shape) != tuple(target.shape):
                errors.append(f"size mismatch for {k}: copying a param with shape {tuple(src.shape)} "
                              f"from checkpoint, the shape in current model is {tuple(target.shape)}.")
            elif assign:
                mod_path, _, name = k.rpartition(".")
                mod = self.get_submodule(mod_path)
                if name in mod._parameters:
                    mod._parameters[name] = Parameter(src, target.requires_grad)
                else:
                    mod._buffers[name] = src
            else:
                with no_grad():
                    target.copy_(src)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: "
                              + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                               + "\n\t".join(errors))
        return _IncompatibleKeys(missing, unexpected)

    # ---- modes and transforms ----------------------------------------------------------------
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for m in self.modules():
            m.__dict__["training"] = mode
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                g = p.grad
                if g.grad_fn is not None:
                    g = g.detach()
                    p.grad = g
                g.zero_()

    def _apply(self, fn):
        """fn(tensor) -> tensor for every parameter and buffer; parameters keep their objects
        (their data is replaced), buffers are reassigned."""
        for m in self.modules():
            for p in m._parameters.values():
                if p is None:
                    continue
                new = fn(p)
                if new is not p:
                    g = p.grad
                    _C._set_data(p, new)
                    if g is not None:
                        p.grad = fn(g)
            for name, b in m._buffers.items():
                if b is not None:
                    m._buffers[name] = fn(b)
        return self

    def to(self, *args, **kwargs):
        """Moves and/or casts the parameters and buffers: to(device), to(dtype),
        to(device, dtype), to(tensor); only floating-point tensors change dtype."""
        dtype, device, _ = _parse_to(args, kwargs)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired "
                            f"dtype={dtype}")

        def convert(t):
            dt = dtype if dtype is not None and t.dtype.is_floating_point else None
            return _C.to(t, dt, device) if dt is not None or device is not None else t
        return self._apply(convert)

    def float(self):
        return self.to(_C.float32)

    def double(self):
        return self.to(_C.float64)

    def half(self):
        return self.to(_C.float16)

    def bfloat16(self):
        return self.to(_C.bfloat16)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else device)

    # ---- repr --------------------------------------------------------------------------------
    def extra_repr(self):
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        extra = self.extra_repr()
        lines = extra.split("\n") if extra else []
        for name, m in self._modules.items():
            lines.append(f"({name}): " + _addindent(repr(m), 2))
        main = self._get_name() + "("
        if lines:
            if len(lines) == 1 and not self._modules:
                main += lines[0]
            else:
                main += "\n  " + "\n  ".join(lines) + "\n"
        return main + ")"

