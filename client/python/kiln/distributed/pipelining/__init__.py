"""kiln.distributed.pipelining: pipeline parallelism (torch.distributed.pipelining).

    # kiln run --nproc 2 .venv/bin/python train.py
    import kiln, kiln.distributed as dist, kiln.nn as nn
    from kiln.distributed.pipelining import pipeline, Schedule1F1B
    dist.init_process_group()
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                          nn.Linear(32, 4))
    pipe = pipeline(model, split_points=["2"])          # stage 0: "0", "1"; stage 1: "2".."4"
    stage = pipe.build_stage(dist.get_rank())           # or PipelineStage(module, i, n) by hand
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    losses = []
    if stage.is_first:
        schedule.step(x)                                # the whole batch; split in 4
    else:
        out = schedule.step(target=y, losses=losses)    # the last stage's rank passes the target
    print(schedule.format_actions())                    # every rank's action list
    schedule.export_timeline("pp.json")                 # opens in Perfetto (ui.perfetto.dev)

The schedules, the stages and the runner are C++'s (kiln/dist/pipelining.h: Note [Pipeline
schedules], Note [Pipeline shapes]); this module makes a stage of a kiln.nn.Module. Stage s runs
on rank s % p of the pipeline group (p ranks); ScheduleInterleaved1F1B takes the v stages of this
rank, s = r, r + p, ... Shapes are never written by hand: each stage runs its forward on meta
tensors first. Each microbatch's loss is divided by n_microbatches before its backward, so the
gradients are those of the mean loss over the batch.

On a coordinator's gang (kiln.connect(COORDINATOR, workers=p)), one process drives every
stage: build each with device=session.device (stage s then lives on worker s % p, its parameters
there alone) and give the schedule all of them; each worker runs its own stage's subprogram, in
its rank's order of the schedule, and activations and gradients move worker to worker (Note
[Gang stages] in kiln/client/transport.h, Note [Pipeline controller] in pipelining.h):

    s = kiln.connect(COORDINATOR, workers=2)
    stages = [pipe.build_stage(i, device=s.device) for i in range(pipe.num_stages)]
    schedule = Schedule1F1B(stages, n_microbatches=4, loss_fn=loss_fn)
    schedule.step(x, target=y, losses=losses)   # x, y on the client; losses on the last worker

With group=mesh, a ("pp", "dp") mesh of the gang, stage s runs on the workers at pp coordinate
s % P as data-parallel replicas: the batch is split over them, and after each step their
gradients and losses are averaged (the output is gathered).

A stage may be tensor parallel and fully sharded (3-D parallelism): lay a ("pp", "dp", "tp") mesh
over the ranks, parallelize_module and fully_shard the stage's module over mesh["tp"] and
mesh["dp"], and give the stage group=mesh.get_group("pp"); each dp rank's pipeline takes its
part of the batch. FSDP then gathers the stage's parameters for each microbatch's forward and
backward and reduce-scatters each microbatch's gradients into the shards' .grad, as it would for
m calls of the module; the schedules' UNSHARD and RESHARD actions (fsdp=True) are not used yet.
"""
import json
import weakref
from collections import OrderedDict

from kiln import _C
from kiln.autograd.grad_mode import no_grad
from kiln._C import Tensor
from kiln.nn.containers import Sequential
from kiln.nn.module import Module, plain_forward

__all__ = ["PipelineStage", "pipeline", "Pipe", "SplitPoint", "PipelineScheduleSingle",
           "PipelineScheduleMulti", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
           "ScheduleZBH1", "schedule_actions", "format_actions", "simulate", "bubble_fraction",
           "chrome_trace"]


def _as_list(out):
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (list, tuple)) and all(isinstance(t, Tensor) for t in out):
        return list(out)
    raise TypeError(f"a pipeline stage must return a tensor or a tuple of tensors, not "
                    f"{type(out).__name__}")


def _forward_meta(module, inputs):
    """The module's forward on meta tensors, its parameters and buffers on meta for the call
    (Note [Pipeline shapes]): DTensors (tensor parallel, FSDP) as meta tensors of their global
    shapes, the module run without its hooks (Note [Plain forward] in kiln/nn/module.py)."""
    saved = []
    try:
        with no_grad():
            for m in module.modules():
                for table in (m._parameters, m._buffers):
                    for name, t in list(table.items()):
                        if t is None:
                            continue
                        saved.append((table, name, t))
                        table[name] = _C.empty(list(t.shape), dtype=t.dtype, device="meta")
            with plain_forward():
                return _as_list(module(*inputs))
    finally:
        for table, name, t in saved:
            table[name] = t


