"""kiln.utils: activation checkpointing (kiln.utils.checkpoint) and data loading (kiln.utils.data).

    from kiln.utils.checkpoint import checkpoint
    y = checkpoint(block, x, use_reentrant=False)
"""
import importlib

from kiln.utils import checkpoint  # noqa: F401


def __getattr__(name):
    # kiln.utils.data is imported on first use.
    if name == "data":
        return importlib.import_module("kiln.utils.data")
    raise AttributeError(f"module 'kiln.utils' has no attribute '{name}'")
