"""The examples' code and data for tests: load_example("chargpt") imports examples/chargpt.py
as a module; digits() gives examples/digits.py and its train / held-out split of scikit-learn's
digits, exporting the data into build/data/digits first when it is missing."""
import importlib.util
import os
import subprocess
import sys

import numpy as np

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_example(name):
    spec = importlib.util.spec_from_file_location(f"{name}_example",
                                                  os.path.join(ROOT, "examples", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def digits():
    """(examples/digits.py as a module, (x_train, y_train, x_test, y_test))."""
    data = os.path.join(ROOT, "build", "data", "digits")
    if not os.path.exists(os.path.join(data, "y.npy")):
        subprocess.run([sys.executable, os.path.join(ROOT, "examples", "digits",
                                                     "export_digits.py"), data], check=True)
    mod = load_example("digits")
    x = kiln.from_numpy(np.load(os.path.join(data, "X.npy")))
    y = kiln.from_numpy(np.load(os.path.join(data, "y.npy")))
    return mod, mod.split(x, y)
