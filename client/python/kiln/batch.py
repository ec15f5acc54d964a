"""kiln.batch: batch jobs, which a coordinator runs to the end with no client attached (DESIGN.md
"Batch job"). save_job captures one training step, writes the state it starts from as a
distributed checkpoint, and writes a spec file that `kiln submit --batch SPEC` queues.

    model = kiln.nn.Sequential(kiln.nn.Linear(8, 32), kiln.nn.GELU(), kiln.nn.Linear(32, 4))
    opt = kiln.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad(set_to_none=True)        # first: the step reads no .grad of the last one
        loss = kiln.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        for p in model.parameters():           # data parallel: average the gradients
            p.grad = kiln._C.all_reduce(p.grad, "avg", "world")
        opt.step()
        return loss

    step(x, y)                                 # once eagerly, so that AdamW's state exists
    kiln.batch.save_job("job.spec", step, {"x": x, "y": y},
                        {"model": model.state_dict(), "optim": opt.state_dict()},
                        data_file="data.safetensors", batch_size=64, steps=1000,
                        init_checkpoint="ckpt/init", world_size=2)

`data` holds example tensors of one rank's batch (batch_size // world_size rows), named as the
tensors of `data_file` (a safetensors file) that the workers read their rows from: rank r of W
takes rows [k*B + r*B/W, k*B + (r+1)*B/W) of global batch k, wrapping around the file's rows.
`state` is a nested state dict as kiln.distributed.checkpoint takes it; every tensor the step
reads (parameters, buffers, optimizer state) must be in it, and each is restored and checkpointed
by its name there. The step runs on each worker as one captured graph (See Note [Exported steps]
in kiln/compiler/export.h): its in-place updates of the state carry training from one step to the
next. Collectives are the functional ones (kiln._C.all_reduce, all_gather_into_tensor, ...) on
group "world", the gang of workers. What a replay could not reproduce is refused with what to
change: reading a tensor's value (item(), print), a first optimizer step (run one eagerly),
gradients left over from the last step (zero_grad(set_to_none=True) first), an explicit
Generator. Random ops on the default generator (dropout, randn, ...) draw fresh numbers every step
and rank from `seed`: run k on rank r of W draws what an eager run of the step would with the
default generator at (seed, ((k - 1) * W + r) * load_job(path)["rng_count"]) (Note [Random batch
steps] in worker/src/batch.h), so a restarted job draws what the uninterrupted one did. The spec
records `world_size`, so `kiln submit --min-workers M` may restart the job on fewer workers, each
data-parallel rank keeping its rows (Note [Elastic batch jobs]).

A step on a device mesh (tensor parallel within data parallel; Note [Batch jobs on a mesh] in
worker/src/batch.h): every rank of a real process group of the mesh's size (`kiln run --nproc N`)
calls save_job with the same arguments and `mesh=`. The first mesh dim splits the batch (`data`
then holds batch_size // mesh.size(0) rows); DTensor state is checkpointed as its shards. The step
may run collectives over its mesh dims' groups; where ranks capture different programs (a
row-wise layer's bias is added on one rank of its group), each rank replays its own:

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    dp = mesh.get_group("dp").name

    def step(x, y):
        loss = kiln.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():           # average the gradients' shards over "dp"
            g = p.grad
            p.grad = DTensor.from_local(kiln._C.all_reduce(g.to_local(), "avg", dp),
                                        g.device_mesh, g.placements)
        opt.step()
        opt.zero_grad(set_to_none=True)        # last: a DTensor's .grad is not the program's
        return loss

    kiln.batch.save_job("job.spec", step, {"x": x, "y": y}, state, mesh=mesh, ...)
"""
import os

from kiln import _C
from kiln._creation import tensor as _tensor
from kiln.distributed.checkpoint import _split
import kiln.distributed as dist
import kiln.distributed.checkpoint as dcp
from kiln.autograd.grad_mode import no_grad

__all__ = ["save_job", "load_job"]


def _positive_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"kiln.batch.save_job: {name} must be a positive int, got {v!r}")
    return v


