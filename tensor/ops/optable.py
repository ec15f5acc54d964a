"""The op table (tensor/ops/*.toml): its rows read, defaulted and checked against rules.toml, and
the model of an op (Op, Arg) that the generators share: gen.py (the C++ op API), gen_autograd.py
(the autograd kernels), client/python/gen_bindings.py (the Python bindings) and
autograd/check_formulas.py. load_tables() prints every table error and exits when there is one.
"""
import os
import re
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
REQUIRED = ["schema", "kind", "tags", "dtypes", "meta", "derivative", "jvp", "batching",
            "autocast", "sharding", "decomposition"]
# Fields rules.toml's [defaults] may give (Note [Row defaults]).
DEFAULTABLE = ["tags", "jvp", "batching", "autocast", "sharding", "decomposition"]
OPTIONAL = ["variants", "method", "doc"]

# schema type -> (C++ parameter type, C++ unbox expression of IValue `v`). Types are spelled
# ::std:: because kiln::ops holds a handle struct named `std` (the op torch.std).
CPP_TYPES = {
    "Tensor": ("const Tensor&", "v.to_tensor()"),
    "Tensor?": ("const ::std::optional<Tensor>&", "unbox_opt_tensor(v)"),
    "Tensor[]": ("TensorList", "TensorList(v.to_tensor_list())"),
    "Scalar": ("const Scalar&", "v.to_scalar()"),
    "Scalar?": ("const ::std::optional<Scalar>&", "unbox_opt<Scalar>(v)"),
    "int": ("int64_t", "v.to_int()"),
    "int?": ("::std::optional<int64_t>", "unbox_opt<int64_t>(v)"),
    "int[]": ("IntArrayRef", "IntArrayRef(v.get<std::vector<int64_t>>(\"int[]\"))"),
    "int[]?": ("OptionalIntArrayRef", "unbox_opt_intlist(v)"),
    "float": ("double", "v.to_double()"),
    "float?": ("::std::optional<double>", "unbox_opt<double>(v)"),
    "bool": ("bool", "v.get<bool>(\"bool\")"),
    "ScalarType": ("ScalarType", "v.get<ScalarType>(\"dtype\")"),
    "ScalarType?": ("::std::optional<ScalarType>", "unbox_opt<ScalarType>(v)"),
    "Device?": ("::std::optional<Device>", "unbox_opt<Device>(v)"),
    "str": ("::std::string_view", "std::string_view(v.get<std::string>(\"str\"))"),
    "str?": ("::std::optional<::std::string_view>", "unbox_opt_str(v)"),
    "Generator?": ("::std::optional<Generator>", "unbox_opt<Generator>(v)"),
}
RETURN_TYPES = {"Tensor": "Tensor", "Tensor[]": "::std::vector<Tensor>"}
# schema type -> kiln::ArgType (kiln/dispatcher.h): ArgInfo's typed copy of the type.
ARG_TYPES = {
    "Tensor": "Tensor", "Tensor?": "OptionalTensor", "Tensor[]": "TensorList", "Scalar": "Scalar",
    "Scalar?": "OptionalScalar", "int": "Int", "int?": "OptionalInt", "int[]": "IntList",
    "int[]?": "OptionalIntList", "float": "Float", "float?": "OptionalFloat", "bool": "Bool",
    "ScalarType": "ScalarType", "ScalarType?": "OptionalScalarType", "Device?": "OptionalDevice",
    "str": "Str", "str?": "OptionalStr", "Generator?": "OptionalGenerator",
}
# Note [Argument roles]: what an argument means to generic code (vmap's rules, autocast), by
# name and type, so that no dispatch path compares argument names. kiln::ArgRole lists them.
ARG_ROLES = [
    ("Dim", {"dim", "dim0", "dim1", "dim2", "start_dim", "end_dim"},
     {"int", "int?", "int[]", "int[]?"}),            # a dimension index (or list of them)
    ("Size", {"size", "shape"}, {"int[]"}),          # a whole shape
    ("Dims", {"dims"}, {"int[]"}),                   # a permutation of the dims
    ("Sizes", {"sizes", "split_sizes"}, {"int[]"}),  # sizes along one dim
    ("InputSize", {"self_size", "input_size"}, {"int[]"}),  # a backward row's forward input shape
    ("Keepdim", {"keepdim"}, {"bool"}),
    ("Dtype", {"dtype"}, {"ScalarType", "ScalarType?"}),  # the output dtype
    ("Weight", {"weight"}, {"Tensor", "Tensor?"}),   # a parameter shared by every row
    ("Bias", {"bias"}, {"Tensor", "Tensor?"}),
    ("Mask", {"condition", "mask"}, {"Tensor", "Tensor?"}),  # takes no part in type promotion
]


