#!/usr/bin/env python3
"""Generates kiln_autograd's Autograd kernels from the op table's derivative formulas.

Usage: gen_autograd.py OUT_DIR TABLE.toml [TABLE.toml ...]   (reuses optable.py's parser; writes
autograd_kernels_<table>.cpp per table and autograd_pending.cpp)

For every non-composite row with a derivative table it writes a node class named like
PyTorch's (MulBackward0) whose apply() evaluates the formulas, and Autograd kernels for the
row's variants that run the op below Autograd and record that node. A formula may use only the
row's arguments, grad, result, ops of the table, Tensor methods, C++ operators and the helpers in
AVAILABLE_HELPERS; a row needing anything else records a NotImplementedBackward node instead
and is listed in pending_derivatives(). A Tensor argument the formulas read only for its sizes,
numel, or the dtype and device of cast_back() is kept as that metadata, not saved. In-place
variants save self's value before the op (SavedVariable::before_inplace) and end with
rebase_history(), which gives a view's base the history (Note [CopySlices] in
autograd/src/copy_slices.h).

Multi-output rows: `grad` is the first output's gradient, `grads[i]` the i-th one (zeros when
that output got none), and the named outputs (`indices` of max.dim) are saved for the formulas.
A Tensor[] output (split) has one node for all its elements; `grads` holds their gradients.
Tensor[] inputs: the formula returns one gradient per element (cat_backward); the node keeps only
the elements' geometry when the formulas read the list through LIST_GEOMETRY_HELPERS alone, and the
tensors themselves (one SavedVariable each: index's index tensors) when a formula reads the list.

Forward AD (Note [Forward AD] in autograd/include/kiln/autograd/forward_ad.h): each kernel also
has a forward path, taken only while a DualLevel is active, that gives the outputs tangents: a
row's jvp formula (one jvp_<Node>() function per row, `<x>_t` the tangents, `result` the output),
"derived" (the row's node, fresh, through derived_jvp(): the double-vjp trick per op), the same
view of the input's tangent for view rows, or nothing for "non_differentiable". The reverse-mode
part is one record_<op>() function that both paths call; its `fw` step runs between set_history
and saving the outputs, so saved outputs keep their tangents.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optable  # noqa: E402

# Helpers the generated code may call: every formula_functions name (rules.toml and the tables),
# all implemented in autograd/include/kiln/autograd/formulas.h (the formula compile check,
# autograd/check_formulas.py, fails the build if one is missing), and <cmath>'s constants.
AVAILABLE_HELPERS = {"M_SQRT1_2", "M_2_SQRTPI", "M_PI"}  # main() adds the formula_functions
CXX_WORDS = {"true", "false"}
# Helpers that read only the sizes, dtype and device of a Tensor[] argument: a node passes them
# placeholders of that geometry (zero-stride expands of a 0-d tensor: no memory, no version check).
LIST_GEOMETRY_HELPERS = {"cat_backward", "stack_backward"}

# How a non-Tensor argument is stored in a node and bound again in apply().
STORE = {
    "IntArrayRef": ("::std::vector<int64_t>", "IntArrayRef {n}({n}_);", "std::vector<int64_t>({n}.begin(), {n}.end())"),
    "OptionalIntArrayRef": ("::std::optional<::std::vector<int64_t>>", "OptionalIntArrayRef {n}({n}_);",
                            "{n}.has_value() ? ::std::optional<::std::vector<int64_t>>(::std::vector<int64_t>({n}->begin(), {n}->end())) : ::std::nullopt"),
    "::std::string_view": ("::std::string", "::std::string_view {n}({n}_);", "::std::string({n})"),
    "::std::optional<::std::string_view>": ("::std::optional<::std::string>",
                                            "::std::optional<::std::string_view> {n} = {n}_ ? ::std::optional<::std::string_view>(*{n}_) : ::std::nullopt;",
                                            "{n} ? ::std::optional<::std::string>(::std::string(*{n})) : ::std::nullopt"),
}


def camel(name):
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p)


def idents(formula):
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "", formula)
    return [ident for dot, ident in re.findall(r"(\.?)\b([A-Za-z_]\w*)\b", text) if not dot]


def cxx_formula(formula):
    return re.sub(r"'([^']*)'", lambda m: '"' + m.group(1) + '"', formula)


def rewrite_cast_back(formula, name, repl):
    """`cast_back(expr, name)` calls (name only gives the dtype and device to cast to) with their
    last argument replaced by `repl`, nested calls included."""
    out, i = [], 0
    while (j := formula.find("cast_back(", i)) >= 0:
        start = j + len("cast_back(")
        depth, k, last_comma = 0, start, None
        while formula[k] != ")" or depth > 0:  # the call's closing parenthesis
            if formula[k] == "(":
                depth += 1
            elif formula[k] == ")":
                depth -= 1
            elif formula[k] == "," and depth == 0:
                last_comma = k
            k += 1
        if last_comma is not None and formula[last_comma + 1:k].strip() == name:
            body = rewrite_cast_back(formula[start:last_comma], name, repl) + ", " + repl
        else:
            body = rewrite_cast_back(formula[start:k], name, repl)
        out.append(formula[i:j] + "cast_back(" + body + ")")
        i = k + 1
    return "".join(out) + formula[i:]


class Row:
    def __init__(self, row, ops, node_name):
        self.row, self.ops, self.node = row, ops, node_name
        self.func = next(o for o in ops if o.variant == "functional")
        self.args = self.func.args
        self.formulas = optable.expand_derivative(row["derivative"])  # one per input
        self.groups = optable.derivative_groups(row["derivative"])    # as written (shared formulas)
        raw = [f for _, f in self.groups]
        self.missing = set()
        self.reason = None
        self.out_names = [n for _, n in self.func.rets if n] if self.func.num_returns > 1 else []
        names = {a.name for a in self.args} | {"grad", "grads", "result"} | set(self.out_names)
        for f in raw:
            if f == "non_differentiable":
                continue
            for i in idents(f):
                if i not in names and i not in optable.ALL_OP_NAMES and i not in AVAILABLE_HELPERS \
                        and i not in CXX_WORDS:
                    self.missing.add(i)
        for a in self.args:
            if a.type == "Tensor?" and self.formulas.get(a.name, "non_differentiable") != "non_differentiable":
                self.reason = f"a derivative for a {a.type} input"
        # Tensor[] arguments a formula reads other than through LIST_GEOMETRY_HELPERS: saved by value.
        self.lists_by_value = set()
        for a in self.args:
            if a.type == "Tensor[]":
                for f in raw:
                    rest = re.sub(rf"\b({'|'.join(LIST_GEOMETRY_HELPERS)})\(grad, {a.name},", "", f)
                    if f != "non_differentiable" and a.name in idents(rest):
                        self.lists_by_value.add(a.name)
        self.generated = not self.missing and not self.reason
        used = set()
        for f in raw:
            if f != "non_differentiable":
                used |= set(idents(f))
        self.used = used
        # Tensor arguments the formulas use only through .sizes() / .numel() and as the dtype and
        # device of cast_back(): the node keeps those, not the tensor (less memory, and no version
        # check on a tensor it never reads: copy_'s src may be a view of the tensor it writes).
        self.shape_only, self.cast_only = set(), set()
        live = [f for f in raw if f != "non_differentiable"]
        for a in self.args:
            if a.type != "Tensor" or a.name not in used:
                continue
            stripped = [rewrite_cast_back(re.sub(rf"\b{a.name}\.(sizes|numel)\(\)", "", f), a.name, "")
                        for f in live]
            if not any(a.name in idents(f) for f in stripped):
                self.shape_only.add(a.name)
                if any(rewrite_cast_back(f, a.name, "") != f for f in live):
                    self.cast_only.add(a.name)
        self.tensor_args = [a for a in self.args if a.is_tensor]
        self.diff_args = [a.name for a in self.tensor_args
                          if self.formulas.get(a.name, "non_differentiable") != "non_differentiable"]

    def missing_text(self):
        if self.reason:
            return self.reason
        return ", ".join(sorted(self.missing))


def node_class(r):
    L = [f"struct {r.node} final : Node {{", f'  const char* name() const override {{ return "{r.node}"; }}']
    saved, binds, rel = [], [], []
    for a in r.args:
        if a.type == "Tensor[]":
            saved.append(f"  size_t {a.name}_n_ = 0;")
        if a.name not in r.used:
            continue
        if a.name in r.shape_only:
            saved.append(f"  ::std::vector<int64_t> {a.name}_sizes_;")
            if a.name in r.cast_only:
                saved.append(f"  ScalarType {a.name}_dtype_ = kFloat32;")
                saved.append(f"  Device {a.name}_device_ = kCPU;")
        elif a.type == "Tensor":
            saved.append(f"  SavedVariable {a.name}_;")
            binds.append(f'  Tensor {a.name} = {a.name}_.unpack(*this, "{a.name}");')
            rel.append(f"{a.name}_.reset();")
        elif a.type == "Tensor[]" and a.name in r.lists_by_value:
            saved.append(f"  ::std::vector<SavedVariable> {a.name}_vals_;")
            binds.append(f"  ::std::vector<Tensor> {a.name}_v;")
            binds.append(f"  for (SavedVariable& sv : {a.name}_vals_) "
                         f'{a.name}_v.push_back(sv.unpack(*this, "{a.name}"));')
            binds.append(f"  TensorList {a.name}({a.name}_v);")
            rel.append(f"{a.name}_vals_.clear();")
        elif a.type == "Tensor[]":
            saved.append(f"  ::std::vector<InputMetadata> {a.name}_geom_;")
            binds.append(f"  ::std::vector<Tensor> {a.name}_ph = geometry_placeholders({a.name}_geom_);")
            binds.append(f"  TensorList {a.name}({a.name}_ph);")
        else:
            store, bind, _ = STORE.get(a.cpp, (stored_type(a.cpp), f"const auto& {{n}} = {{n}}_;", "{n}"))
            saved.append(f"  {store} {a.name}_;")
            binds.append("  " + bind.format(n=a.name))
    for n in r.out_names:
        if n in r.used:
            saved.append(f"  SavedVariable {n}_;")
            binds.append(f'  Tensor {n} = {n}_.unpack(*this, "{n}");')
            rel.append(f"{n}_.reset();")
    if "result" in r.used:
        saved.append("  SavedVariable result_;")
        binds.append('  Tensor result = result_.unpack(*this, "result");')
        rel.append("result_.reset();")
    L += saved
    L.append("  variable_list apply(variable_list&& grads) override {")
    L.append("    const Tensor& grad = grads[0];\n    (void)grad;")
    L += ["  " + b for b in binds]
    L.append("    variable_list out(num_outputs());\n    size_t pos = 0;")
    def shaped(f):
        for sn in r.cast_only:
            f = rewrite_cast_back(f, sn, f"{sn}_dtype_, {sn}_device_")
        for sn in r.shape_only:
            f = re.sub(rf"\b{sn}\.sizes\(\)", f"IntArrayRef({sn}_sizes_)", f)
            f = re.sub(rf"\b{sn}\.numel\(\)", f"numel_of({sn}_sizes_)", f)
        return f

    # A formula shared by several inputs (one backward kernel for all of them) runs once, when
    # the last of its inputs has its position, if any of their gradients is needed.
    group_of = {n: (ns, f) for ns, f in r.groups if len(ns) > 1 for n in ns}
    order = [a.name for a in r.tensor_args]
    for a in r.tensor_args:
        if a.name in group_of:
            ns, f = group_of[a.name]
            L.append(f"    const size_t pos_{a.name} = pos;")
            if max(order.index(n) for n in ns) == order.index(a.name):
                need = " || ".join(f"should_compute_output(pos_{n})" for n in ns)
                L.append(f"    if ({need}) {{")
                L.append(f"      auto gs = {cxx_formula(shaped(f))};")
                for i, n in enumerate(ns):
                    L.append(f"      if (should_compute_output(pos_{n})) out[pos_{n}] = ::std::get<{i}>(gs);")
                L.append("    }")
            L.append("    pos += 1;")
            continue
        f = r.formulas.get(a.name, "non_differentiable")
        n = f"{a.name}_n_" if a.type == "Tensor[]" else "1"
        if f != "non_differentiable":
            f = shaped(f)
            if a.type == "Tensor[]":
                L.append(f"    if (any_output_needed(pos, {n})) {{")
                L.append(f"      ::std::vector<Tensor> gs = {cxx_formula(f)};")
                L.append(f"      for (size_t k = 0; k < {n} && k < gs.size(); ++k)")
                L.append("        if (should_compute_output(pos + k)) out[pos + k] = gs[k];\n    }")
            else:
                L.append(f"    if (should_compute_output(pos)) out[pos] = {cxx_formula(f)};")
        L.append(f"    pos += {n};")
    L.append("    (void)pos;\n    return out;\n  }")
    L.append(f"  void release_variables() override {{ {' '.join(rel)} }}")
    L.append("};\n")
    return L


def stored_type(cpp):
    t = cpp.replace("const ", "").replace("&", "").strip()
    return t


def save_line(a):
    if a.cpp in STORE:
        return f"node->{a.name}_ = {STORE[a.cpp][2].format(n=a.name)};"
    return f"node->{a.name}_ = {a.name};"


def kernel(r, op):
    """The Autograd kernel of one variant: reverse mode as before, and (Note [Forward AD] in
    kiln/autograd/forward_ad.h) a forward path taken only while a forward AD level is active."""
    h, p, n = op.handle, op.params(), op.arg_names()
    ret = op.ret_cpp
    diff = [a for a in op.args if a.name in r.diff_args]
    rg = " || ".join(f"needs_grad({a.name})" for a in diff) or "false"
    strict = " || ".join(f"requires_grad_of({a.name})" for a in diff) or "false"
    below = f"ops::{h}::redispatch(below_autograd(ops::{h}::key_set({n})){', ' if n else ''}{n})"
    if op.variant == "out":
        tan = " || ".join(f"has_tangent({a.name})" for a in diff) or "false"
        L = [f"static {ret} autograd_{h}({p}) {{",
             "  const detail::AutogradTLS& st = detail::autograd_tls();",
             f"  if (st.forward_ad && ({tan})) [[unlikely]] fail_out_variant_tangent(\"{op.name}\");",
             "  // While a level is active a dual tensor carries the Autograd key without requiring grad.",
             f"  const bool need = st.grad_enabled && (st.fw_level != 0 ? ({strict}) : ({rg}));",
             f'  KILN_CHECK(!need, Runtime, "{op.name}(): functions with out=... arguments don\'t support '
             f'automatic differentiation, but one of the arguments requires grad.");',
             "  ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);",
             f"  return {below};\n}}"]
        return L
    return record_fn(r, op, below) + [""] + forward_fn(r, op, below, strict) + [""] + [
        f"static {ret} autograd_{h}({p}) {{",
        "  const detail::AutogradTLS& st = detail::autograd_tls();",
        f"  if (st.fw_level != 0) [[unlikely]] return forward_{h}({n});",
        f"  const bool need = st.grad_enabled && ({rg});",
        "  if (!need) {\n    ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);",
        f"    return {below};\n  }}",
        f"  return record_{h}({n}{', ' if n else ''}NoForward{{}});",
        "}"]


def is_inplace(op):
    # Generated `_` variants and rows like fill_/copy_ whose schema mutates `self`.
    return op.variant == "inplace" or bool(op.args and op.args[0].mutable)


def save_lines(r, op, inplace, forward):
    """Saving the node's arguments (a jvp node saves inputs as they are: Note [Derived jvp])."""
    L = []
    for a in op.args:
        if a.type == "Tensor[]":
            L.append(f"  node->{a.name}_n_ = {a.name}.size();")
        if a.name not in r.used:
            continue
        if a.type == "Tensor[]" and a.name in r.lists_by_value:
            L.append(f"  for (const Tensor& t : {a.name}) node->{a.name}_vals_.emplace_back(t, false);")
        elif a.type == "Tensor[]":
            L.append(f"  for (const Tensor& t : {a.name}) node->{a.name}_geom_.push_back(geometry_of(t));")
        elif a.name in r.shape_only:
            L.append(f"  node->{a.name}_sizes_.assign({a.name}.sizes().begin(), {a.name}.sizes().end());")
            if a.name in r.cast_only:
                L.append(f"  node->{a.name}_dtype_ = {a.name}.dtype();")
                L.append(f"  node->{a.name}_device_ = {a.name}.device();")
        elif a.type == "Tensor":
            if inplace and a.name == op.args[0].name and forward:
                L.append(f"  node->{a.name}_ = SavedVariable({a.name}_pre, false);")
            elif inplace and a.name == op.args[0].name:  # self's history is the node's edge 0
                L.append(f"  node->{a.name}_ = SavedVariable::before_inplace(clone_below_autograd({a.name}));")
            else:
                L.append(f"  node->{a.name}_ = SavedVariable({a.name}, false);")
        else:
            L.append("  " + save_line(a))
    return L