def _outputs(out):
    """The step's result as a list of tensors, the loss first."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not isinstance(outs[0], _C.Tensor) or outs[0].numel() != 1:
        got = type(outs[0]).__name__ if outs else "an empty sequence"
        if outs and isinstance(outs[0], _C.Tensor):
            got = f"a tensor of shape {list(outs[0].shape)}"
        raise ValueError(f"kiln.batch.save_job: the step must return the loss (a one-element "
                         f"tensor) or a tuple that begins with it, got {got}")
    return [o for o in outs if isinstance(o, _C.Tensor)]


def _check_mesh(mesh, world_size):
    """The mesh's dim names and sizes, and its groups' names on this rank -> their dims."""
    from kiln.distributed.device_mesh import DeviceMesh
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"kiln.batch.save_job: mesh must be a DeviceMesh, got "
                        f"{type(mesh).__name__}")
    if not dist.is_initialized() or dist.get_backend() == "fake":
        raise RuntimeError("kiln.batch.save_job: a step on a mesh is saved by every rank of a real "
                           "process group of the mesh's size (`kiln run --nproc N`), which "
                           "checkpoints its shards")
    names, shape = mesh.mesh_dim_names, list(mesh.shape)
    if not names:
        raise ValueError("kiln.batch.save_job: the mesh needs mesh_dim_names (the workers rebuild "
                         "it by name)")
    size = mesh.size()
    if size != dist.get_world_size() or world_size not in (1, size):
        raise ValueError(f"kiln.batch.save_job: the mesh has {size} ranks, the process group "
                         f"{dist.get_world_size()}" + ("" if world_size == 1 else
                                                       f" and world_size is {world_size}"))
    groups = {}
    for d in names:
        g = mesh.get_group(d).name
        if g in groups:
            raise ValueError(f"kiln.batch.save_job: mesh dims '{groups[g]}' and '{d}' share the "
                             f"group '{g}'")
        groups[g] = d
    return list(names), shape, groups


def _raise_on_every_rank(error, what):
    """Raises `error` where it happened, and a RuntimeError naming that rank on the others (one
    all-reduce: no rank is left waiting in a collective the failed one never joins)."""
    failed = _tensor([dist.get_rank() if error is not None else -1], dtype=_C.int64)
    dist.all_reduce(failed, dist.ReduceOp.MAX)
    if error is not None:
        raise error
    if failed.item() >= 0:
        raise RuntimeError(f"kiln.batch.save_job: rank {failed.item()} could not {what}; see its "
                           f"error")


def _gather_bytes(b):
    """Every rank's `b`, in rank order (a collective)."""
    n = dist.get_world_size()
    size = _tensor([len(b)], dtype=_C.int64)
    sizes = _C.empty([n], dtype=_C.int64)
    dist.all_gather_into_tensor(sizes, size)
    most = int(sizes.max().item())
    mine = _C.zeros([most], dtype=_C.uint8)
    mine[:len(b)] = _tensor(list(b), dtype=_C.uint8)
    every = _C.empty([n * most], dtype=_C.uint8)
    dist.all_gather_into_tensor(every, mine)
    flat = every.tolist()
    return [bytes(flat[r * most:r * most + int(sizes[r].item())]) for r in range(n)]