def arg_role(name, type_):
    for role, names, types in ARG_ROLES:
        if name in names and type_ in types:
            return role
    return "None"


def camel(name):
    """A rule name as a C++ enumerator: lower_precision -> LowerPrecision."""
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


CPP_KEYWORDS = {"bool", "signed", "unsigned", "int", "float", "double", "char", "short", "long",
                "void", "auto", "default", "delete", "new", "this", "true", "false"}


def set_ident(name):
    """A dtype set's name as a C++ identifier in kiln::dtype_sets (`signed` -> `signed_`)."""
    return name + "_" if name in CPP_KEYWORDS else name
errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


class Arg:
    def __init__(self, text, kwarg_only, where):
        # The alias annotation comes before a list's brackets, as in PyTorch: Tensor(a!)[] self.
        m = re.fullmatch(r"([A-Za-z]+)(\([a-z]!?\))?(\[\d*\])?(\?)?\s+(\w+)(?:=(.+))?", text.strip())
        if not m:
            err(where, f"cannot parse argument '{text}'")
            self.ok = False
            return
        self.ok = True
        base, alias, brackets, opt, self.name, self.default = m.groups()
        base += "[]" if brackets else ""
        self.type = base + (opt or "")
        self.alias = alias
        self.mutable = bool(alias and "!" in alias)
        self.kwarg_only = kwarg_only
        if self.type not in CPP_TYPES:
            err(where, f"unknown argument type '{self.type}'")
            self.ok = False
            return
        self.cpp, self.unbox = CPP_TYPES[self.type]
        self.is_tensor = self.type.startswith("Tensor")

    def cpp_default(self):
        d = self.default
        if d is None:
            return None
        if d == "None":
            return "std::nullopt"
        if d in ("True", "False"):
            return d.lower()
        if d == "[]":
            return "{}"
        if d.startswith("["):
            return "{" + d[1:-1] + "}"
        if d.startswith("'") or d.startswith('"'):
            return '"' + d[1:-1] + '"'
        if d.startswith("'") or d.startswith('"'):
            return '"' + d[1:-1] + '"'
        if self.type.startswith("ScalarType"):
            return "k" + {"float32": "Float32", "int64": "Int64", "bool": "Bool"}[d]
        return d


def parse_schema(schema, where):
    m = re.fullmatch(r"\s*([\w.]+)\((.*)\)\s*->\s*(.+?)\s*", schema)
    if not m:
        err(where, f"cannot parse schema '{schema}'")
        return None
    full, argstr, ret = m.groups()
    name, _, overload = full.partition(".")
    args, kw = [], False
    for piece in [p for p in split_top(argstr) if p.strip()]:
        if piece.strip() == "*":
            kw = True
            continue
        a = Arg(piece, kw, where)
        if a.ok:
            args.append(a)
    rets = []
    ret = ret.strip()
    if ret.startswith("(") and ret != "()":  # "()": no returns (the fused optimizer steps)
        for piece in split_top(ret[1:-1]):
            t, _, rname = piece.strip().partition(" ")
            rets.append((t, rname.strip()))
    elif ret != "()":
        rets.append((ret, ""))
    for t, _ in rets:
        if re.sub(r"\(.*\)", "", t) not in RETURN_TYPES:
            err(where, f"unknown return type '{t}'")
    if len(rets) > 1 and not all(rname for _, rname in rets):
        err(where, "a row with several returns names each one, as in '-> (Tensor values, Tensor "
                   "indices)': the Python binding returns them as a named tuple")
    return dict(name=name, overload=overload, args=args, rets=rets)