def record_fn(r, op, below):
    """Reverse mode: runs the op below Autograd and records the node. `fw` (the forward path's
    tangent step, or NoForward) runs once the outputs have their history and before the node
    saves them, so saved outputs keep their tangents (forward-over-reverse)."""
    h, p, n = op.handle, op.params(), op.arg_names()
    ret = op.ret_cpp
    inplace = is_inplace(op)
    L = ["template <typename Fw>", f"static {ret} record_{h}({p}{', ' if p else ''}Fw&& fw) {{"]
    if inplace:  # writing into an integer tensor records nothing: it cannot carry a gradient
        L.append(f"  if (!is_floating({op.args[0].name}.dtype())) {{\n"
                 f"    ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);\n    return {below};\n  }}")
        L.append(f'  check_inplace({op.args[0].name}, "{op.name}");')
    if r.generated:
        L.append(f"  auto node = std::make_shared<{r.node}>();")
    else:
        L.append(f'  auto node = std::make_shared<NotImplementedBackward>("{r.node}", "{r.func.name}");')
    for a in op.args:
        if a.is_tensor and a.name != "out":
            if a.type == "Tensor" and a.name not in r.diff_args:
                L.append("  node->mutable_next_edges().emplace_back();")
            else:
                L.append(f"  collect_edge(*node, {a.name});")
    if r.generated:
        L += save_lines(r, op, inplace, forward=False)
    L.append(f"  {ret} r;")
    L.append(f"  {{\n    ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);\n    r = {below};\n  }}")
    if op.ret_cpp == "Tensor":
        if not inplace:
            L.append("  if (!is_floating(r.dtype())) return r;  // integer outputs are not differentiable")
        # In place: a view's base gets the history (Note [CopySlices] in autograd/src/copy_slices.h).
        L.append(f"  {'rebase_history' if inplace else 'set_history'}(r, node);")
        if op.is_view:
            L.append(f"  set_view_base(r, {op.args[0].name});")
        L.append("  fw(r);")
        if r.generated and "result" in r.used:
            L.append(f"  node->result_ = SavedVariable(r, true, {1 if inplace else 0});")
    elif op.ret_cpp.startswith("::std::tuple"):
        for i in range(len(op.rets)):
            L.append(f"  if (is_floating(std::get<{i}>(r).dtype())) set_history(std::get<{i}>(r), node);")
            L.append(f"  else node->add_input_metadata(std::get<{i}>(r));")
        L.append("  fw(r);")
        if r.generated:
            for i, nm in enumerate(r.out_names):
                if nm in r.used:
                    L.append(f"  node->{nm}_ = SavedVariable(std::get<{i}>(r), true);")
    else:  # Tensor[]
        L.append("  for (const Tensor& t : r) {\n    set_history(t, node);")
        if op.is_view:
            L.append(f"    set_view_base(t, {op.args[0].name});")
        L.append("  }")
        L.append("  fw(r);")
    L.append("  return r;\n}")
    return L