def save_job(path, step, data, state, *, data_file, batch_size, steps, init_checkpoint,
             world_size=1, seed=0, mesh=None):
    """Writes the batch job spec `path` and its initial checkpoint `init_checkpoint` (module
    docstring); one process calls it, or with `mesh` every rank of its process group. Runs
    `step(*data.values())` once under capture; `state`'s tensors are put back as they were before
    it returns (the parameters' .grad and any tensor not in `state` are left as the step left
    them)."""
    batch_size = _positive_int("batch_size", batch_size)
    steps = _positive_int("steps", steps)
    world_size = _positive_int("world_size", world_size)
    mesh_names, mesh_shape, groups = _check_mesh(mesh, world_size) if mesh is not None \
        else ([], [], {})
    split = mesh_shape[0] if mesh is not None else world_size
    if batch_size % split:
        raise ValueError(f"kiln.batch.save_job: batch_size {batch_size} is not a multiple of "
                         + (f"the mesh's first dim ('{mesh_names[0]}', {split})" if mesh
                            is not None else f"world_size {world_size}"))
    if not isinstance(data, dict) or not data:
        raise TypeError("kiln.batch.save_job: data must be a non-empty dict of name -> Tensor")
    rows = batch_size // split
    for name, t in data.items():
        if not isinstance(name, str) or not isinstance(t, _C.Tensor):
            raise TypeError(f"kiln.batch.save_job: data must map str to Tensor, got {name!r}: "
                            f"{type(t).__name__}")
        if t.dim() == 0 or t.shape[0] != rows:
            raise ValueError(f"kiln.batch.save_job: data '{name}' has shape {list(t.shape)}; one "
                             f"rank's batch has {rows} rows (batch_size {batch_size} over "
                             f"{split} ranks)")
    if not isinstance(state, dict):
        raise TypeError("kiln.batch.save_job: state must be a (nested) dict, as "
                        "kiln.distributed.checkpoint takes it")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"kiln.batch.save_job: seed must be an int in [0, 2**64), got {seed!r}")
    if mesh is None and dist.is_initialized() and dist.get_backend() == "fake":
        raise RuntimeError("kiln.batch.save_job: the default process group is a fake one, under "
                           "which the initial checkpoint cannot be saved (dcp.save moves no data "
                           "through it); destroy it first: save_job makes its own fake group of "
                           "world_size for the capture")
    tensors, _ = _split(state)
    path = os.fspath(path)
    # The step's collectives resolve group "world" (the workers' gang): a fake group of the job's
    # size lets them run here, once, on this process's tensors.
    fake = mesh is None and world_size > 1 and not dist.is_initialized()
    if fake:
        dist.init_process_group("fake", rank=0, world_size=world_size, group_name="world")
    with no_grad():
        saved = [t.clone() for t in tensors.values()]
    error = None
    try:
        # Fresh contiguous copies of the examples: a worker binds its rows as such tensors.
        examples = [t.detach().contiguous().clone() for t in data.values()]
        spec = _C._batch_job_bytes(lambda xs: _outputs(step(*xs)), examples,
                                   list(tensors), list(tensors.values()), list(data), 0,
                                   os.path.abspath(os.fspath(init_checkpoint)),
                                   os.path.abspath(os.fspath(data_file)), batch_size, steps, seed,
                                   mesh_names, mesh_shape, groups,
                                   mesh.size() if mesh is not None else world_size)
    except Exception as e:
        if mesh is None:
            raise
        error = e  # the other ranks learn of it below, instead of waiting in a collective
    finally:
        with no_grad():  # the capture ran the step once: put the state back as it was
            for t, s in zip(tensors.values(), saved):
                t.copy_(s)
        if fake:
            dist.destroy_process_group()
    if mesh is not None:  # rank 0 writes every rank's step (Note [Batch jobs on a mesh])
        _raise_on_every_rank(error, "capture the step")
        specs = _gather_bytes(spec)
        spec = None
        if dist.get_rank() == 0:
            try:
                spec = _C._batch_job_merge(specs)
            except ValueError as e:
                error = e
    # The spec goes to a temporary file first, so that an unwritable path fails before the
    # checkpoint is written, and the spec appears (atomically) only once the checkpoint exists.
    # On a mesh, rank 0 writes it, and every rank saves its shards.
    writer = mesh is None or dist.get_rank() == 0
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        if writer and error is None:
            try:
                with open(tmp, "wb") as f:
                    f.write(spec)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                error = e
        if mesh is not None:
            _raise_on_every_rank(error, f"write the spec {path!r}")
        if error is not None:
            raise error
        dcp.save(state, checkpoint_id=init_checkpoint)
        if writer:
            os.replace(tmp, path)
        if mesh is not None:
            dist.barrier()
    except BaseException:
        if writer and os.path.exists(tmp):
            os.remove(tmp)
        raise


def load_job(path):
    """A summary of the spec in `path`: steps, batch_size, seed, mesh ([(dim, size), ...], empty
    for a data-parallel job), programs (distinct per-rank steps, 1 when every rank runs rank 0's;
    the rest of the summary is rank 0's), rng_count (the random counters
    one run of the step draws: Note [Random batch steps]), loss (the graph output reported
    as the loss, or -1), init_checkpoint, data (the data file), inputs (per graph input:
    ("state", name), ("data", name) or ("constant", None) for a number the graph holds), nodes
    and outputs (counts), ops (op name -> how many nodes run it)."""
    with open(os.fspath(path), "rb") as f:
        return _C._batch_job_summary(f.read())
