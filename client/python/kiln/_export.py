"""kiln.export: a function or module exported for inference as one self-contained file (the
TorchScript / torch.export role), which kiln.load_program, kiln::ExportedProgram (C++) and the
kiln-run-program binary load and run with no Python code of the exporter.

    model = kiln.nn.Sequential(kiln.nn.Linear(32, 64), kiln.nn.ReLU(), kiln.nn.Linear(64, 10))
    model.eval()
    batch = kiln.Dim("batch", max=1024)
    prog = kiln.export(model, (kiln.randn(4, 32),), "mlp.kprog", dynamic_shapes=({0: batch},))
    prog = kiln.load_program("mlp.kprog")     # refused here if altered or needs missing ops
    y = prog(kiln.randn(9, 32))               # any batch size in [1, 1024]
    print(prog.describe())                    # inputs, outputs, symbols, weights, ops

The file holds the captured graph (protobuf) and the weights (safetensors: a module's parameters
and buffers by their state_dict names), no code. The function runs several times under no_grad to
capture it: once at the examples' sizes and once more per dynamic dim and pair of dims, so the
integers that follow the dims (sizes, reshape targets, arange ends) stay symbolic (Note [Symbolic
dims by differences] in client/export/include/kiln/exported_program.h). Call eval() first: a
program that writes into its weights (BatchNorm in training mode) is refused, as are random ops.

dynamic_shapes, as torch.export takes it: one entry per example argument (a tuple or list), or a
dict by the function's parameter names; each entry None (all static) or {dim: Dim or name}.
"""
import inspect
import os

from kiln import _C
from kiln.autograd.grad_mode import no_grad

__all__ = ["export", "load_program", "Dim", "ExportedProgram"]


class Dim:
    """A symbolic dimension named `name`, with sizes in [min, max] (max None: unbounded). Dims
    that share a name must have the same size."""

    def __init__(self, name, *, min=None, max=None):
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"kiln.Dim: the name must be an identifier, got {name!r}")
        self.name, self.min, self.max = name, 1 if min is None else int(min), max

    def __repr__(self):
        return f"Dim({self.name!r}, min={self.min}, max={self.max})"


class ExportedProgram:
    """An exported program, loaded: call it with one tensor per input (positional, or by the
    input names as keywords); it returns one tensor, or a tuple for several outputs."""

    def __init__(self, impl):
        self._impl = impl
        self._data = None

    @property
    def input_names(self):
        return [p[0] for p in self._impl.inputs]

    @property
    def output_names(self):
        return [p[0] for p in self._impl.outputs]

    @property
    def inputs(self):
        """[(name, dtype name, [dim, ...])], a dim as its size, its symbol or an expression."""
        return self._impl.inputs

    @property
    def outputs(self):
        return self._impl.outputs

    @property
    def weights(self):
        return self._impl.weights

    def describe(self):
        return self._impl.describe()

    def __call__(self, *args, **kwargs):
        names = self.input_names
        if kwargs:
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                raise TypeError(f"kiln.ExportedProgram: no input named {unknown[0]!r} "
                                f"(inputs: {', '.join(names)})")
            args = list(args) + [kwargs[n] for n in names[len(args):] if n in kwargs]
        if len(args) != len(names):
            raise TypeError(f"kiln.ExportedProgram: takes {len(names)} inputs "
                            f"({', '.join(names)}), got {len(args)}")
        out = self._impl.run(list(args))
        return out[0] if len(out) == 1 else tuple(out)

    def save(self, path):
        """Writes the program's file to `path` (through a temporary file renamed into place)."""
        if self._data is None:
            raise ValueError("kiln.ExportedProgram.save: the program holds no file bytes")
        _write_atomic(os.fspath(path), self._data)

    def __repr__(self):
        return f"ExportedProgram(inputs={self.input_names}, outputs={self.output_names})"