def self_by_value(formula):
    """Whether a jvp formula reads self's values (not only its sizes or dtype)."""
    stripped = re.sub(r"\bself\.(sizes|numel|dim)\(\)", "", formula)
    stripped = re.sub(r",\s*self\)", ")", stripped)  # cast_back(x, self): self's dtype only
    return "self" in idents(stripped)


def jvp_kind(r, op):
    jvp = r.row["jvp"]
    if jvp == "non_differentiable":
        return "none"
    if op.is_view and jvp == "derived" and r.func.name != "as_strided":
        return "view"
    if jvp == "derived":
        return "derived" if r.generated else "pending"
    return "formula"


def jvp_formula_fn(r):
    """One function per row evaluating its jvp formula: the op's arguments, `result`, and the
    tangents `<x>_t` the formula reads."""
    f = r.row["jvp"]
    if r.func.num_returns > 1 or r.func.returns_list:
        raise SystemExit(f"gen_autograd: {r.func.name}: jvp formulas of multi-output rows are not "
                         f"supported (use \"derived\")")
    used = set(idents(f))
    ps = [f"[[maybe_unused]] {a.cpp} {a.name}" for a in r.args]
    ps.append("[[maybe_unused]] const Tensor& result")
    for a in r.tensor_args:
        if f"{a.name}_t" in used:
            ps.append(f"{'TensorList' if a.type == 'Tensor[]' else 'const Tensor&'} {a.name}_t")
    return [f"static Tensor jvp_{r.node}({', '.join(ps)}) {{", f"  return {cxx_formula(f)};", "}", ""]