def split_top(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def derivative_groups(deriv):
    """The keys of a derivative table as lists of input names: a key may name several inputs
    ("query, key, value"), whose one formula returns a tuple of their gradients (one backward
    kernel computing all of them)."""
    return [([n.strip() for n in k.split(",")], f) for k, f in deriv.items()]


def expand_derivative(deriv):
    """The derivative table with one formula per input; an input of a group gets
    ::std::get<i>(formula) (gen_autograd.py evaluates a group's formula once for all of them)."""
    out = {}
    for names, f in derivative_groups(deriv):
        for i, n in enumerate(names):
            out[n] = f if len(names) == 1 else f"::std::get<{i}>({f})"
    return out


def validate_formula(text, names, rules, where):
    # Identifiers must be arguments, grads/results, ops of the table or declared helpers.
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "", text)
    for m in re.finditer(r"(\.?)\b([A-Za-z_]\w*)\b", text):
        dot, ident = m.groups()
        if dot or ident in names or ident in rules["formula_functions"]:
            continue
        if re.fullmatch(r"(grad|grads|result|result\d|\w+_t|true|false)", ident):
            continue
        err(where, f"formula '{text}' uses unknown name '{ident}'")


class Op:
    """One dispatcher op (a row, or a variant that a structured row generates)."""

    def __init__(self, row, sch, variant, where, table=""):
        self.row, self.where, self.variant, self.table = row, where, variant, table
        base = sch["name"]
        self.args = list(sch["args"])
        self.rets = list(sch["rets"])
        self.kind = row["kind"]
        self.base = base
        # The handle of the row's functional op (OpInfo::functional of its inplace/out variants).
        self.functional_handle = base + ("_" + sch["overload"] if sch["overload"] else "")
        if variant == "functional":
            self.name = base + ("." + sch["overload"] if sch["overload"] else "")
            self.cpp_name = base
            self.handle = base + ("_" + sch["overload"] if sch["overload"] else "")
        elif variant == "inplace":
            self.name = self.cpp_name = self.handle = base + "_"
        else:  # out
            self.name = base + ".out"
            self.cpp_name = base + "_out"
            self.handle = base + "_out"
            out = Arg("Tensor(a!) out", True, where)
            self.args = self.args + [out]
        self.tags = list(row["tags"])
        if variant == "inplace" and "inplace" not in self.tags:
            self.tags.append("inplace")
        self.is_view = self.kind == "view"
        self.is_random = "random" in self.tags
        self.returns_list = len(self.rets) == 1 and self.rets[0][0] == "Tensor[]"
        self.schema = self.render_schema()
        self.cpp_defaults = True  # see strip_ambiguous_defaults

    def render_schema(self):
        parts, kw = [], False
        for i, a in enumerate(self.args):
            if a.kwarg_only and not kw:
                parts.append("*")
                kw = True
            t = a.type
            if self.variant == "inplace" and i == 0:
                t = "Tensor(a!)"
            elif self.variant == "out" and a.name == "out":
                t = "Tensor(a!)"
            elif a.alias:
                t = a.type.replace("?", "") .replace("Tensor", "Tensor" + a.alias, 1)
            parts.append(f"{t} {a.name}" + (f"={a.default}" if a.default is not None else ""))
        if self.variant in ("inplace", "out"):
            ret = "Tensor(a!)"
        elif len(self.rets) == 1:
            ret = self.rets[0][0]
        else:
            ret = "(" + ", ".join(f"{t} {n}".strip() for t, n in self.rets) + ")"
        return f"{self.name}({', '.join(parts)}) -> {ret}"

    @property
    def ret_cpp(self):
        if self.variant != "functional":
            return "Tensor"
        if not self.rets:
            return "void"
        ts = [RETURN_TYPES[re.sub(r"\(.*\)", "", t)] for t, _ in self.rets]
        return ts[0] if len(ts) == 1 else f"::std::tuple<{', '.join(ts)}>"

    def params(self, with_defaults=False, skip_self=False, out_first=False):
        args = self.args
        if out_first and self.variant == "out":
            args = [args[-1]] + args[:-1]
        ps = []
        for i, a in enumerate(args):
            if skip_self and i == 0:
                continue
            p = f"{a.cpp} {a.name}"
            d = a.cpp_default() if self.cpp_defaults else None
            if with_defaults and d is not None and not (out_first and a.name == "out"):
                p += f" = {d}"
            ps.append(p)
        # C++ defaults must be trailing: drop defaults before any required parameter.
        if with_defaults:
            seen_required = False
            for i in range(len(ps) - 1, -1, -1):
                if " = " not in ps[i]:
                    seen_required = True
                elif seen_required:
                    ps[i] = ps[i].split(" = ")[0]
        return ", ".join(ps)

    def arg_names(self):
        return ", ".join(a.name for a in self.args)

    @property
    def num_returns(self):
        return 1 if self.variant != "functional" else len(self.rets)


