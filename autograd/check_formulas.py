#!/usr/bin/env python3
"""Emits a C++ file that compiles every derivative and jvp formula of the op table, so that a
formula that stops compiling (an unknown helper, a wrong argument list, a type mismatch) fails the
build. One function per op row: its parameters are the op's arguments with their C++ types (as
gen.py generates them), `grad`/`grads`, `result`/`resultN`/named outputs and the tangents `<arg>_t`;
its body evaluates each formula and checks the gradient's type (Tensor, or a list for Tensor[]).
The functions are compiled, never called.

Usage: check_formulas.py OUT.cpp TABLE.toml [TABLE.toml ...]
"""
import os
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tensor", "ops"))
import optable  # noqa: E402  (the op table: its schema parser and C++ types)


def ident(s):
    return "".join(c if c.isalnum() else "_" for c in s)


def row_function(row, sch, where):
    params = []
    names = set()
    for a in sch["args"]:
        params.append(f"{a.cpp} {a.name}")
        names.add(a.name)
    for a in sch["args"]:
        if a.is_tensor and f"{a.name}_t" not in names:
            t = "TensorList" if a.type == "Tensor[]" else "const Tensor&"
            params.append(f"{t} {a.name}_t")
    rets = sch["rets"]
    params.append("const Tensor& grad")
    params.append("TensorList grads")
    if len(rets) == 1 and rets[0][0].startswith("Tensor[]"):
        params.append("const ::std::vector<Tensor>& result")
    elif rets:
        params.append("const Tensor& result")
        for i, (_, rname) in enumerate(rets):
            params.append(f"const Tensor& result{i}")
            if rname and rname not in names:
                params.append(f"const Tensor& {rname}")
    body = []
    deriv = row["derivative"]
    if isinstance(deriv, dict):
        deriv = optable.expand_derivative(deriv)
        for a in sch["args"]:
            f = deriv.get(a.name)
            if f is None or f == "non_differentiable":
                continue
            want = "::std::vector<Tensor>" if a.type == "Tensor[]" else "Tensor"
            body.append(f"  auto d_{a.name} = ({f});")
            body.append(f"  static_assert(::std::is_convertible_v<decltype(d_{a.name}), {want}>,")
            body.append(f"                \"{where}: the gradient for '{a.name}' must convert to {want}\");")
    if row["jvp"] not in ("derived", "non_differentiable"):
        body.append(f"  auto jvp = ({row['jvp']});")
        body.append("  static_assert(::std::is_convertible_v<decltype(jvp), Tensor>,")
        body.append(f"                \"{where}: the jvp must convert to Tensor\");")
    if not body:
        return None, 0
    n = sum(1 for line in body if line.startswith("  auto "))
    name = ident(sch["name"] + ("_" + sch["overload"] if sch["overload"] else ""))
    params = [f"[[maybe_unused]] {p}" for p in params]
    lines = [f"// {where}: {row['schema']}",
             f"[[maybe_unused]] void check_{name}({', '.join(params)}) {{"]
    lines += body
    for line in body:
        if line.startswith("  auto "):
            var = line.split()[1]
            lines.append(f"  (void){var};")
    lines.append("}")
    return "\n".join(lines), n


UNBOX_HELPERS = """
// Unboxing, as the generated boxed wrappers do it (tensor/src/op_support.h is private to kiln_tensor).
template <typename T>
::std::optional<T> unbox_opt(const IValue& v) {
  if (v.is_none()) return ::std::nullopt;
  if constexpr (::std::is_same_v<T, Scalar>) return v.to_scalar();
  else if constexpr (::std::is_same_v<T, int64_t>) return v.to_int();
  else if constexpr (::std::is_same_v<T, double>) return v.to_double();
  else return v.get<T>();
}
inline ::std::optional<Tensor> unbox_opt_tensor(const IValue& v) {
  if (v.is_none()) return ::std::nullopt;
  return v.to_tensor();
}
inline OptionalIntArrayRef unbox_opt_intlist(const IValue& v) {
  if (v.is_none()) return ::std::nullopt;
  return IntArrayRef(v.get<::std::vector<int64_t>>("int[]"));
}
inline ::std::optional<::std::string_view> unbox_opt_str(const IValue& v) {
  if (v.is_none()) return ::std::nullopt;
  return ::std::string_view(v.get<::std::string>("str"));
}
"""


