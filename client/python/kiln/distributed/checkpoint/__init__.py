"""kiln.distributed.checkpoint: distributed checkpoints (torch.distributed.checkpoint). Every rank
writes its own shards; a checkpoint loads into any mesh and any placements, bit for bit.

    import kiln.distributed.checkpoint as dcp
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 100}
    dcp.save(state, checkpoint_id="ckpt/step100")      # every rank calls it
    dcp.load(state, checkpoint_id="ckpt/step100")      # in place: tensors, and the other values

A state dict may nest dicts and lists. Its tensors (DTensors or plain; a key's path joined with
".") go into the shards; everything else (ints, floats, strings, ...) must be JSON values and is
stored in the checkpoint's metadata, each rank's own, then put back in place by load(): a rank
gets its own values back when as many ranks load as saved (a per-rank RNG state, say), else rank
0's. The format, atomicity and
resharding are Note [Distributed checkpoint format] in kiln/dist/checkpoint.h.
"""
import json
import os
from collections import namedtuple

from kiln import _C

__all__ = ["save", "async_save", "load", "LoadResult", "SaveFuture", "dcp_to_safetensors",
           "safetensors_to_dcp"]

LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])


def _has_tensor(obj):
    if isinstance(obj, _C.Tensor):
        return True
    if isinstance(obj, dict):
        return any(_has_tensor(v) for v in obj.values())
    return isinstance(obj, (list, tuple)) and any(_has_tensor(v) for v in obj)


def _leaves(obj, prefix=""):
    """(path, container, key, value) of every leaf of a nested state: dicts are walked, and lists
    that hold tensors; any other value is one leaf."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for k, v in items:
        path = f"{prefix}{k}"
        if isinstance(v, dict) or (isinstance(v, list) and _has_tensor(v)):
            yield from _leaves(v, path + ".")
        else:
            yield path, obj, k, v


def _split(state):
    tensors, values = {}, {}
    for path, _, _, v in _leaves(state):
        if path in tensors or path in values:  # {"a.b": x} beside {"a": {"b": y}}, 0 and "0"
            raise ValueError(f"checkpoint: two entries of the state dict have the path {path!r}")
        if isinstance(v, _C.Tensor):
            tensors[path] = v
        else:
            values[path] = v
    return tensors, values


def _extra(values):
    try:
        return json.dumps({"values": values}, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"checkpoint.save: a value that is not a tensor must be JSON data "
                        f"(finite numbers, strings, lists, dicts): {e}") from None


def save(state_dict, *, checkpoint_id):
    """Writes `state_dict` into the directory `checkpoint_id` (every rank calls it; atomic)."""
    tensors, values = _split(state_dict)
    _C._dcp_save(list(tensors), list(tensors.values()), os.fspath(checkpoint_id), _extra(values))


class SaveFuture:
    """An async_save in flight: result() waits for its commit (raising its error), done() asks."""

    def __init__(self, f):
        self._f = f

    def result(self):
        self._f.wait()

    def done(self):
        return self._f.done()


def async_save(state_dict, *, checkpoint_id):
    """save() with the writing in the background: returns once this rank's tensors are copied to
    host memory (a Partial DTensor reduced first, collectively); the files are written and
    committed by a thread. A later save or async_save waits for it."""
    tensors, values = _split(state_dict)
    return SaveFuture(_C._dcp_async_save(list(tensors), list(tensors.values()),
                                         os.fspath(checkpoint_id), _extra(values)))


def load(state_dict, *, checkpoint_id, strict=True):
    """Fills `state_dict` in place from `checkpoint_id`, resharding each tensor to its own mesh
    and placements. strict: missing or unexpected keys are a ValueError; otherwise they are
    returned (LoadResult)."""
    tensors, values = _split(state_dict)
    if strict:  # every key checked before anything is written into the state
        try:
            with open(os.path.join(os.fspath(checkpoint_id), ".metadata")) as f:
                meta = json.load(f)
            names = set(meta["tensors"]) | set(meta["extra"].get("values", {}))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            names = None  # the C++ side names what is wrong with the checkpoint
        if names is not None:
            mine = set(tensors) | set(values)
            if mine != names:
                raise ValueError(f"checkpoint.load: '{os.fspath(checkpoint_id)}' does not match "
                                 f"the state: missing keys {sorted(mine - names)}, unexpected "
                                 f"keys {sorted(names - mine)}")
    missing, unexpected, extra = _C._dcp_load(list(tensors), list(tensors.values()),
                                              os.fspath(checkpoint_id), strict)
    saved = json.loads(extra).get("values", {})
    missing += [p for p in values if p not in saved]
    unexpected += [p for p in saved if p not in values and p not in tensors]
    if strict and (missing or unexpected):
        raise ValueError(f"checkpoint.load: '{os.fspath(checkpoint_id)}' does not match the "
                         f"state: missing keys {sorted(missing)}, unexpected keys "
                         f"{sorted(unexpected)}")
    for path, container, key, v in list(_leaves(state_dict)):
        if not isinstance(v, _C.Tensor) and path in saved:
            container[key] = saved[path]
    return LoadResult(sorted(missing), sorted(unexpected))


def dcp_to_safetensors(checkpoint_id, file):
    """The checkpoint in `checkpoint_id` as one safetensors `file` (its tensors only), assembled a
    tensor at a time, never the whole model in memory."""
    _C._dcp_to_safetensors(os.fspath(checkpoint_id), os.fspath(file))


def safetensors_to_dcp(file, checkpoint_id, shards=1):
    """A safetensors `file` as a checkpoint in `checkpoint_id`, each tensor split by rows over
    `shards` files, read a tensor at a time; load() reshards it to any mesh."""
    _C._dcp_from_safetensors(os.fspath(file), os.fspath(checkpoint_id), int(shards))