def row_defaults(row, rules):
    """Note [Row defaults]: the value each field missing from `row` takes. In order, the first
    that gives the field wins: rules.toml's [defaults.kind.<the row's kind>], then
    [defaults.tag.<tag>] for the row's tags in the order rules.toml lists those tables, then
    [defaults.all]. `meta` defaults to the op's name, and `jvp` to "non_differentiable" when the
    derivative is. Only the row's own schema, kind, tags and derivative decide, so deleting a
    field equal to its default never changes another field's default."""
    d = rules.get("defaults", {})
    out = {}
    if isinstance(row.get("schema"), str):
        out["meta"] = row["schema"].split("(")[0].split(".")[0].strip()
    if row.get("derivative") == "non_differentiable":
        out["jvp"] = "non_differentiable"
    tags = row.get("tags", d.get("all", {}).get("tags", []))
    sources = [d.get("kind", {}).get(row.get("kind"), {})]
    sources += [fields for tag, fields in d.get("tag", {}).items() if tag in tags]
    sources.append(d.get("all", {}))
    for fields in sources:
        for k, v in fields.items():
            out.setdefault(k, v)
    return out


def with_defaults(row, rules):
    """`row` with every missing field that has a default filled in."""
    return {**row_defaults(row, rules), **row}


def check_defaults(rules):
    """rules.toml's [defaults] may only name defaultable fields, known kinds and known tags."""
    d = rules.get("defaults", {})
    tables = [("defaults.all", d.get("all", {}))]
    for group, known in [("kind", rules["kinds"]), ("tag", rules["tags"])]:
        for name, fields in d.get(group, {}).items():
            if name not in known:
                err("rules.toml", f"[defaults.{group}.{name}]: unknown {group} '{name}'")
            tables.append((f"defaults.{group}.{name}", fields))
    for where, fields in tables:
        for k in fields:
            if k not in DEFAULTABLE:
                err("rules.toml", f"[{where}]: '{k}' cannot have a default ({', '.join(DEFAULTABLE)} can)")


def load(paths, rules):
    ops, seen = [], {}
    for path in paths:
        with open(path, "rb") as f:
            try:
                table = tomllib.load(f)
            except tomllib.TOMLDecodeError as e:
                err(path, f"not valid TOML: {e}")
                continue
        for i, row in enumerate(table.get("op", [])):
            where = f"{os.path.basename(path)} row {i + 1} ({row.get('schema', '?').split('(')[0]})"
            row = with_defaults(row, rules)
            missing = [k for k in REQUIRED if k not in row]
            for k in missing:
                err(where, f"missing required field '{k}'" + (
                    " (no default in rules.toml for this kind and these tags)" if k in DEFAULTABLE else ""))
            unknown = [k for k in row if k not in REQUIRED + OPTIONAL]
            for k in unknown:
                err(where, f"unknown field '{k}'")
            if missing:
                continue
            sch = parse_schema(row["schema"], where)
            if sch is None:
                continue
            check_row(row, sch, rules, where)
            variants = ["functional"] + [v for v in row.get("variants", []) if v != "method"]
            for v in row.get("variants", []):
                if v not in ("inplace", "out", "method"):
                    err(where, f"unknown variant '{v}'")
            if row["kind"] != "structured" and set(variants) - {"functional"}:
                err(where, "only structured rows generate inplace/out variants")
                variants = ["functional"]
            for v in variants:
                op = Op(row, sch, v, where, os.path.splitext(os.path.basename(path))[0])
                if op.name in seen:
                    err(where, f"op '{op.name}' already defined in {seen[op.name]}")
                seen[op.name] = where
                ops.append(op)
    return ops