def eval_function(row, sch, where):
    """For a row with formulas: a function that evaluates them on boxed arguments `in` (the op's
    inputs before the call), the op's outputs `outs` and the gradient of the first output. It
    returns one gradient per Tensor input, list inputs flattened (undefined: non_differentiable)."""
    deriv = row["derivative"]
    if not isinstance(deriv, dict) or "random" in row["tags"]:
        return None, None
    deriv = optable.expand_derivative(deriv)
    rets = sch["rets"]
    if not rets:
        return None, None
    L = []
    name = ident(sch["name"] + ("_" + sch["overload"] if sch["overload"] else ""))
    L.append(f"::std::vector<Tensor> eval_{name}(const Stack& in, const ::std::vector<Tensor>& outs, const Tensor& grad) {{")
    for i, a in enumerate(sch["args"]):
        unbox = a.unbox.replace("v.", f"in[{i}].").replace("(v)", f"(in[{i}])")
        L.append(f"  [[maybe_unused]] {a.cpp} {a.name} = {unbox};")
    L.append("  ::std::vector<Tensor> grads_of_outputs(outs.size());  // only the first output's is given")
    L.append("  if (!grads_of_outputs.empty()) grads_of_outputs[0] = grad;")
    L.append("  [[maybe_unused]] TensorList grads(grads_of_outputs);")
    if len(rets) == 1 and rets[0][0].startswith("Tensor[]"):
        L.append("  [[maybe_unused]] const ::std::vector<Tensor>& result = outs;")
    else:
        L.append("  [[maybe_unused]] const Tensor& result = outs[0];")
        for i, (_, rname) in enumerate(rets):
            if rname:
                L.append(f"  [[maybe_unused]] const Tensor& {rname} = outs[{i}];")
    L.append("  ::std::vector<Tensor> g;")
    for a in sch["args"]:
        if not a.is_tensor:
            continue
        f = deriv.get(a.name, "non_differentiable")
        if a.type == "Tensor[]":
            if f == "non_differentiable":
                L.append(f"  for (size_t i = 0; i < {a.name}.size(); ++i) g.emplace_back();")
            else:
                L.append(f"  for (Tensor& t : ::std::vector<Tensor>({f})) g.push_back(t);")
        elif f == "non_differentiable":
            L.append("  g.emplace_back();")
        else:
            L.append(f"  g.push_back({f});")
    L.append("  return g;")
    L.append("}")
    return "\n".join(L), (sch["name"] + ("." + sch["overload"] if sch["overload"] else ""), name)


def jvp_function(row, sch):
    """For a row with a jvp formula: a function that evaluates it on boxed arguments `in`, the
    op's outputs `outs` and one tangent per Tensor input (`<arg>_t`)."""
    jvp = row["jvp"]
    if jvp in ("derived", "non_differentiable") or "random" in row["tags"] or not sch["rets"]:
        return None, None
    if any(a.type == "Tensor[]" for a in sch["args"]):
        return None, None
    name = ident(sch["name"] + ("_" + sch["overload"] if sch["overload"] else ""))
    L = [f"Tensor jvp_{name}(const Stack& in, const ::std::vector<Tensor>& outs, const ::std::vector<Tensor>& tangents) {{"]
    k = 0
    for i, a in enumerate(sch["args"]):
        unbox = a.unbox.replace("v.", f"in[{i}].").replace("(v)", f"(in[{i}])")
        L.append(f"  [[maybe_unused]] {a.cpp} {a.name} = {unbox};")
        if a.is_tensor:
            L.append(f"  [[maybe_unused]] const Tensor& {a.name}_t = tangents[{k}];")
            k += 1
    L.append("  [[maybe_unused]] const Tensor& result = outs[0];")
    L.append(f"  return {jvp};")
    L.append("}")
    return "\n".join(L), (sch["name"] + ("." + sch["overload"] if sch["overload"] else ""), name)


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    funcs, count, evals, keys, jvps, jkeys = [], 0, [], [], [], []
    with open(os.path.join(os.path.dirname(optable.__file__), "rules.toml"), "rb") as f:
        rules = tomllib.load(f)
    for path in sorted(paths):
        if os.path.basename(path) == "rules.toml":
            continue
        with open(path, "rb") as f:
            table = tomllib.load(f)
        for i, row in enumerate(table.get("op", [])):
            row = optable.with_defaults(row, rules)  # Note [Row defaults] in tensor/ops/optable.py
            where = f"{os.path.basename(path)} row {i + 1}"
            sch = optable.parse_schema(row["schema"], where)
            if sch is None:
                continue
            text, n = row_function(row, sch, where)
            if text:
                funcs.append(text)
                count += n
            ev, key = eval_function(row, sch, where)
            if ev:
                evals.append(ev)
                keys.append(key)
            jv, jkey = jvp_function(row, sch)
            if jv:
                jvps.append(jv)
                jkeys.append(jkey)
    if optable.errors:
        for e in optable.errors:
            print(f"check_formulas: {e}", file=sys.stderr)
        sys.exit(1)
    src = ["// Generated by autograd/check_formulas.py from tensor/ops/*.toml. Do not edit.",
           "// Compiles every derivative and jvp formula of the op table (the functions are never",
           "// called): a formula that does not compile fails the build.",
           "#include <map>",
           "#include <string>",
           "#include <type_traits>",
           "#include <vector>",
           "",
           "#include \"autograd/formula_eval.h\"",
           "#include \"kiln/autograd/formulas.h\"",
           "",
           "namespace kiln::autograd::formula_check {",
           "using namespace kiln;",
           "",
           "\n\n".join(funcs),
           "",
           f"// {count} formulas in {len(funcs)} rows.",
           f"extern const int kCheckedFormulas = {count};",
           "",
           "// Evaluating the formulas (tests/autograd/formulas_table_test.cpp compares them with",
           "// finite differences on the manifest's samples).",
           UNBOX_HELPERS,
           "\n\n".join(evals),
           "",
           "const ::std::map<::std::string, FormulaEval>& formula_evals() {",
           "  static const ::std::map<::std::string, FormulaEval> m{",
           *[f"      {{\"{k}\", &eval_{n}}}," for k, n in keys],
           "  };",
           "  return m;",
           "}",
           "",
           "\n\n".join(jvps),
           "",
           "const ::std::map<::std::string, JvpEval>& jvp_evals() {",
           "  static const ::std::map<::std::string, JvpEval> m{",
           *[f"      {{\"{k}\", &jvp_{n}}}," for k, n in jkeys],
           "  };",
           "  return m;",
           "}",
           "",
           "}  // namespace kiln::autograd::formula_check",
           ""]
    optable.write_if_changed(out, "\n".join(src))


if __name__ == "__main__":
    main()
