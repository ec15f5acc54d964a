"""kiln.onnx.export: an exported program (kiln.export) as an ONNX model (opset 17).

    prog = kiln.export(model, (x,), dynamic_shapes=({0: kiln.Dim("batch")},))
    kiln.onnx.export(prog, "model.onnx")       # or a .kprog file's path instead of prog

The program's graph (kiln._C._program_graph) maps op by op to ONNX nodes; weights become
initializers; symbolic dims become dim_params named as the symbols. A view/reshape whose sizes
depend on the symbols gets its shape computed in the graph (Shape, Gather and integer arithmetic
from the polynomial the export recorded). The model is built in memory first, and every
refusal on the way (an op with no mapping, a transposed convolution, attention with dropout,
max-pool indices that are used, ...) is collected: NotImplementedError names all of them at once
and no file is written. The file is written to a temporary name and renamed into place. Needs
the `onnx` package.
"""
import os

import numpy as np

from . import _C
from ._export import ExportedProgram, load_program

OPSET = 17

_NP = {"float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32,
       "bool": np.bool_, "float16": np.float16}

SUPPORTED = {"view", "reshape", "_unsafe_view", "t", "addmm", "mm", "gelu", "relu", "add", "sub",
             "mul", "div", "rsqrt", "convolution", "max_pool2d_with_indices", "tanh", "exp",
             "sigmoid", "neg", "sqrt", "embedding", "arange", "_layer_norm", "split", "transpose",
             "_fused_attention", "empty", "copy_", "slice", "sum"}


def _graph(prog):
    if not isinstance(prog, ExportedProgram):
        prog = load_program(prog)
    if prog._data is None:
        raise ValueError("kiln.onnx.export: the program holds no file bytes")
    return prog, _C._program_graph(prog._data)


class _Builder:
    def __init__(self, onnx, g):
        self.onnx, self.h = onnx, onnx.helper
        self.nodes, self.inits = [], []
        self.g = g
        self.names = [d[0] for d in g["dims"]]
        self.count = 0
        # symbolic integers by (node, arg, element); element -1 for a single int
        self.sym = {}
        for path, const, terms in g["symbolic"]:
            if len(path) >= 6 and path[:2] == [1, -1] and path[2] == 3 and path[4] == 3:
                n, a = path[3], path[5]
                elem = path[-1] if path[-4:-2] == [5, -1] else -1
                self.sym[(n, a, elem)] = (const, terms)
        self.dim_values = {}

    def fresh(self, base="t"):
        self.count += 1
        return f"{base}_{self.count}"

    def node(self, op, inputs, outputs=None, **attrs):
        outputs = outputs or [self.fresh(op.lower())]
        self.nodes.append(self.h.make_node(op, inputs, outputs, **attrs))
        return outputs[0]

    def const(self, array, base="c"):
        name = self.fresh(base)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def symbol(self, k):
        """A 1-element int64 tensor holding symbol k, read from its input's shape."""
        if k not in self.dim_values:
            _, inp, dim, *_ = self.g["dims"][k]
            src = f"v{self.g['inputs'][inp][0]}"
            shape = self.node("Shape", [src])
            self.dim_values[k] = self.node("Gather", [shape, self.const(np.array([dim], np.int64))],
                                           axis=0)
        return self.dim_values[k]

    def poly(self, const, terms):
        acc = self.const(np.array([const], np.int64)) if const or not terms else None
        for coef, syms in terms:
            t = self.symbol(syms[0])
            for s in syms[1:]:
                t = self.node("Mul", [t, self.symbol(s)])
            if coef != 1:
                t = self.node("Mul", [t, self.const(np.array([coef], np.int64))])
            acc = t if acc is None else self.node("Add", [acc, t])
        return acc

    def shape(self, n, a, sizes):
        """A shape input for node n's int-list argument a."""
        if not any((n, a, i) in self.sym for i in range(len(sizes))):
            return self.const(np.array(sizes, np.int64), "shape")
        parts = [self.poly(*self.sym[(n, a, i)]) if (n, a, i) in self.sym
                 else self.const(np.array([v], np.int64)) for i, v in enumerate(sizes)]
        return self.node("Concat", parts, axis=0)