def check_row(row, sch, rules, where):
    for field, allowed in [("kind", rules["kinds"]), ("batching", rules["batching"]),
                           ("autocast", rules["autocast"]), ("sharding", rules["sharding"])]:
        if row[field] not in allowed:
            err(where, f"{field} '{row[field]}' is not a known rule ({', '.join(allowed)})")
    for t in row["tags"]:
        if t not in rules["tags"]:
            err(where, f"unknown tag '{t}'")
    if not isinstance(row["dtypes"], dict) or not row["dtypes"]:
        err(where, "dtypes must map backends to dtype sets")
    else:
        for backend, ds in row["dtypes"].items():
            if backend not in rules["backends"]:
                err(where, f"unknown backend '{backend}' in dtypes")
            if ds not in rules["dtype_sets"]:
                err(where, f"unknown dtype set '{ds}'")
    kind = row["kind"]
    if row["batching"] == "composite" and kind != "composite":
        err(where, "batching 'composite' runs the row's decomposition: only for composite rows")
    if kind == "composite" and row["decomposition"] == "none":
        err(where, "a composite row needs a decomposition (the C++ function that implements it)")
    if kind != "composite" and row["decomposition"] != "none" and not re.fullmatch(r"\w+", row["decomposition"]):
        err(where, "decomposition must be 'none' or a function name")
    if not re.fullmatch(r"\w+", row["meta"]):
        err(where, "meta must name a function in kiln::meta")
    if sch["rets"] and sch["rets"][0][0] == "Tensor[]" and kind == "structured":
        err(where, "structured rows return exactly one Tensor")
    names = {a.name for a in sch["args"]} | {n for _, n in sch["rets"] if n}
    names |= set(rules["op_names_extra"])
    deriv = row["derivative"]
    tensor_args = [a.name for a in sch["args"] if a.is_tensor]
    if isinstance(deriv, str):
        if deriv not in ("non_differentiable", "composite", "decompose"):
            err(where, "derivative must be a table of formulas, 'non_differentiable', 'composite' or "
                "'decompose'")
        if deriv == "composite" and kind != "composite":
            err(where, "derivative 'composite' is only for composite rows")
        if deriv == "decompose" and (kind == "composite" or row["decomposition"] == "none"
                                     or row.get("variants")):
            err(where, "derivative 'decompose' is for a non-composite row without variants that names "
                "its decomposition")
    elif isinstance(deriv, dict):
        covered = [n for ns, _ in derivative_groups(deriv) for n in ns]
        for a in tensor_args:
            if a not in covered:
                err(where, f"derivative has no formula for input '{a}' (write 'non_differentiable')")
        for ns, f in derivative_groups(deriv):
            k = ", ".join(ns)
            if any(n not in tensor_args for n in ns):
                err(where, f"derivative names '{k}', which is not a Tensor input")
            elif any(covered.count(n) > 1 for n in ns):
                err(where, f"derivative gives '{k}' more than one formula")
            elif len(ns) > 1 and any(a.name in ns and a.type != "Tensor" for a in sch["args"]):
                err(where, f"derivative group '{k}': only Tensor inputs share a formula")
            elif not isinstance(f, str) or not f.strip():
                err(where, f"derivative for '{k}' is empty")
            elif len(ns) > 1 and f == "non_differentiable":
                err(where, f"derivative group '{k}' needs a formula (list the inputs one by one)")
            elif f != "non_differentiable":
                validate_formula(f, names | ALL_OP_NAMES, rules, where)
    else:
        err(where, "derivative must be a table or a string")
    jvp = row["jvp"]
    if jvp not in ("derived", "non_differentiable"):
        validate_formula(jvp, names | ALL_OP_NAMES, rules, where)


ALL_OP_NAMES = set()


def is_inplace_of_self(op):
    """OpInfo::is_inplace: the op writes into its first argument, a Tensor. Rows that update
    Tensor(a!)[] lists (the fused optimizer steps) bump every element's version but are not
    in-place ops of one tensor, which is what vmap's in-place handling expects."""
    return op.variant == "inplace" or bool(op.args and op.args[0].mutable and op.args[0].type == "Tensor")


def write_if_changed(path, text):
    if os.path.exists(path):
        with open(path) as f:
            if f.read() == text:
                return
    with open(path, "w") as f:
        f.write(text)


def load_tables(paths):
    """The checked ops of the tables at `paths` and the rules they were checked against (rules.toml
    plus each table's formula_functions = [...], the formula helpers its rows use). Op names may
    appear in formulas, so every table's names are collected first. Prints the table errors and
    exits if there are any."""
    with open(os.path.join(HERE, "rules.toml"), "rb") as f:
        rules = tomllib.load(f)
    for path in paths:
        with open(path, "rb") as f:
            try:
                table = tomllib.load(f)
            except tomllib.TOMLDecodeError:
                continue  # load() reports it
        rules["formula_functions"] = rules["formula_functions"] + table.get("formula_functions", [])
        for row in table.get("op", []):
            ALL_OP_NAMES.add(row.get("schema", "").split("(")[0].split(".")[0])
    check_defaults(rules)
    ops = load(paths, rules)
    if errors:
        for e in errors:
            print(f"op table error: {e}", file=sys.stderr)
        sys.exit(1)
    return ops, rules
