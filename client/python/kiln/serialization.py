"""kiln.save / kiln.load: tensors on disk without pickle.

    kiln.save(model.state_dict(), "model.safetensors")       # dict of str -> Tensor: one file
    sd = kiln.load("model.safetensors")
    kiln.save({"model": model.state_dict(), "optimizer": opt_tensors,
               "step": 100, "loader": {"epoch": 2}}, "runs/ckpt")  # a training checkpoint
    ckpt = kiln.load("runs/ckpt")                              # the same dict back

A dict of str -> Tensor is written as one safetensors file (Hugging Face's format; readable by
the `safetensors` package). Any other dict is a training checkpoint, written atomically into a
directory by kiln/nn/checkpoint.h (Note [Atomic checkpoints]): every value that is a non-empty
dict of str -> Tensor is a group of tensors, everything else is metadata stored as JSON (so it
must be JSON-able: numbers, strings, bools, None, lists and dicts with str keys; tuples come back
as lists).
"""
import json
import os

from kiln import _C
from kiln._C import Tensor

__all__ = ["save", "load"]


def _path(f, what):
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    raise TypeError(f"kiln.{what}: expected a path (str or os.PathLike), got {type(f).__name__}; "
                    "file objects are not supported")


def _is_tensor_dict(obj):
    return isinstance(obj, dict) and all(isinstance(k, str) and isinstance(v, Tensor)
                                         for k, v in obj.items())


def _find_tensor(obj, where):
    """The place of a Tensor nested inside metadata, or None."""
    if isinstance(obj, Tensor):
        return where
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for k, v in items:
        found = _find_tensor(v, f"{where}[{k!r}]")
        if found:
            return found
    return None


def _reraise(e, path):
    """e again, as its base ValueError or RuntimeError (a subclass such as UnicodeDecodeError
    takes other constructor arguments), with the path in its message."""
    msg = str(e)
    if path not in msg:
        msg = f"{path}: {msg}"
    raise (ValueError if isinstance(e, ValueError) else RuntimeError)(msg) from e


def save(obj, f, metadata=None):
    """Writes obj to f: a dict of str -> Tensor as a safetensors file (with `metadata`, a dict of
    str -> str, in its header), any other dict as a training checkpoint directory."""
    path = _path(f, "save")
    if not isinstance(obj, dict):
        raise TypeError(f"kiln.save: expected a dict (a state dict of str -> Tensor, or a training "
                        f"checkpoint), got {type(obj).__name__}; wrap a single tensor as "
                        "{'name': tensor}")
    if _is_tensor_dict(obj) and obj:
        meta = metadata or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise TypeError("kiln.save: metadata must be a dict of str -> str")
        try:
            return _C._save_safetensors(path, obj, meta)
        except (ValueError, RuntimeError) as e:
            _reraise(e, path)
    if metadata is not None:
        raise TypeError("kiln.save: metadata= applies to state dicts (dicts of str -> Tensor); "
                        "a training checkpoint keeps its metadata in the dict itself")
    groups, rest = {}, {}
    for k, v in obj.items():
        if not isinstance(k, str):
            raise TypeError(f"kiln.save: checkpoint keys must be str, got {k!r}")
        if _is_tensor_dict(v) and v:
            groups[k] = v
            continue
        where = _find_tensor(v, repr(k))
        if where:
            raise TypeError(f"kiln.save: the Tensor at {where} is not in a group; tensors must be "
                            "values of a top-level dict of str -> Tensor")
        rest[k] = v
    try:
        meta_json = json.dumps(rest)
    except (TypeError, ValueError) as e:
        raise TypeError(f"kiln.save: checkpoint metadata must be JSON-able: {e}") from None
    try:
        _C._save_checkpoint(path, groups, meta_json)
    except (ValueError, RuntimeError) as e:
        _reraise(e, path)


def load(f, map_location=None, weights_only=True):
    """Reads what save wrote: a dict of str -> Tensor from a safetensors file, or the training
    checkpoint dict from a directory. map_location moves every tensor to that device.
    weights_only is accepted for torch compatibility: nothing but tensors and JSON is ever read."""
    del weights_only
    path = _path(f, "load")
    if not os.path.exists(path):
        raise FileNotFoundError(f"kiln.load: no such file or directory: '{path}'")
    try:
        if os.path.isdir(path):
            groups, meta_json = _C._load_checkpoint(path)
            out = json.loads(meta_json)
            out.update(groups)
        else:
            out, _ = _C._load_safetensors(path)
    except (ValueError, RuntimeError) as e:
        _reraise(e, path)
    if map_location is not None:
        out = _to_device(out, map_location)
    return out


def _to_device(obj, device):
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj
