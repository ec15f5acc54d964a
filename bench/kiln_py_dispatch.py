"""The dispatch workloads of shared/bench/WORKLOADS.md from Python (impl "kiln-py"): the operator
`c = a + b` on 1-element tensors, no grad, and `c = a * b` with a.requires_grad. Best of several
repetitions after a warm-up, like bench/kiln_bench.cpp.
    PYTHONPATH=build/python .venv/bin/python bench/kiln_py_dispatch.py [--quick]"""
import json
import sys
import timeit

import kiln


def best_ns(stmt, env, number, repeat):
    timeit.timeit(stmt, globals=env, number=number)  # warm-up
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=repeat)) / number * 1e9


def main():
    quick = "--quick" in sys.argv
    number, repeat = (20000, 5) if quick else (100000, 15)
    a, b = kiln.ones(1), kiln.ones(1)
    g = kiln.ones(1, requires_grad=True)
    for metric, stmt, env in [("add_1elem", "a + b", {"a": a, "b": b}),
                              ("mul_1elem_requires_grad", "g * b", {"g": g, "b": b})]:
        print(json.dumps({"workload": "dispatch", "metric": metric,
                          "value": round(best_ns(stmt, env, number, repeat), 1), "unit": "ns/op",
                          "impl": "kiln-py"}))


if __name__ == "__main__":
    main()