def forward_fn(r, op, below, strict):
    """The forward path (a level is active): tangents in, the op (recorded when needed), tangents
    out. Forward AD disabled (a nested guard) falls back to reverse mode with the strict
    requires-grad test."""
    h, p, n = op.handle, op.params(), op.arg_names()
    ret = op.ret_cpp
    inplace = is_inplace(op)
    kind = jvp_kind(r, op)
    diff = [a for a in op.args if a.name in r.diff_args]
    sep = ", " if n else ""
    L = [f"static {ret} forward_{h}({p}) {{",
         f"  const bool need = GradMode::is_enabled() && ({strict});"]
    tan = " || ".join(f"has_tangent({a.name})" for a in diff) or "false"
    if kind == "none":  # jvp = "non_differentiable": outputs get no tangent
        L.append(f"  if (need) return record_{h}({n}{sep}NoForward{{}});")
        L.append(f"  ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);\n  return {below};\n}}")
        return L
    L.append(f"  if (!detail::autograd_tls().forward_ad || !({tan})) {{")
    L.append(f"    if (need) return record_{h}({n}{sep}NoForward{{}});")
    L.append(f"    ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);\n    return {below};\n  }}")
    if kind == "pending":
        L.append(f'  KILN_FAIL(NotImplemented, "{op.name}: forward-mode AD of this op needs its backward '
                 f'formula, which is not implemented yet");\n}}')
        return L
    for a in diff:
        if a.type == "Tensor[]":
            L.append(f"  const ::std::vector<Tensor> {a.name}_tan = tangents_of({a.name});")
        else:
            L.append(f"  const Tensor {a.name}_tan = tangent_of({a.name});")
    self_name = op.args[0].name if op.args else None
    pre = False
    if inplace and kind == "formula":
        pre = self_by_value(r.row["jvp"])
    elif inplace and kind == "derived":
        pre = self_name in r.used and self_name not in r.shape_only
    if pre:
        L.append(f"  const Tensor {self_name}_pre = clone_for_jvp({self_name});")
    L.append(f"  auto fw = [&](const {ret}& r) {{")
    L.append("    ForwardADDisabledGuard off;")
    if kind == "view":
        rest = [a.name for a in op.args[1:]]
        if r.func.name == "view":
            expr = f"kiln::reshape({self_name}_tan, {', '.join(rest)})"
        else:
            expr = f"ops::{h}::call({', '.join([self_name + '_tan'] + rest)})"
        if op.returns_list:
            L.append(f"    ::std::vector<Tensor> tans = {expr};  // views of the input's tangent")
            L.append("    for (size_t i = 0; i < r.size(); ++i) forward::detail::set_tangent(r[i], tans[i]);")
        else:
            L.append(f"    forward::detail::set_tangent(r, {expr});  // a view of the input's tangent")
    elif kind == "formula":
        used = set(idents(r.row["jvp"]))
        args = []
        for a in op.args:
            args.append(f"{a.name}_pre" if pre and a.name == self_name else a.name)
        args.append(self_name if inplace else "r")
        for a in r.tensor_args:
            if f"{a.name}_t" not in used:
                continue
            if a.name not in r.diff_args:
                raise SystemExit(f"gen_autograd: {r.func.name}: the jvp formula reads {a.name}_t, "
                                 f"but {a.name} is not differentiable")
            if a.type == "Tensor[]":
                L.append(f"    const ::std::vector<Tensor> {a.name}_t = tangents_or_zeros({a.name}_tan, {a.name});")
            else:
                L.append(f"    const Tensor {a.name}_t = tangent_or_zeros({a.name}_tan, {a.name});")
            args.append(f"{a.name}_t")
        call = f"jvp_{r.node}({', '.join(args)})"
        if inplace:
            L.append(f'    set_inplace_tangent({self_name}, {call}, "{op.name}");')
        else:
            L.append(f'    set_output_tangent(r, {call}, "{op.name}");')
    else:  # derived
        L.append(f"    auto node = std::make_shared<{r.node}>();")
        # One edge and one tangent per gradient slot, in the order record_fn collects edges.
        tans = []
        for a in op.args:
            if not a.is_tensor:
                continue
            if a.name not in r.diff_args:
                count = f"{a.name}.size()" if a.type == "Tensor[]" else "1"
                L.append(f"    node->mutable_next_edges().resize(node->num_outputs() + {count});")
                tans.append(("none", count))
            elif a.type == "Tensor[]":
                L.append(f"    for (const Tensor& t : {a.name}_tan) node->mutable_next_edges().push_back(forward_edge(t));")
                tans.append(("list", f"{a.name}_tan"))
            else:
                L.append(f"    node->mutable_next_edges().push_back(forward_edge({a.name}_tan));")
                tans.append(("one", f"{a.name}_tan"))
        L += ["  " + line for line in save_lines(r, op, inplace, forward=True)]
        out = self_name if inplace else "r"
        if op.ret_cpp.startswith("::std::tuple"):
            outs = [f"std::get<{i}>(r)" for i in range(len(op.rets))]
            for i, nm in enumerate(r.out_names):
                if nm in r.used:
                    L.append(f"    node->{nm}_ = SavedVariable(std::get<{i}>(r), false);")
        else:
            outs = [out]
            if "result" in r.used:
                L.append(f"    node->result_ = SavedVariable({out}, false);")
        L.append("    ::std::vector<Tensor> tangents;")
        for how, t in tans:
            if how == "none":
                L.append(f"    tangents.resize(tangents.size() + {t});")
            elif how == "list":
                L.append(f"    tangents.insert(tangents.end(), {t}.begin(), {t}.end());")
            else:
                L.append(f"    tangents.push_back({t});")
        rec = " || ".join(["need"] + [f"requires_grad_of({t})" for how, t in tans if how != "none"])
        L.append(f"    ::std::vector<Tensor> out = derived_jvp(*node, {{{', '.join(outs)}}}, tangents, {rec});")
        for i, o in enumerate(outs):
            if inplace:
                L.append(f'    set_inplace_tangent({self_name}, ::std::move(out[{i}]), "{op.name}");')
            else:
                L.append(f'    set_output_tangent({o}, ::std::move(out[{i}]), "{op.name}");')
    L.append("  };")
    L.append(f"  if (need) return record_{h}({n}{sep}fw);")
    L.append(f"  {ret} r;")
    L.append(f"  {{\n    ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);\n    r = {below};\n  }}")
    L.append("  fw(r);\n  return r;\n}")
    return L