def _is_gang_mesh(group):
    from kiln.distributed.device_mesh import DeviceMesh
    return isinstance(group, DeviceMesh) and group.device_type.startswith("remote")


class _Gang:
    """Where a gang pipeline's stages run (Note [Gang stages]). With a device, stage s runs on
    worker s % p of the gang's first p = min(num_stages, gang size) workers. With a mesh of the
    gang (`group=`), along its "pp" dim (else its first): stage s runs on the workers at pp
    coordinate s % P, data-parallel replicas along the mesh's other dim, if any (2-d meshes)."""

    def __init__(self, device, mesh, num_stages):
        if mesh is None:
            self.device = str(device)
            p = min(num_stages, _C._gang_size(self.device))
            self.workers = tuple((r,) for r in range(p))
            self.dp_mesh = None
        else:
            if not _is_gang_mesh(mesh):
                raise ValueError(f"PipelineStage: a stage on a gang takes a mesh of the gang as "
                                 f"its group, not {type(mesh).__name__}")
            if device is not None and str(device) != mesh.device_type:
                raise ValueError(f"PipelineStage: device '{device}' is not the mesh's, "
                                 f"'{mesh.device_type}'")
            if mesh.ndim > 2:
                raise ValueError(f"PipelineStage: a gang pipeline's mesh has a pp dim and at "
                                 f"most one data-parallel dim, got {mesh}")
            self.device = mesh.device_type
            names = mesh.mesh_dim_names or ()
            pp_dim = names.index("pp") if "pp" in names else 0
            ranks = mesh.mesh if mesh.ndim == 2 else [[r] for r in mesh.mesh]
            if pp_dim == 1:
                ranks = [list(col) for col in zip(*ranks)]
            self.workers = tuple(tuple(row) for row in ranks)
            self.dp_mesh = None
            if mesh.ndim == 2 and len(self.workers[0]) > 1:
                self.dp_mesh = mesh[names[1 - pp_dim]] if names else None
                if self.dp_mesh is None:
                    raise ValueError("PipelineStage: name the dims of a 2-d gang mesh "
                                     "(mesh_dim_names=('pp', 'dp'))")
        if num_stages % len(self.workers):
            raise ValueError(f"PipelineStage: {num_stages} stages do not spread evenly over "
                             f"{len(self.workers)} pipeline ranks of the gang")

    def workers_of(self, stage):
        return list(self.workers[stage % len(self.workers)])

    def key(self):
        return (self.device, self.workers)


class PipelineStage:
    """One stage of a pipeline: `submodule` is stage `stage_index` of `num_stages`, run by this
    rank of `group` (the world by default), which must be rank stage_index % group size. On a
    coordinator's gang (device=session.device, or group=a mesh of the gang) one process builds
    every stage, and the stage's tensors go to its workers (See _Gang)."""

    def __init__(self, submodule, stage_index, num_stages, device=None, group=None):
        if not isinstance(submodule, Module):
            raise TypeError(f"PipelineStage: submodule must be a kiln.nn.Module, not "
                            f"{type(submodule).__name__}")
        self.submod = submodule
        self._gang = None
        if device is not None and str(device).startswith("remote") or _is_gang_mesh(group):
            # On a gang (Note [Gang stages] in kiln/client/transport.h), its tensors there alone.
            if not 0 <= stage_index < num_stages:
                raise ValueError(f"PipelineStage: stage_index {stage_index} is not in "
                                 f"[0, num_stages={num_stages})")
            self._gang = _Gang(device, group, num_stages)
            device = self._gang.device
            on_gang = [n for n, t in list(submodule.named_parameters()) +
                       list(submodule.named_buffers()) if str(t.device) == device]
            if on_gang:
                # Every worker would hold them, and a read would see a worker's copy that only
                # the stage's worker updates.
                raise ValueError(f"PipelineStage: '{on_gang[0]}' of stage {stage_index} is on "
                                 f"{device} already, on every worker; build the stages from a "
                                 f"model on the CPU, and each stage's tensors go to its worker")
            with _C._StageScope(self._gang.workers_of(stage_index)):
                submodule.to(device)
            group = None
        elif device is not None and str(device) != "cpu" and not str(device).startswith("cuda"):
            raise ValueError(f"PipelineStage: device '{device}' is not supported; pipelines run "
                             "on the CPU (UCX), on CUDA (NCCL) or on a gang's workers "
                             "(kiln.connect)")
        elif group is None:
            group = _C._default_group()
        # The C++ stage calls back through a weak reference: a Python object it held strongly
        # could close a cycle the garbage collector cannot see into.
        me = weakref.ref(self)
        self._c = _C._PipelineStage(lambda ins: _as_list(me().submod(*ins)),
                                    lambda ins: _forward_meta(me().submod, ins), None, None,
                                    stage_index, num_stages, group,
                                    "cpu" if self._gang or device is None else str(device))
        self.group = group

    @property
    def workers(self):
        """The gang workers that run this stage, its data-parallel replicas (None for a stage of
        a `kiln run` rank)."""
        return None if self._gang is None else self._gang.workers_of(self.stage_index)

    stage_index = property(lambda self: self._c.stage_index)
    num_stages = property(lambda self: self._c.num_stages)
    is_first = property(lambda self: self._c.is_first)
    is_last = property(lambda self: self._c.is_last)

    def __repr__(self):
        return f"PipelineStage({self.stage_index} of {self.num_stages})"


