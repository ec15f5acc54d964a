"""kiln.distributed: process groups and collectives between processes (torch.distributed).

    # kiln run --nproc 2 .venv/bin/python train.py
    import kiln, kiln.distributed as dist
    dist.init_process_group("ucx")                  # env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    t = kiln.ones(4)
    dist.all_reduce(t)                              # in place: t == world size
    work = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)
    work.wait()
    dist.destroy_process_group()

Tensors must be contiguous CPU tensors (the UCX backend). A collective that cannot finish within
the group's timeout (a dead or stuck peer) raises RuntimeError on every rank waiting for it.
"""
from datetime import timedelta

from kiln import _C

if _C._client_only:
    raise ImportError("kiln.distributed: this is the client-only build of Kiln (KILN_CLIENT_ONLY), "
                      "which has no process groups; run collectives on a coordinator's gang "
                      "(kiln.connect(..., workers=N)) or use the full build")

Work = _C._Work
ProcessGroup = _C._ProcessGroup
TCPStore = _C._TCPStore

__all__ = ["ReduceOp", "Work", "ProcessGroup", "TCPStore", "GroupMember", "is_available",
           "init_process_group", "is_initialized", "destroy_process_group", "new_group",
           "get_rank", "get_world_size", "get_backend", "all_reduce", "broadcast",
           "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "send", "recv",
           "barrier"]


class ReduceOp:
    """The reduce ops (torch.distributed.ReduceOp); each is the op's name as the C++ API takes it."""
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


class GroupMember:
    WORLD = None  # the default group, as in torch.distributed.GroupMember.WORLD


_backend = None


def is_available():
    return True


def _seconds(timeout):
    if timeout is None:
        return None
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def init_process_group(backend="ucx", init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="world"):
    """Creates the default group. init_method "env://" (the default) reads RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT; with a store (a TCPStore), rank and world_size are given."""
    global _backend
    if backend == "fake":  # one process plays `rank` of `world_size`; collectives only count bytes
        if rank < 0 or world_size < 1:
            raise ValueError("init_process_group('fake'): pass rank and world_size")
        pg = _C._init_process_group("fake", "", rank, world_size, None, _seconds(timeout),
                                    group_name)
        _backend = "fake"
        return pg
    if backend not in ("ucx", "gloo", "cpu:ucx"):
        raise ValueError(f"init_process_group: backend '{backend}' is not available; Kiln has 'ucx' "
                         "on the CPU ('gloo' is accepted as an alias) and 'fake'")
    if init_method is None:
        init_method = "env://" if store is None else ""
    if store is not None and (rank < 0 or world_size < 1):
        raise ValueError("init_process_group: a store needs rank and world_size")
    if init_method not in ("env://", ""):
        raise ValueError(f"init_process_group: init_method '{init_method}' is not supported; use "
                         "'env://' (kiln run sets the environment) or pass a TCPStore as store=")
    pg = _C._init_process_group("ucx", init_method, rank, world_size, store,
                                _seconds(timeout), group_name)
    _backend = "ucx"
    return pg


def is_initialized():
    return _C._is_initialized()


def destroy_process_group(group=None):
    global _backend
    if group is not None and group is not _C._default_group():
        raise ValueError("destroy_process_group: only the default group can be destroyed "
                         "(it destroys every group)")
    _C._destroy_process_group()
    _backend = None


def _group(group):
    return _C._default_group() if group is None else group


def new_group(ranks=None, timeout=None, backend=None, group_name=""):
    """A subgroup of the world; every rank must call it, in the same order. Non-members get None
    (PyTorch returns a non-member object; using it there is an error either way)."""
    if ranks is None:
        ranks = list(range(get_world_size()))
    return _C._new_group(sorted(ranks), _seconds(timeout), group_name)


def get_rank(group=None):
    """This process's rank in `group` (the world by default); -1 when not a member."""
    if group is None and not is_initialized():
        raise RuntimeError("Default process group has not been initialized, please make sure to "
                           "call init_process_group.")
    return _group(group).rank()


def get_world_size(group=None):
    if group is None and not is_initialized():
        raise RuntimeError("Default process group has not been initialized, please make sure to "
                           "call init_process_group.")
    return _group(group).size()


def get_backend(group=None):
    _group(group)
    return _backend


def _finish(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return _finish(_group(group).all_reduce(tensor, op), async_op)


def broadcast(tensor, src, group=None, async_op=False):
    """src is a global rank, as in PyTorch."""
    g = _group(group)
    return _finish(g.broadcast(tensor, _group_rank(g, src)), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    return _finish(_group(group).all_gather_into_tensor(output_tensor, input_tensor), async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    return _finish(_group(group).reduce_scatter_tensor(output, input, op), async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    work = _group(group).all_to_all_single(output, input, list(output_split_sizes or []),
                                           list(input_split_sizes or []))
    return _finish(work, async_op)


def _group_rank(g, global_rank):
    ranks = list(g.ranks)
    if global_rank not in ranks:
        raise ValueError(f"rank {global_rank} is not a member of group '{g.name}' (ranks {ranks})")
    return ranks.index(global_rank)


def send(tensor, dst, group=None, tag=0):
    g = _group(group)
    g.send(tensor, _group_rank(g, dst), tag).wait()


def recv(tensor, src, group=None, tag=0):
    g = _group(group)
    g.recv(tensor, _group_rank(g, src), tag).wait()
    return src


def isend(tensor, dst, group=None, tag=0):
    g = _group(group)
    return g.send(tensor, _group_rank(g, dst), tag)


def irecv(tensor, src, group=None, tag=0):
    g = _group(group)
    return g.recv(tensor, _group_rank(g, src), tag)


def barrier(group=None, async_op=False):
    return _finish(_group(group).barrier(), async_op)