def decompose_kernel(op):
    """Note [Differentiating by decomposition]: a row with derivative = "decompose" (a fused
    backward kernel such as a norm's backward) runs its fast kernel when no gradient is needed, and
    its decomposition (a C++ composition of table ops, each recording itself) when one is: so double
    backward goes through the written-out ops and needs no formula of its own. The same holds for
    forward mode: with a tangent on an input, the decomposition's ops carry it."""
    h, p, n = op.handle, op.params(), op.arg_names()
    tensors = [a for a in op.args if a.is_tensor]
    rg = " || ".join(f"needs_grad({a.name})" for a in tensors) or "false"
    tan = " || ".join(f"has_tangent({a.name})" for a in tensors) or "false"
    below = f"ops::{h}::redispatch(below_autograd(ops::{h}::key_set({n})){', ' if n else ''}{n})"
    return [f"static {op.ret_cpp} autograd_{h}({p}) {{",
            f"  if ((GradMode::is_enabled() && ({rg})) || (detail::autograd_tls().forward_ad && ({tan})))",
            f"    return composite::{op.row['decomposition']}({n});",
            "  ExcludeDispatchKeyGuard guard(DispatchKey::Autograd);",
            f"  return {below};", "}"]


def main():
    out_dir, paths = sys.argv[1], sys.argv[2:]
    ops, rules = optable.load_tables(paths)
    AVAILABLE_HELPERS.update(rules["formula_functions"])
    rows, order, counts = {}, [], {}
    for op in ops:
        rows.setdefault(id(op.row), []).append(op)
        if len(rows[id(op.row)]) == 1:
            order.append(id(op.row))
    # One file per table (autograd_kernels_<table>.cpp), as gen.py splits ops_<table>.cpp: editing
    # one row's formulas recompiles its table's file only (Note [Generated file split] in gen.py).
    C, REG = {}, {}
    PENDING = []
    for rid in order:
        rops = rows[rid]
        row = rops[0].row
        base = rops[0].base
        idx = counts.get(base, 0)
        counts[base] = idx + 1
        c, reg = C.setdefault(rops[0].table, []), REG.setdefault(rops[0].table, [])
        if row["derivative"] == "decompose":
            for op in rops:
                c.extend(decompose_kernel(op))
                c.append("")
                reg.append(f"  m.impl<ops::{op.handle}>(&autograd_{op.handle});")
            continue
        if row["kind"] == "composite" or not isinstance(row["derivative"], dict):
            continue
        if all(v == "non_differentiable" for v in row["derivative"].values()):
            continue
        r = Row(row, rops, f"{camel(base)}Backward{idx}")
        if r.generated:
            c.extend(node_class(r))
        else:
            PENDING.append(f'    {{"{r.func.name}", "{r.missing_text()}"}},')
        if any(jvp_kind(r, op) == "formula" for op in rops):
            c.extend(jvp_formula_fn(r))
        for op in rops:
            c.extend(kernel(r, op))
            c.append("")
            reg.append(f"  m.impl<ops::{op.handle}>(&autograd_{op.handle});")
    os.makedirs(out_dir, exist_ok=True)
    for table in sorted({op.table for op in ops}):
        L = [f"// Generated by tensor/ops/gen_autograd.py from {table}.toml's derivative formulas. Do not edit.",
             '#include <cmath>\n', '#include "autograd_support.h"',
             f'#include "kiln/generated/composite/{table}.h"',
             f'#include "kiln/generated/ops/{table}.h"\n',
             "namespace kiln::autograd {\nnamespace {\n"]
        L += C.get(table, [])
        L.append("}  // namespace\n")
        L.append("KILN_LIBRARY(Autograd, m) {")
        L += REG.get(table, [])
        L.append("}\n\n}  // namespace kiln::autograd")
        optable.write_if_changed(os.path.join(out_dir, f"autograd_kernels_{table}.cpp"), "\n".join(L) + "\n")
    P = ["// Generated by tensor/ops/gen_autograd.py: the rows whose formulas it could not compile. Do not edit.",
         '#include "autograd_support.h"\n', "namespace kiln::autograd {\n",
         "const std::vector<PendingDerivative>& pending_derivatives() {",
         "  static const std::vector<PendingDerivative> kPending = {"] + PENDING + [
         "  };\n  return kPending;\n}\n", "}  // namespace kiln::autograd"]
    optable.write_if_changed(os.path.join(out_dir, "autograd_pending.cpp"), "\n".join(P) + "\n")


if __name__ == "__main__":
    main()