class _PipelineSchedule:
    _kind = None

    def __init__(self, stages, n_microbatches, loss_fn=None):
        stages = list(stages) if isinstance(stages, (list, tuple)) else [stages]
        for s in stages:
            if not isinstance(s, PipelineStage):
                raise TypeError(f"{type(self).__name__}: expected PipelineStage objects, got "
                                f"{type(s).__name__}")
        self._stages = stages  # the stages' callbacks hold them weakly (See PipelineStage)
        self._loss_fn = loss_fn
        gangs = {None if s._gang is None else s._gang.key() for s in stages}
        if len(gangs) > 1:
            raise ValueError(f"{type(self).__name__}: the stages must all be on one gang, "
                             "placed the same way, or all on kiln run ranks")
        self._gang = stages[0]._gang
        if self._gang is not None and len(stages) != stages[0].num_stages:
            raise ValueError(f"{type(self).__name__}: a pipeline on a gang runs all "
                             f"{stages[0].num_stages} stages from this one process; got "
                             f"{len(stages)}")
        me = weakref.ref(self)  # See PipelineStage.__init__
        self._c = _C._PipelineSchedule([s._c for s in stages], self._kind, n_microbatches,
                                       None if loss_fn is None else
                                       lambda out, target: me()._loss_fn(out, target), False,
                                       [] if self._gang is None else
                                       [list(w) for w in self._gang.workers])

    def _to_workers(self, tensors, stage):
        """A gang pipeline's inputs (targets) on the workers of the first (last) stage, their
        rows split over the stage's data-parallel replicas."""
        if self._gang is None:
            return tensors
        g, workers = self._gang, self._gang.workers_of(stage)
        if len(workers) > 1:
            for t in tensors:
                if str(t.device) == g.device:
                    raise ValueError(f"{type(self).__name__}: pass the inputs and target of a "
                                     f"pipeline with data-parallel stages from the client (on "
                                     f"the CPU), to be split over the replicas; they are on "
                                     f"{g.device}")
            return [_C._scatter_to(t, g.device, workers) for t in tensors]
        with _C._StageScope(workers):
            return [t.to(g.device) for t in tensors]

    def _dp_mean(self, t, stage):
        """The mean over a stage's data-parallel replicas of their values of `t`."""
        from kiln.distributed.tensor import DTensor, Partial, Replicate
        with _C._StageScope(self._gang.workers_of(stage)):
            d = DTensor.from_local(t, self._gang.dp_mesh, [Partial("avg")])
            return d.redistribute(self._gang.dp_mesh, [Replicate()]).to_local()

    def _dp_gather(self, t, stage):
        """A stage's replicas' values of `t` (rows), concatenated."""
        from kiln.distributed.tensor import DTensor, Replicate, Shard
        with _C._StageScope(self._gang.workers_of(stage)):
            d = DTensor.from_local(t, self._gang.dp_mesh, [Shard(0)])
            return d.redistribute(self._gang.dp_mesh, [Replicate()]).to_local()

    def _average_replicas(self, outs, ls, grads=True):
        """Data-parallel stages on a gang: every gradient (`grads`), and the losses, averaged
        over each stage's replicas (as DDP would), the output gathered."""
        if self._gang is None or self._gang.dp_mesh is None:
            return outs, ls
        from kiln.autograd.grad_mode import no_grad
        last = self._stages[0].num_stages - 1
        with no_grad():
            for s in self._stages if grads else []:
                for p in s.submod.parameters():
                    if p.grad is not None:
                        p.grad.copy_(self._dp_mean(p.grad, s.stage_index))
            ls = [self._dp_mean(l.reshape([1]), last).reshape([]) for l in ls]
            outs = [self._dp_gather(o, last) for o in outs]
        return outs, ls

    def step(self, *args, target=None, losses=None):
        """One training step over the batch `args` (stage 0's rank) with `target` (the last
        stage's rank): forward and backward of every microbatch, the gradients accumulated into
        .grad (an optimizer steps afterwards). Returns the last stage's output, the microbatches'
        outputs concatenated, on its rank, None elsewhere; appends each microbatch's loss to
        `losses` there."""
        n = self._stages[0].num_stages
        args = self._to_workers(list(args), 0)
        if target is not None:
            (target,) = self._to_workers([target], n - 1)
        outs, ls = self._average_replicas(*self._c.step(args, target, losses is not None))
        if losses is not None:
            losses.extend(ls)
        return outs[0] if outs else None

    def eval(self, *args):
        """Forward only, microbatch by microbatch: the last stage's output on its rank."""
        outs, _ = self._average_replicas(self._c.eval(self._to_workers(list(args), 0)), [],
                                         grads=False)
        return outs[0] if outs else None

    def actions(self):
        """Every rank's action list (lists of actions: .op, .stage, .microbatch; repr '1F3')."""
        return self._c.actions()

    def format_actions(self):
        return format_actions(self._c.actions())

    def last_timeline(self):
        """This rank's compute actions of the last step: (action, start, end) in seconds."""
        return [(t.action, t.start, t.end) for t in self._c.last_timeline()]

    def last_step_seconds(self):
        return self._c.last_step_seconds()

    def export_timeline(self, path, measured=False):
        """Writes a timeline (Chrome trace JSON: opens in Perfetto or chrome://tracing). By
        default the schedule simulated with F = I = W = 1 and B = 2; measured=True: this rank's
        last step as it ran."""
        timeline = self._c.last_timeline() if measured else simulate(self._c.actions())
        with open(path, "w") as f:
            f.write(_C._pp_chrome_trace(timeline))


class PipelineScheduleSingle(_PipelineSchedule):
    """A schedule with one stage per rank."""

    def __init__(self, stage, n_microbatches, loss_fn=None):
        if isinstance(stage, (list, tuple)) and not all(
                isinstance(s, PipelineStage) and s._gang is not None for s in stage):
            raise TypeError(f"{type(self).__name__} takes one PipelineStage (or, on a gang, "
                            "all of them); ScheduleInterleaved1F1B takes several")
        super().__init__(stage if isinstance(stage, (list, tuple)) else [stage], n_microbatches,
                         loss_fn)


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule with several stages per rank."""


class ScheduleGPipe(PipelineScheduleSingle):
    """All forwards, then all backwards."""
    _kind = "gpipe"


class Schedule1F1B(PipelineScheduleSingle):
    """One forward, one backward, after a warm-up of p - r - 1 forwards on rank r."""
    _kind = "1f1b"


class ScheduleZBH1(PipelineScheduleSingle):
    """ZeroBubble H1: 1F1B with each backward split into its input part (I), which the previous
    stage waits for, and its weight part (W), put off to fill the bubbles (Note [Split backward]
    in kiln/autograd/engine.h)."""
    _kind = "zbh1"


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Megatron's interleaved 1F1B: v stages per rank (rank r runs r, r + p, ...); needs a
    multiple of p microbatches."""
    _kind = "interleaved_1f1b"


# ---- Action lists without a run -----------------------------------------------------------