def _write_atomic(path, data):
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_program(path):
    """The exported program in `path` (ValueError naming what is wrong with the file)."""
    prog = ExportedProgram(_C._ExportedProgram.load(os.fspath(path)))
    with open(path, "rb") as f:
        prog._data = f.read()
    return prog


def _parameter_names(fn, n):
    target = fn.forward if hasattr(fn, "forward") and not inspect.isfunction(fn) else fn
    try:
        params = [p for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n]]
    return names + [f"input{i}" for i in range(len(names), n)]


def _dynamic(dynamic_shapes, names, args):
    """[(input, dim, name, min, max)] from torch.export-style dynamic_shapes."""
    if dynamic_shapes is None:
        return []
    if isinstance(dynamic_shapes, dict):
        unknown = sorted(set(dynamic_shapes) - set(names))
        if unknown:
            raise ValueError(f"kiln.export: dynamic_shapes names {unknown[0]!r}, which is not an "
                             f"input (inputs: {', '.join(names)})")
        per_input = [dynamic_shapes.get(n) for n in names]
    elif isinstance(dynamic_shapes, (tuple, list)):
        if len(dynamic_shapes) != len(args):
            raise ValueError(f"kiln.export: dynamic_shapes has {len(dynamic_shapes)} entries for "
                             f"{len(args)} inputs")
        per_input = list(dynamic_shapes)
    else:
        raise TypeError("kiln.export: dynamic_shapes must be a tuple or list (one entry per "
                        "input) or a dict by input name")
    out = []
    for i, spec in enumerate(per_input):
        if spec is None:
            continue
        if not isinstance(spec, dict):
            raise TypeError(f"kiln.export: dynamic_shapes for input '{names[i]}' must be None or "
                            f"a dict {{dim: Dim or name}}, got {type(spec).__name__}")
        for dim, d in spec.items():
            if isinstance(d, str):
                d = Dim(d)
            if not isinstance(d, Dim) or isinstance(dim, bool) or not isinstance(dim, int):
                raise TypeError(f"kiln.export: dynamic_shapes for input '{names[i]}' maps dims "
                                f"(int) to Dim or a name, got {dim!r}: {d!r}")
            out.append((i, dim, d.name, d.min, 0 if d.max is None else int(d.max)))
    return out


def export(fn, args, path=None, *, dynamic_shapes=None, input_names=None, output_names=None):
    """Exports `fn` (a module or a function of tensors returning a tensor or a tuple/list of
    them) at the example tensors `args`, with `dynamic_shapes` (module docstring); writes `path`
    when given. Returns the ExportedProgram. Input names default to fn's parameter names,
    output names to output0, output1, ..."""
    if isinstance(args, _C.Tensor):
        args = (args,)
    args = list(args)
    for i, a in enumerate(args):
        if not isinstance(a, _C.Tensor):
            raise TypeError(f"kiln.export: example argument {i} is a {type(a).__name__}; every "
                            f"example argument must be a Tensor")
    names = list(input_names) if input_names is not None else _parameter_names(fn, len(args))
    weight_names, weight_tensors = [], []
    if hasattr(fn, "named_parameters") and hasattr(fn, "named_buffers"):
        for name, t in list(fn.named_parameters()) + list(fn.named_buffers()):
            weight_names.append(name)
            weight_tensors.append(t)

    def run(xs):
        out = fn(*xs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for k, o in enumerate(outs):
            if not isinstance(o, _C.Tensor):
                raise TypeError(f"kiln.export: output {k} is a {type(o).__name__}; an exported "
                                f"function returns a tensor or a tuple of tensors")
        return outs

    with no_grad():
        data = _C._export_program(run, args, names, list(output_names or []),
                                  _dynamic(dynamic_shapes, names, args), weight_names,
                                  weight_tensors)
    if path is not None:
        path = os.fspath(path)
        _write_atomic(path, data)
    prog = ExportedProgram(_C._ExportedProgram.from_bytes(data, os.fspath(path) if path else
                                                           "<exported program>"))
    prog._data = data  # the file's bytes (kiln.onnx reads the graph from them)
    return prog