def _scalar(arg, dtype):
    return np.array(arg[2], _NP.get(dtype, np.float32))


def export(program, path):
    """Writes `program` (a kiln.ExportedProgram or the path of a .kprog file) to `path` as an
    ONNX model; returns the onnx.ModelProto. NotImplementedError naming every op with no ONNX
    mapping and every other refusal, before anything is written."""
    import onnx

    prog, g = _graph(program)
    missing = sorted({n[0] for n in g["nodes"] if n[0] not in SUPPORTED})
    problems = []  # every refusal, found while the model is built in memory
    if missing:
        problems.append("no ONNX mapping for the ops " + ", ".join(repr(m) for m in missing))
    b = _Builder(onnx, g)
    dtype = {}
    rank = {}
    empty_shape = {}  # an `empty` value: its shape tensor (copy_ into it is an Expand)
    sym_input = {}
    for path_, const, terms in g["symbolic"]:  # graph input specs: [1,-1, 2,i, 2,d]
        if path_[:3] == [1, -1, 2] and len(path_) == 6 and path_[4] == 2:
            sym_input[(path_[3], path_[5])] = (const, terms)
    graph_inputs = []
    weights = prog.weights
    for i, (vid, kind, name, dt, sizes, number, strides, offset, wrapped) in enumerate(
            g["inputs"]):
        v = f"v{vid}"
        dtype[vid] = dt
        rank[vid] = len(sizes)
        if kind == "argument":
            dims = []
            for d, s in enumerate(sizes):
                if (i, d) in sym_input:
                    const, terms = sym_input[(i, d)]
                    if const == 0 and len(terms) == 1 and terms[0][0] == 1 and len(terms[0][1]) == 1:
                        dims.append(b.names[terms[0][1][0]])
                    else:
                        dims.append(None)
                else:
                    dims.append(s)
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(_NP[dt]))
            graph_inputs.append(onnx.helper.make_tensor_value_info(name, elem, dims))
            b.node("Identity", [name], [v])
        elif kind == "weight":
            arr = weights[name].numpy()
            if list(arr.shape) != list(sizes) or offset:  # stored as its whole storage, flat
                arr = np.lib.stride_tricks.as_strided(
                    arr[offset:], sizes, [st * arr.itemsize for st in strides])
            b.inits.append(onnx.numpy_helper.from_array(np.ascontiguousarray(arr), v))
        else:  # a number the graph holds; a wrapped Python float takes part as float32
            if wrapped and dt == "float64":
                dt = "float32"
            dtype[vid] = dt
            b.inits.append(onnx.numpy_helper.from_array(np.array(number, _NP[dt]), v))

    for n, (op, args, outs) in enumerate(g["nodes"]):
        if op not in SUPPORTED:
            continue
        x = [f"v{a[1]}" if a[0] == "value" else None for a in args]
        out = f"v{outs[0]}"
        dt = dtype.get(args[0][1], "float32") if args and args[0][0] == "value" else "float32"
        for o in outs:
            dtype[o] = dt
        ranks = [rank.get(a[1], 0) for a in args if a[0] == "value"]
        r = max(ranks) if ranks else 0
        if op in ("view", "reshape", "_unsafe_view", "empty"):
            r = len(args[1 if op != "empty" else 0][2])
        elif op in ("t", "addmm", "mm"):
            r = 2
        elif op == "slice":
            none = {2: 0, 3: np.iinfo(np.int64).max, 4: 1}  # start, end, step left out
            ends = [b.poly(*b.sym[(n, a, -1)]) if (n, a, -1) in b.sym
                    else b.const(np.array([none[a] if args[a][2] is None else args[a][2]],
                                          np.int64)) for a in (2, 3, 1, 4)]
            b.node("Slice", [x[0]] + ends, [out])
        elif op == "sum":
            dims, keep, sdt = args[1][2], args[2][2], args[3][2]
            if sdt is not None and sdt != dt:
                problems.append("sum with a dtype")
                continue
            if r == 0 or dims is None or list(dims) == []:
                r = 0 if not keep else r
                b.node("ReduceSum", [x[0]], [out], keepdims=int(bool(keep)))
            else:
                b.node("ReduceSum", [x[0], b.const(np.array(dims, np.int64))], [out],
                       keepdims=int(bool(keep)))
                if not keep:
                    r -= len(dims)
            rank[outs[0]] = r
        elif op == "embedding":
            r = rank[args[1][1]] + 1
        elif op == "arange":
            r = 1
        for o in outs:
            rank[o] = r
        if op in ("view", "reshape", "_unsafe_view"):
            b.node("Reshape", [x[0], b.shape(n, 1, args[1][2])], [out])
        elif op == "t":
            b.node("Transpose", [x[0]], [out], perm=[1, 0])
        elif op == "mm":
            b.node("MatMul", [x[0], x[1]], [out])
        elif op == "addmm":
            beta, alpha = args[3][2], args[4][2]
            if beta != 1 or alpha != 1:
                b.node("Gemm", [x[1], x[2], x[0]], [out], alpha=float(alpha), beta=float(beta))
            else:
                b.node("Add", [b.node("MatMul", [x[1], x[2]]), x[0]], [out])
        elif op == "gelu":
            if args[1][2] == "tanh":
                c = lambda v: b.const(np.array(v, _NP[dt]))
                inner = b.node("Mul", [b.node("Add", [x[0], b.node("Mul", [
                    c(0.044715), b.node("Mul", [x[0], b.node("Mul", [x[0], x[0]])])])]),
                    c(np.sqrt(2 / np.pi))])
                half = b.node("Mul", [x[0], c(0.5)])
                b.node("Mul", [half, b.node("Add", [c(1.0), b.node("Tanh", [inner])])], [out])
            else:
                c = lambda v: b.const(np.array(v, _NP[dt]))
                erf = b.node("Erf", [b.node("Div", [x[0], c(np.sqrt(2.0))])])
                b.node("Mul", [b.node("Mul", [x[0], c(0.5)]), b.node("Add", [erf, c(1.0)])], [out])
        elif op in ("relu", "tanh", "exp", "sigmoid", "neg", "sqrt"):
            b.node({"relu": "Relu", "tanh": "Tanh", "exp": "Exp", "sigmoid": "Sigmoid",
                    "neg": "Neg", "sqrt": "Sqrt"}[op], [x[0]], [out])
        elif op == "rsqrt":
            b.node("Reciprocal", [b.node("Sqrt", [x[0]])], [out])
        elif op in ("add", "sub", "mul", "div"):
            other = x[1] if x[1] is not None else b.const(_scalar(args[1], dt))
            if op in ("add", "sub") and len(args) > 2 and args[2][2] != 1:
                other = b.node("Mul", [other, b.const(_scalar(args[2], dt))])
            b.node(op.capitalize(), [x[0], other], [out])
        elif op == "convolution":
            stride, padding, dilation, transposed, _, groups = [a[2] for a in args[2:8]]
            if transposed:
                problems.append("transposed convolution")
                continue
            ins = [x[0], x[1]]
            b.node("Conv", ins, [out], strides=stride, pads=list(padding) * 2,
                   dilations=dilation, group=groups)
        elif op == "embedding":
            b.node("Gather", [x[0], x[1]], [out], axis=0)
        elif op == "arange":
            start, end, step, adt = [a[2] for a in args[:4]]
            kinds = [a[1] for a in args[:3]]
            if adt not in (None, "int64") or any(k != "scalar_int" for k in kinds):
                problems.append("arange other than int64 integers")
                continue
            dtype[outs[0]] = "int64"
            ends = []
            for a, v in ((0, start), (1, end), (2, step)):
                if (n, a, -1) in b.sym:
                    ends.append(b.node("Squeeze", [b.poly(*b.sym[(n, a, -1)]),
                                                   b.const(np.array([0], np.int64))]))
                else:
                    ends.append(b.const(np.array(v, np.int64)))
            b.node("Range", ends, [out])
        elif op == "_layer_norm":
            axis = -len(args[1][2])
            eps = args[4][2]
            ins = [x[0], x[2] if x[2] else b.const(np.array(1.0, _NP[dt]))]
            if x[3]:
                ins.append(x[3])
            b.node("LayerNormalization", ins, [out], axis=axis, epsilon=float(eps))
        elif op == "split":
            size, dim = args[1][2], args[2][2]
            for k, o in enumerate(outs):
                b.node("Slice", [x[0], b.const(np.array([k * size], np.int64)),
                                 b.const(np.array([(k + 1) * size], np.int64)),
                                 b.const(np.array([dim], np.int64))], [f"v{o}"])
        elif op == "transpose":
            perm = list(range(r))
            d0, d1 = args[1][2] % r, args[2][2] % r
            perm[d0], perm[d1] = perm[d1], perm[d0]
            b.node("Transpose", [x[0]], [out], perm=perm)
        elif op == "empty":
            dtype[outs[0]] = args[1][2]
            empty_shape[outs[0]] = b.shape(n, 0, args[0][2])
        elif op == "copy_":
            if args[0][1] not in empty_shape:
                problems.append("copy_ into a tensor other than a fresh empty one")
                continue
            dtype[outs[0]] = dtype[args[0][1]]
            src = x[1]
            if dtype[args[1][1]] != dtype[args[0][1]]:
                src = b.node("Cast", [src], to=onnx.helper.np_dtype_to_tensor_dtype(
                    np.dtype(_NP[dtype[args[0][1]]])))
            b.node("Expand", [src, empty_shape[args[0][1]]], [out])
        elif op == "_fused_attention":
            dropout, causal, scale = args[3][2], args[4][2], args[5][2]
            if dropout:
                problems.append("attention with dropout")
                continue
            used = {a[1] for _, aa, _ in g["nodes"] for a in aa if a[0] == "value"}
            if any(o in used or o in {oo[0] for oo in g["outputs"]} for o in outs[1:]):
                problems.append("attention's log-sum-exp is used")
                continue
            q, k, v = x[0], x[1], x[2]
            perm = list(range(r))
            perm[-1], perm[-2] = perm[-2], perm[-1]
            kt = b.node("Transpose", [k], perm=perm)
            if scale is None:
                e = b.node("Cast", [b.node("Gather", [b.node("Shape", [q]),
                                                      b.const(np.array(-1, np.int64))], axis=0)],
                           to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(_NP[dt])))
                sc = b.node("Reciprocal", [b.node("Sqrt", [e])])
            else:
                sc = b.const(np.array(scale, _NP[dt]))
            scores = b.node("Mul", [b.node("MatMul", [q, kt]), sc])
            if causal:
                sq = b.node("Shape", [q])
                sk = b.node("Shape", [k])
                lq = b.node("Gather", [sq, b.const(np.array([-2], np.int64))], axis=0)
                lk = b.node("Gather", [sk, b.const(np.array([-2], np.int64))], axis=0)
                ones = b.node("ConstantOfShape", [b.node("Concat", [lq, lk], axis=0)],
                              value=onnx.helper.make_tensor("one", onnx.TensorProto.BOOL, [1],
                                                            [True]))
                mask = b.node("Trilu", [ones], upper=0)
                scores = b.node("Where", [mask, scores,
                                          b.const(np.array(-np.inf, _NP[dt]))])
            b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v], [out])
        elif op == "max_pool2d_with_indices":
            kernel, stride, padding, dilation, ceil = [a[2] for a in args[1:6]]
            b.node("MaxPool", [x[0]], [out], kernel_shape=kernel, strides=stride or kernel,
                   pads=list(padding) * 2, dilations=dilation, ceil_mode=int(ceil))
            used = {a[1] for _, aa, _ in g["nodes"] for a in aa if a[0] == "value"}
            if outs[1] in used or outs[1] in {o[0] for o in g["outputs"]}:
                problems.append("max_pool2d's indices are used")

    if problems:
        raise NotImplementedError("kiln.onnx.export: " + "; ".join(dict.fromkeys(problems))
                                  + "; nothing was written")
    outputs = []
    for (vid, name, dt, _), port in zip(g["outputs"], prog.outputs):
        b.node("Identity", [f"v{vid}"], [name])
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(_NP[dt]))
        dims = [int(d) if d.lstrip("-").isdigit() else d for d in port[2]]
        outputs.append(onnx.helper.make_tensor_value_info(name, elem, dims))
    graph = onnx.helper.make_graph(b.nodes, "kiln", graph_inputs, outputs, b.inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)],
                                   producer_name="kiln")
    model.ir_version = min(model.ir_version, 8)
    onnx.checker.check_model(model)
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return model