def schedule_actions(schedule, pp_size, n_microbatches, stages_per_rank=1, fsdp=False):
    """Every rank's action list of a schedule ('gpipe', '1f1b', 'interleaved_1f1b', 'zbh1')."""
    return _C._pp_schedule(schedule, pp_size, n_microbatches, stages_per_rank, fsdp)


def format_actions(actions):
    return _C._pp_format(actions)


def simulate(actions, f=1.0, b=2.0, i=1.0, w=1.0):
    """Runs action lists with these costs per action: [(rank, action, start, end)]."""
    return _C._pp_simulate(actions, f, b, i, w)


def bubble_fraction(timeline, pp_size):
    return _C._pp_bubble_fraction(timeline, pp_size)


def chrome_trace(timeline):
    return json.loads(_C._pp_chrome_trace(timeline))


# ---- Splitting a model ----------------------------------------------------------------------

class SplitPoint:
    BEGINNING = "beginning"  # a new stage starts at this module
    END = "end"              # a new stage starts after it


def _flatten(module, prefix=""):
    """The chain of a Sequential, nested Sequentials expanded: [(fqn, module)]."""
    out = []
    for name, child in module._modules.items():
        fqn = f"{prefix}{name}"
        if isinstance(child, Sequential):
            out.extend(_flatten(child, fqn + "."))
        else:
            out.append((fqn, child))
    return out


def _stage_module(items):
    """A Sequential of a stretch of the chain that keeps the model's names ("blocks.2.fc.weight"
    stays so in the stage's state_dict): nested Sequentials where the names nest."""
    root = OrderedDict()
    for fqn, m in items:
        *path, leaf = fqn.split(".")
        d = root
        for p in path:
            d = d.setdefault(p, OrderedDict())
        d[leaf] = m

    def build(d):
        return Sequential(OrderedDict((k, build(v) if isinstance(v, OrderedDict) else v)
                                      for k, v in d.items()))
    return build(root)


class Pipe:
    """A model cut into stages (what pipeline() returns)."""

    def __init__(self, stages):
        self._stages = stages

    @property
    def num_stages(self):
        return len(self._stages)

    def get_stage_module(self, stage_index):
        return self._stages[stage_index]

    def build_stage(self, stage_index, device=None, group=None):
        return PipelineStage(self._stages[stage_index], stage_index, self.num_stages, device, group)


def pipeline(module, split_points=None, split_spec=None, mb_args=None):
    """Cuts an nn.Sequential (nested Sequentials count as one chain) into stages. split_points:
    fully qualified names of the modules that start a new stage; split_spec: PyTorch's form,
    {fqn: SplitPoint.BEGINNING or SplitPoint.END}. The stages share the model's modules.
    Each stage keeps the model's names for its parameters. mb_args is accepted for PyTorch's
    signature; shapes come from the stages themselves.
    A model whose forward is not a chain (not a Sequential) is split by hand with
    PipelineStage."""
    if not isinstance(module, Sequential):
        raise TypeError(f"pipeline(): {type(module).__name__} is not an nn.Sequential, and Kiln "
                        "cannot trace an arbitrary forward into stages; build the stages by hand "
                        "with PipelineStage(submodule, stage_index, num_stages)")
    chain = _flatten(module)
    names = [n for n, _ in chain]
    starts = set()
    spec = dict(split_spec or {})
    for p in split_points or []:
        spec[p] = SplitPoint.BEGINNING
    for fqn, where in spec.items():
        if fqn not in names:
            raise ValueError(f"pipeline(): split point '{fqn}' is not a module of the chain; its "
                             f"modules are {names}")
        k = names.index(fqn) + (1 if where == SplitPoint.END else 0)
        if where not in (SplitPoint.BEGINNING, SplitPoint.END):
            raise ValueError(f"pipeline(): split point '{fqn}': {where!r} is neither "
                             "SplitPoint.BEGINNING nor SplitPoint.END")
        if k == 0 or k == len(names):
            raise ValueError(f"pipeline(): split point '{fqn}' ({where}) would leave a stage "
                             "empty")
        starts.add(k)
    bounds = [0] + sorted(starts) + [len(chain)]
    return Pipe([_stage_module(chain[a:b]) for a, b in zip(bounds, bounds[1:])])
