#!/usr/bin/env python3
"""Generates Kiln's C++ op API, dispatcher handles, boxed wrappers and test manifest from the
op table (tensor/ops/*.toml). Run by CMake; fails (exit 1, one line per problem) on any row
that lacks a required field or names an unknown rule.

Usage: gen.py OUT_DIR TABLE.toml [TABLE.toml ...]   (rules.toml is read from beside this file)
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


def key_set_expr(op):
    parts = []
    for a in op.args:
        if a.type == "Tensor":
            parts.append(f"key_of({a.name}, \"{op.name}\", \"{a.name}\")")
        elif a.type == "Tensor?":
            parts.append(f"key_of_opt({a.name})")
        elif a.type == "Tensor[]":
            parts.append(f"key_of_list({a.name})")
    if not parts:
        dev = next((a.name for a in op.args if a.type == "Device?"), None)
        return f"device_key({dev})" if dev else "DispatchKeySet(DispatchKey::CPU)"
    return " | ".join(parts)


def strip_ambiguous_defaults(ops):
    """Note [Overloads with defaults]: two overloads of one C++ name (clamp(Tensor, Scalar?
    min=None, Scalar? max=None) and clamp.Tensor(Tensor, Tensor? min=None, Tensor? max=None))
    would make a call that leaves the defaults out (clamp(x)) ambiguous in C++. A later overload
    that an earlier one could be confused with, for some argument count that uses one of its
    defaults, keeps its defaults in the Python bindings only: in C++ all its arguments are
    required."""
    def required(op):  # C++ keeps only trailing defaults
        n = len(op.args)
        while n > 0 and op.args[n - 1].default is not None:
            n -= 1
        return n

    seen = {}
    for op in ops:
        if op.variant == "out":
            continue
        cpp = [a.cpp for a in op.args]
        for earlier in seen.get(op.cpp_name, []):
            e_cpp, e_required = [a.cpp for a in earlier.args], required(earlier)
            for n in range(required(op), len(cpp)):
                if e_required <= n <= len(e_cpp) and e_cpp[:n] == cpp[:n]:
                    op.cpp_defaults = False
        seen.setdefault(op.cpp_name, []).append(op)


HEADER = "// Generated by tensor/ops/gen.py from the op table. Do not edit."


def gen_enums(rules):
    """kiln/generated/op_enums.h: the names rules.toml allows, as C++ enums (OpInfo's typed
    fields), each with to_string for messages."""
    L = ["// Generated by tensor/ops/gen.py from tensor/ops/rules.toml: the typed fields of OpInfo",
         "// (kind, tags, batching, autocast, sharding, per-backend dtypes). Do not edit.",
         "#pragma once\n", "#include <cstdint>\n", '#include "kiln/dtype_set.h"\n', "namespace kiln {\n"]
    for enum, key in [("OpKind", "kinds"), ("OpTag", "tags"), ("BatchingRule", "batching"),
                      ("AutocastPolicy", "autocast"), ("ShardingRule", "sharding")]:
        names = rules[key]
        L.append(f"enum class {enum} : uint8_t {{ {', '.join(camel(n) for n in names)} }};")
        plural = enum[:-1] + "ies" if enum.endswith("y") else enum + "s"
        L.append(f"inline constexpr int kNum{plural} = {len(names)};")
        L.append(f"constexpr const char* to_string({enum} v) {{")
        L.append(f"  constexpr const char* kNames[] = {{{', '.join(chr(34) + n + chr(34) for n in names)}}};")
        L.append("  return kNames[static_cast<int>(v)];\n}\n")
    L.append("// A row's tags (an inplace variant adds OpTag::Inplace).")
    L.append("struct OpTags {")
    L.append("  uint32_t bits = 0;")
    L.append("  template <typename... T>")
    L.append("  static constexpr OpTags of(T... tags) {")
    L.append("    return OpTags{(0u | ... | (1u << static_cast<int>(tags)))};\n  }")
    L.append("  constexpr bool has(OpTag t) const { return (bits >> static_cast<int>(t)) & 1u; }")
    L.append("  bool operator==(const OpTags&) const = default;\n};\n")
    backends = rules["backends"]
    L.append("// The backends a row claims dtypes for (`dtypes = { cpu = ..., ... }`).")
    L.append(f"enum class TableBackend : uint8_t {{ {', '.join(camel(b) for b in backends)} }};")
    L.append(f"inline constexpr int kNumTableBackends = {len(backends)};")
    L.append("constexpr const char* to_string(TableBackend v) {")
    L.append(f"  constexpr const char* kNames[] = {{{', '.join(chr(34) + b + chr(34) for b in backends)}}};")
    L.append("  return kNames[static_cast<int>(v)];\n}\n")
    L.append("// The input dtypes a row accepts, per backend (empty: the backend is not claimed).")
    L.append("struct OpDTypes {")
    L.append(f"  DTypeSet {', '.join(backends)};")
    L.append("  constexpr DTypeSet of(TableBackend b) const {")
    L.append("    switch (b) {")
    for b in backends:
        L.append(f"      case TableBackend::{camel(b)}: return {b};")
    L.append("    }\n    return {};\n  }")
    L.append("  bool operator==(const OpDTypes&) const = default;\n};\n")
    L.append("}  // namespace kiln\n")
    return L


def gen_dtype_sets(rules):
    """kiln/generated/dtype_sets.h: rules.toml's named dtype sets as DTypeSet constants, for
    OpInfo, the tests and the CUDA loops (kernels/cuda/loops.cuh)."""
    L = ["// Generated by tensor/ops/gen.py from tensor/ops/rules.toml ([dtype_sets]): the named",
         "// dtype sets rows may claim. Do not edit.", "#pragma once\n", "#include <string_view>\n",
         '#include "kiln/dtype_set.h"\n', "namespace kiln::dtype_sets {\n"]
    sets = rules["dtype_sets"]
    for name, dts in sets.items():
        members = ", ".join("ScalarType::" + camel(d).replace("Bfloat", "BFloat").replace("Uint", "UInt")
                            for d in dts)
        L.append(f"inline constexpr DTypeSet {set_ident(name)}{{{members}}};")
    L.append("\n// The set named `name` in rules.toml, or nullptr.")
    L.append("constexpr const DTypeSet* by_name(std::string_view name) {")
    for name in sets:
        L.append(f'  if (name == "{name}") return &{set_ident(name)};')
    L.append("  return nullptr;\n}\n")
    L.append("}  // namespace kiln::dtype_sets\n")
    return L


def dtypes_expr(row, rules):
    sets = [row["dtypes"].get(b, "none") for b in rules["backends"]]
    return "::kiln::OpDTypes{" + ", ".join(f"::kiln::dtype_sets::{set_ident(s)}" for s in sets) + "}"


def tags_expr(op):
    return "::kiln::OpTags::of(" + ", ".join(f"::kiln::OpTag::{camel(t)}" for t in op.tags) + ")"


def gen_handles(ops):
    H = []
    for op in ops:
        p = op.params()
        H.append(f"// {op.schema}\nstruct {op.handle} {{")
        H.append(f"  static constexpr const char* kName = \"{op.name}\";")
        # Note [Argument positions]: each argument's index on the boxed stack, so that per-op
        # code (vmap's rules) reads an argument without looking its name up at every call.
        for i, a in enumerate(op.args):
            H.append(f"  static constexpr int kArg_{a.name} = {i};")
        H.append(f"  using Fn = {op.ret_cpp}({p});")
        if op.kind == "structured":
            fargs = [a for a in op.args if a.name != "out"] if op.variant == "out" else op.args
            H.append(f"  using StructuredFn = void(const Tensor& out, {', '.join(f'{a.cpp} {a.name}' for a in fargs)});")
            H.append("  static void register_structured(DispatchKey k, StructuredFn* fn);")
        H.append("  static OperatorHandle& handle();")
        H.append(f"  static DispatchKeySet key_set({p});")
        H.append(f"  static {op.ret_cpp} call({p});")
        H.append(f"  static {op.ret_cpp} redispatch(DispatchKeySet ks{', ' if p else ''}{p});")
        H.append("};\n")
    return H


def gen(ops, out_dir, rules):
    """Writes the generated files.

    Note [Generated file split]: per table file T (unary.toml), the handles go to kiln/generated/ops/T.h, the meta and composite declarations to
    kiln/generated/meta/T.h and kiln/generated/composite/T.h, and the definitions to ops_T.cpp;
    op_handles.h, meta_decls.h and composite_decls.h include every table's header. A file that
    includes only the tables it uses, and every ops_T.cpp but the edited table's, is not rebuilt
    when one row changes (write_if_changed keeps untouched outputs' timestamps)."""
    strip_ambiguous_defaults(ops)
    gdir = os.path.join(out_dir, "kiln", "generated")
    for sub in ("ops", "meta", "composite"):
        os.makedirs(os.path.join(gdir, sub), exist_ok=True)
    tables = sorted({op.table for op in ops})
    files = {}  # path relative to out_dir -> lines
    for t in tables:
        tops = [op for op in ops if op.table == t]
        H = [f"{HEADER}\n// The dispatcher handles of {t}.toml's ops.\n#pragma once\n",
             '#include "kiln/dispatcher.h"\n#include "kiln/generator.h"\n#include "kiln/tensor.h"\n',
             "namespace kiln::ops {\n"] + gen_handles(tops) + ["}  // namespace kiln::ops\n"]
        files[f"kiln/generated/ops/{t}.h"] = H
        metas = {}
        for op in tops:
            if op.variant != "functional":
                continue
            ret = "TensorSpec" if (op.num_returns == 1 and not op.returns_list) else "std::vector<TensorSpec>"
            metas[(op.row["meta"], op.params())] = ret
        MD = [f"{HEADER}\n// The meta functions {t}.toml's rows name.", "#pragma once\n",
              '#include "kiln/dispatcher.h"\n#include "kiln/generator.h"\n#include "kiln/tensor.h"\n',
              "namespace kiln::meta {"]
        for (name, p), ret in sorted(metas.items()):
            MD.append(f"{ret} {name}({p});")
        MD.append("}  // namespace kiln::meta\n")
        files[f"kiln/generated/meta/{t}.h"] = MD
        CD = [f"{HEADER}\n// The decompositions {t}.toml's composite rows name.", "#pragma once\n",
              '#include "kiln/generated/ops.h"\n', "namespace kiln::composite {"]
        for op in tops:
            if op.kind == "composite" or op.row["derivative"] == "decompose":
                CD.append(f"{op.ret_cpp} {op.row['decomposition']}({op.params()});")
        CD.append("}  // namespace kiln::composite\n")
        files[f"kiln/generated/composite/{t}.h"] = CD
        C = [f"{HEADER}\n// The ops of {t}.toml: OpInfo, boxed and meta wrappers, kernels of",
             "// view/composite/structured rows. See Note [Generated file split] in tensor/ops/gen.py.",
             f'#include "kiln/generated/ops/{t}.h"\n#include "kiln/generated/ops.h"',
             f'#include "kiln/generated/meta/{t}.h"\n#include "kiln/generated/composite/{t}.h"',
             '#include "kiln/generated/dtype_sets.h"',
             '#include "op_support.h"\n\nnamespace kiln {\nusing namespace kiln::detail;\n']
        for op in tops:
            C.extend(gen_op_cpp(op, rules))
        C.append("}  // namespace kiln\n")
        files[f"ops_{t}.cpp"] = C
    for name, sub, what in [("op_handles.h", "ops", "dispatcher handle"),
                            ("meta_decls.h", "meta", "meta function declaration"),
                            ("composite_decls.h", "composite", "decomposition declaration")]:
        files[f"kiln/generated/{name}"] = (
            [HEADER, f"// Every table's {what}s: include kiln/generated/{sub}/<table>.h instead",
             "// where a file uses one table (Note [Generated file split] in tensor/ops/gen.py).",
             "#pragma once\n"] + [f'#include "kiln/generated/{sub}/{t}.h"' for t in tables] + [""])
    # The list of every op (Dispatcher::ops()): changes only when an op is added or removed.
    R = [HEADER, "// Every op's handle, for Dispatcher::ops().",
         '#include <iterator>\n#include <vector>\n\n#include "kiln/dispatcher.h"\n', "namespace kiln {"]
    R += [f"extern OperatorHandle g_op_{op.handle};" for op in ops]
    R.append("static OperatorHandle* const kAllOps[] = {")
    R += [f"    &g_op_{op.handle}," for op in ops]
    R.append("};\nnamespace detail {\nstd::vector<OperatorHandle*> all_op_handles() {")
    R.append("  return std::vector<OperatorHandle*>(std::begin(kAllOps), std::end(kAllOps));\n}")
    R.append("}  // namespace detail\n}  // namespace kiln\n")
    files["op_registry.cpp"] = R
    # --- ops.h (free functions) and tensor_methods.inc
    D = [f"{HEADER}\n#pragma once\n", '#include "kiln/generator.h"\n#include "kiln/tensor.h"\n\nnamespace kiln {\n']
    M = []
    for op in ops:
        D.append(f"{op.ret_cpp} {op.cpp_name}({op.params(True, out_first=True)});")
        if op.variant != "out" and op.args and op.args[0].name == "self" and op.args[0].type == "Tensor" \
                and op.row.get("method", True):
            M.append(f"{op.ret_cpp} {op.cpp_name}({op.params(True, skip_self=True)}) const;")
    D.append("\n}  // namespace kiln\n")
    files["kiln/generated/ops.h"] = D
    files["kiln/generated/tensor_methods.inc"] = M
    files["kiln/generated/op_enums.h"] = gen_enums(rules)
    files["kiln/generated/dtype_sets.h"] = gen_dtype_sets(rules)
    # --- manifest
    MAN = ["// Generated test manifest: KILN_MANIFEST_OP(name, handle, kind, tags, dtypes), with",
           "// kind a kiln::OpKind, tags a kiln::OpTags, dtypes a kiln::OpDTypes (kiln/generated/op_enums.h)."]
    for op in ops:
        MAN.append(f'KILN_MANIFEST_OP("{op.name}", {op.handle}, ::kiln::OpKind::{camel(op.kind)}, '
                   f'({tags_expr(op)}), ({dtypes_expr(op.row, rules)}))')
    files["kiln/generated/manifest.inc"] = MAN
    for rel, lines in files.items():
        write_if_changed(os.path.join(out_dir, rel), "\n".join(lines) + "\n")


def is_inplace_of_self(op):
    """OpInfo::is_inplace: the op writes into its first argument, a Tensor. Rows that update
    Tensor(a!)[] lists (the fused optimizer steps) bump every element's version but are not
    in-place ops of one tensor, which is what vmap's in-place handling expects."""
    return op.variant == "inplace" or bool(op.args and op.args[0].mutable and op.args[0].type == "Tensor")


def gen_op_cpp(op, rules):
    h, p, n = op.handle, op.params(), op.arg_names()
    L = [f"// ---- {op.schema}"]
    L.append(f"static const ArgInfo kArgs_{h}[] = {{")
    for i, a in enumerate(op.args):
        d = f'"{a.default}"' if a.default is not None else "nullptr"
        mutable = a.mutable or (op.variant == "inplace" and i == 0) or (op.variant == "out" and a.name == "out")
        L.append(f'    {{"{a.name}", "{a.type}", {d}, {str(a.kwarg_only).lower()}, '
                 f'ArgType::{ARG_TYPES[a.type]}, ArgRole::{arg_role(a.name, a.type)}, {str(mutable).lower()}}},')
    if not op.args:
        L.append('    {"", "", nullptr, false, ArgType::Tensor, ArgRole::None, false},')
    L.append("};")
    r = op.row
    deriv = r["derivative"] if isinstance(r["derivative"], str) else \
        "; ".join(f"{k}: {v}" for k, v in r["derivative"].items())
    esc = lambda s: s.replace("\\", "\\\\").replace('"', '\\"')
    functional = "nullptr"
    if op.variant != "functional":  # defined earlier in this file: the row's first op
        functional = f"&g_op_{op.functional_handle}"
    L.append(f'static constexpr OpInfo kInfo_{h} = {{"{op.name}", "{esc(op.schema)}", '
             f'OpKind::{camel(op.kind)}, {tags_expr(op)}, "{esc(deriv)}", "{esc(r["jvp"])}", '
             f'BatchingRule::{camel(r["batching"])}, AutocastPolicy::{camel(r["autocast"])}, '
             f'ShardingRule::{camel(r["sharding"])}, "{r["decomposition"]}", {dtypes_expr(r, rules)}, '
             f'kArgs_{h}, {len(op.args)}, '
             f'{op.num_returns}, {str(op.returns_list).lower()}, {str(op.is_random).lower()}, '
             f'{str(is_inplace_of_self(op)).lower()}, '
             f'{str(op.variant == "out").lower()}, '
             f'{str(op.is_view).lower()}, {functional}}};')
    nargs = len(op.args)
    unbox_args = ", ".join(f"unbox_arg<{i}>(s, {nargs}, [](const IValue& v) {{ return {a.unbox}; }})"
                           for i, a in enumerate(op.args))
    # unbox_and_call: runs a typed kernel on boxed arguments.
    L.append(f"static void unbox_{h}(void* fn, Stack& s) {{")
    call = f"reinterpret_cast<ops::{h}::Fn*>(fn)({unbox_args})"
    L.extend(push_result(op, call))
    L.append("}")
    L.append(f"static void boxed_entry_{h}(const OperatorHandle&, DispatchKeySet ks, Stack& s) {{")
    call = f"ops::{h}::redispatch(ks{', ' if unbox_args else ''}{unbox_args})"
    boxed = push_result(op, call)
    # Boxed calls of mutating ops bump the version counters too, as ops::X::call does.
    mutated_idx = [i for i, a in enumerate(op.args) if a.mutable] or (
        [0] if op.variant == "inplace" else [])
    boxed[1:1] = [bump_version_line(f"s[s.size() - {nargs - i}]", op.args[i].type, boxed=True)
                  for i in mutated_idx]
    L.extend(boxed)
    L.append("}")
    # boxed meta
    fargs = op.args[:-1] if op.variant == "out" else op.args
    f_unbox = ", ".join(f"unbox_arg<{i}>(s, {nargs}, [](const IValue& v) {{ return {a.unbox}; }})"
                        for i, a in enumerate(fargs))
    L.append(f"static std::vector<TensorSpec> meta_boxed_{h}(const Stack& s) {{")
    if op.is_view:
        L.append(f"  return as_spec_list(meta::{r['meta']}({f_unbox}));")
    elif op.variant == "functional":
        L.append(f"  return as_spec_list(meta::{r['meta']}({f_unbox}));")
    elif op.variant == "inplace":
        L.append(f"  TensorSpec spec = meta::{r['meta']}({f_unbox});")
        L.append(f"  return {{inplace_spec(\"{op.name}\", unbox_arg<0>(s, {nargs}, [](const IValue& v) {{ return v.to_tensor(); }}), spec)}};")
    else:
        L.append(f"  TensorSpec spec = meta::{r['meta']}({f_unbox});")
        L.append(f"  spec.alias_of = {nargs - 1};\n  return {{spec}};")
    L.append("}")
    L.append(f"constinit OperatorHandle g_op_{h}(&kInfo_{h}, &unbox_{h}, &boxed_entry_{h}, &meta_boxed_{h});")
    L.append(f"OperatorHandle& ops::{h}::handle() {{ return g_op_{h}; }}")
    L.append(f"DispatchKeySet ops::{h}::key_set({p}) {{ return {key_set_expr(op)}; }}")
    L.append(f"{op.ret_cpp} ops::{h}::call({p}) {{")
    L.append(f"  const LocalDispatchKeySet& tls = tls_local_dispatch_key_set();")
    L.append(f"  DispatchKeySet ks = (({key_set_expr(op)}) | tls.included) - tls.excluded;")
    mutated = [a.name for a in op.args if a.mutable] or (
        [op.args[0].name] if op.variant == "inplace" else [])
    if mutated:
        void = op.ret_cpp == "void"
        L.append(f"  {'' if void else 'auto r = '}redispatch(ks{', ' if n else ''}{n});")
        types = {a.name: a.type for a in op.args}
        for m in mutated:
            L.append(bump_version_line(m, types.get(m, "Tensor"), boxed=False))
        L.append("}" if void else "  return r;\n}")
    else:
        L.append(f"  return redispatch(ks{', ' if n else ''}{n});\n}}")
    L.append(f"{op.ret_cpp} ops::{h}::redispatch(DispatchKeySet ks{', ' if p else ''}{p}) {{")
    L.append(f"  const OperatorHandle& op = g_op_{h};")
    L.append(f"  const KernelFunction& kf = op.kernel(op.select(ks));")
    L.append(f"  if (__builtin_expect(kf.unboxed != nullptr, 1))")
    L.append(f"    return reinterpret_cast<Fn*>(kf.unboxed)({n});")
    L.append(f"  Stack s;\n  s.reserve({max(nargs, 1)});")
    for a in op.args:
        L.append(f"  s.emplace_back({a.name});")
    L.append("  kf.boxed(op, ks, s);")
    L.append(f"  return pop_result<{op.ret_cpp}>(s, \"{op.name}\");\n}}")
    # free function and method
    L.append(f"{op.ret_cpp} {op.cpp_name}({op.params(out_first=True)}) {{ return ops::{h}::call({n}); }}")
    if op.variant != "out" and op.args and op.args[0].name == "self" and op.args[0].type == "Tensor" \
            and op.row.get("method", True):
        L.append(f"{op.ret_cpp} Tensor::{op.cpp_name}({op.params(skip_self=True)}) const {{ "
                 f"return ops::{h}::call(*this{', ' if len(op.args) > 1 else ''}{', '.join(a.name for a in op.args[1:])}); }}")
    # kind-specific kernels
    if op.is_view:
        make = "make_views" if op.returns_list else "make_view"
        L.append(f"static {op.ret_cpp} view_kernel_{h}({p}) {{")
        L.append(f"  return {make}({op.args[0].name}, meta::{r['meta']}({n}));\n}}")
        L.append(f"static const int kReg_{h} = register_view_kernel(g_op_{h}, reinterpret_cast<void*>(&view_kernel_{h}));")
    if op.kind == "composite":
        L.append(f"static const int kReg_{h} = register_composite(g_op_{h}, "
                 f"reinterpret_cast<void*>(static_cast<ops::{h}::Fn*>(&composite::{r['decomposition']})));")
    if op.kind == "structured":
        L.extend(gen_structured(op))
    L.append("")
    return L


def gen_structured(op):
    h, r = op.handle, op.row
    fargs = op.args[:-1] if op.variant == "out" else op.args
    fp = ", ".join(f"{a.cpp} {a.name}" for a in fargs)
    fn = ", ".join(a.name for a in fargs)
    p = op.params()
    L = [f"static ops::{h}::StructuredFn* g_structured_{h}[kNumBackendKeys] = {{}};"]
    L.append(f"template <int K>\nstatic Tensor structured_{h}({p}) {{")
    L.append(f"  TensorSpec spec = meta::{r['meta']}({fn});")
    if op.variant == "functional":
        L.append("  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);")
        L.append(f"  g_structured_{h}[K](out, {fn});\n  return out;\n}}")
    elif op.variant == "inplace":
        self_ = fargs[0].name
        L.append(f"  inplace_spec(\"{op.name}\", {self_}, spec);")
        L.append(f"  Tensor tmp = out_target({self_}, spec);")
        L.append(f"  g_structured_{h}[K](tmp, {fn});")
        L.append(f"  finish_out({self_}, tmp);\n  return {self_};\n}}")
    else:
        L.append(f"  prepare_out(\"{op.name}\", out, spec);")
        L.append("  Tensor tmp = out_target(out, spec);")
        L.append(f"  g_structured_{h}[K](tmp, {fn});")
        L.append("  finish_out(out, tmp);\n  return out;\n}")
    L.append(f"void ops::{h}::register_structured(DispatchKey k, StructuredFn* fn) {{")
    L.append("  int K = static_cast<int>(k);")
    L.append("  KILN_ASSERT(K < kNumBackendKeys, \"structured kernels register under backend keys\");")
    L.append(f"  g_structured_{h}[K] = fn;")
    L.append(f"  static void* const kWrappers[] = {{" + ", ".join(
        f"reinterpret_cast<void*>(&structured_{h}<{k}>)" for k in range(5)) + "};")
    L.append(f"  Dispatcher::get().register_kernel(g_op_{h}, k, kWrappers[K], nullptr);")
    if op.variant == "functional":  # one kernel serves the in-place and out= variants too
        for v in op.row.get("variants", []):
            if v in ("inplace", "out"):
                L.append(f"  ops::{op.base}{'_' if v == 'inplace' else '_out'}::register_structured(k, fn);")
    L.append("}")
    return L


def bump_version_line(expr, arg_type, boxed):
    """Bumps the version counter of a mutated argument (every element of a Tensor(a!)[] list)."""
    note = "  // Note [Version counters]"
    if arg_type == "Tensor[]":
        lst = f"{expr}.to_tensor_list()" if boxed else expr
        return f"  for (const Tensor& t : {lst}) t.impl()->bump_version();{note}"
    t = f"{expr}.to_tensor()" if boxed else expr
    return f"  {t}.impl()->bump_version();{note}"


def push_result(op, call):
    nargs = len(op.args)
    if op.ret_cpp == "void":
        return [f"  {call};", f"  drop_args(s, {nargs});"]
    L = [f"  auto r = {call};", f"  drop_args(s, {nargs});"]
    if op.ret_cpp.startswith("::std::tuple"):
        for i in range(len(op.rets)):
            L.append(f"  s.emplace_back(std::move(std::get<{i}>(r)));")
    else:
        L.append("  s.emplace_back(std::move(r));")
    return L


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


def main():
    out_dir, paths = sys.argv[1], sys.argv[2:]
    ops, rules = load_tables(paths)
    gen(ops, out_dir, rules)


if __name__ == "__main__":
    main()
