#!/usr/bin/env python3
"""Checks that tensor/ops/gen.py refuses bad op-table rows (missing fields, unknown rules,
formulas naming unknown identifiers, bad schemas) with a message naming the row, and accepts a
good one and one that leaves out every field with a default. Run by ctest; prints 'N passed, N failed'."""
import os
import subprocess
import sys
import tempfile

GEN = os.path.join(os.path.dirname(__file__), "..", "..", "tensor", "ops", "gen.py")

GOOD = '''
[[op]]
schema = "myop(Tensor self, int dim=0) -> Tensor"
kind = "kernel"
tags = ["pointwise"]
dtypes = { cpu = "floating" }
meta = "myop"
derivative = { self = "grad * dim" }
jvp = "derived"
batching = "pointwise"
autocast = "none"
sharding = "pointwise"
decomposition = "none"
'''

CASES = [
    ("missing derivative", GOOD.replace('derivative = { self = "grad * dim" }\n', ""),
     "missing required field 'derivative'"),
    ("unknown batching rule", GOOD.replace('batching = "pointwise"', 'batching = "magic"'),
     "batching 'magic' is not a known rule"),
    ("unknown sharding rule", GOOD.replace('sharding = "pointwise"', 'sharding = "nope"'),
     "sharding 'nope' is not a known rule"),
    ("formula with unknown name", GOOD.replace('"grad * dim"', '"grad * undefined_helper(dim)"'),
     "uses unknown name 'undefined_helper'"),
    ("derivative misses an input", GOOD.replace("Tensor self, int dim=0", "Tensor self, Tensor other"),
     "no formula for input 'other'"),
    ("unknown field", GOOD + 'colour = "blue"\n', "unknown field 'colour'"),
    ("unnamed returns", GOOD.replace("-> Tensor", "-> (Tensor, Tensor)"),
     "a row with several returns names each one"),
    ("unknown tag", GOOD.replace('tags = ["pointwise"]', 'tags = ["shiny"]'), "unknown tag 'shiny'"),
    ("bad schema type", GOOD.replace("int dim=0", "complex dim"), "unknown argument type 'complex'"),
    ("unknown dtype set", GOOD.replace('"floating"', '"quaternions"'), "unknown dtype set 'quaternions'"),
    ("composite without decomposition", GOOD.replace('kind = "kernel"', 'kind = "composite"'),
     "a composite row needs a decomposition"),
    ("decompose without a decomposition",
     GOOD.replace('derivative = { self = "grad * dim" }', 'derivative = "decompose"'),
     "derivative 'decompose' is for a non-composite row"),
    ("composite batching on a kernel row", GOOD.replace('batching = "pointwise"', 'batching = "composite"'),
     "batching 'composite' runs the row's decomposition: only for composite rows"),
    ("shared formula naming a non-input",
     GOOD.replace('derivative = { self = "grad * dim" }', 'derivative = { "self, other" = "grad" }'),
     "derivative names 'self, other', which is not a Tensor input"),
    ("input with two formulas",
     GOOD.replace("Tensor self, int dim=0", "Tensor self, Tensor other").replace(
         'derivative = { self = "grad * dim" }',
         'derivative = { "self, other" = "grad", other = "grad" }'),
     "derivative gives 'self, other' more than one formula"),
    ("duplicate op", GOOD + GOOD, "op 'myop' already defined"),
    ("no batching and no default for it",
     GOOD.replace('tags = ["pointwise"]', "tags = []").replace('batching = "pointwise"\n', ""),
     "missing required field 'batching' (no default in rules.toml"),
]

# The row with every field that has a default left out (Note [Row defaults]): a pointwise
# structured row gets pointwise batching and sharding, no autocast, a derived jvp, no
# decomposition, and its name as meta function.
MINIMAL = "".join(l + "\n" for l in GOOD.split("\n") if l.split(" = ")[0] not in (
    "meta", "jvp", "batching", "autocast", "sharding", "decomposition"))


# A row mutating every element of a list and returning nothing (the fused optimizer steps).
LIST_MUTATION = (GOOD.replace("myop(Tensor self, int dim=0) -> Tensor",
                              "mystep_(Tensor(a!)[] self, Tensor[] grads, *, float lr) -> ()")
                 .replace('derivative = { self = "grad * dim" }', 'derivative = "non_differentiable"'))


def run(table_text, generated=None):
    """Runs gen.py on one table; with `generated`, also returns that generated file's text."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.toml")
        with open(path, "w") as f:
            f.write(table_text)
        r = subprocess.run([sys.executable, GEN, os.path.join(d, "out"), path],
                           capture_output=True, text=True)
        if generated is None:
            return r.returncode, r.stderr
        out = os.path.join(d, "out", generated)
        text = open(out).read() if os.path.exists(out) else ""
        return r.returncode, r.stderr, text


def main():
    passed = failed = 0
    code, err = run(GOOD)
    if code == 0:
        passed += 1
    else:
        failed += 1
        print(f"FAIL good row rejected: {err}")
    code, err, cpp = run(LIST_MUTATION, "ops_t.cpp")  # per table: ops_<table>.cpp
    bump = "for (const Tensor& t : self) t.impl()->bump_version();"
    if code == 0 and "void ops::mystep_::call(TensorList self" in cpp and bump in cpp \
            and "mystep_(Tensor(a!)[] self, Tensor[] grads, *, float lr) -> ()" in cpp:
        passed += 1
    else:
        failed += 1
        print(f"FAIL Tensor(a!)[] row: exit {code}, stderr: {err.strip()}")
    code, err, cpp = run(MINIMAL, "ops_t.cpp")
    want = ('"derived", BatchingRule::Pointwise, AutocastPolicy::None, ShardingRule::Pointwise, "none"',
            "meta::myop(")
    if code == 0 and all(w in cpp for w in want):
        passed += 1
    else:
        failed += 1
        print(f"FAIL row defaults: exit {code}, stderr: {err.strip()}")
    for name, text, needle in CASES:
        code, err = run(text)
        if code == 1 and needle in err and "t.toml row" in err:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {name}: exit {code}, stderr: {err.strip()}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
