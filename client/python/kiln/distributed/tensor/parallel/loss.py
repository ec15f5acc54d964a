"""loss_parallel: cross_entropy (and log_softmax, nll_loss) on vocab-sharded logits without
gathering them (torch.distributed.tensor.parallel.loss_parallel).

    with loss_parallel():
        loss = F.cross_entropy(logits, target)   # logits: an (N, V) DTensor, Shard(-1)
        loss.backward()                           # logits.grad: Shard(-1)
        loss = F.nll_loss(F.log_softmax(logits, -1), target)   # the same, in two steps
"""
import contextlib
import math

from kiln import _C
from kiln.autograd.function import Function
from kiln.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
from kiln.nn import functional as F

__all__ = ["loss_parallel"]

# Note [Vocab-parallel cross entropy]: each rank holds a (N, V_r) slice of the (N, V) logits,
# columns [offset, offset + V_r). With one all-reduce of the row maxima m (max) and one of
# (sum_c exp(x_c - m), the target's logit, sum_c x_c) (sum; only the rank owning the target's
# column contributes its logit), every rank knows lse = m + log(sum exp) and
#   loss_i = (1 - eps) * w_i * (lse_i - x_{i,t_i}) + eps * v_i * (lse_i - sum_c x_{i,c} / V)
# (w_i: the target's class weight, 0 where t_i == ignore_index; v_i: 1 unless ignored; eps: the
# label smoothing). Its gradient needs no communication: on each rank's columns it is
#   ((1 - eps) * w_i + eps * v_i) * softmax_{i,c} - (1 - eps) * w_i * [c == t_i] - eps * v_i / V,
# times the reduction's scale (mean: 1 / sum_i w_i). The logits cross the network never; the
# messages are O(N).


def _all_reduce(group, t, op):
    t = t.contiguous()
    group.all_reduce(t, op).wait()
    return t


class _VocabParallelCrossEntropy(Function):
    @staticmethod
    def forward(ctx, x, target, weight, group, offset, vocab, reduction, ignore_index, eps):
        n, vr = x.shape
        valid = target != ignore_index
        local_t = target - offset
        owned = valid & (local_t >= 0) & (local_t < vr)
        if vr > 0:
            m = x.amax([1])
        else:
            m = _C.full([n], -math.inf, dtype=x.dtype)
        m = _all_reduce(group, m, "max")
        # A row of -inf logits everywhere has max -inf; exp(x - m) would be nan.
        m = _C.where(m == -math.inf, _C.zeros_like(m), m)
        idx = _C.where(owned, local_t, _C.zeros_like(local_t)).unsqueeze(1)
        if vr > 0:
            sumexp = (x - m.unsqueeze(1)).exp().sum([1])
            picked = _C.where(owned, x.gather(1, idx).squeeze(1), _C.zeros_like(m))
            rowsum = x.sum([1])
        else:
            sumexp = picked = rowsum = _C.zeros_like(m)
        sums = _all_reduce(group, _C.stack([sumexp, picked, rowsum]), "sum")
        lse = m + sums[0].log()
        v = valid.to(x.dtype)
        w = v if weight is None else weight[_C.where(valid, target, _C.zeros_like(target))] * v
        loss = (lse - sums[1]) * w
        if eps > 0:
            loss = loss * (1 - eps) + (lse - sums[2] / vocab) * v * eps
        denom = w.sum()
        ctx.save_for_backward(x, lse, w, v, idx, owned, denom)
        ctx.setting = (reduction, eps, vocab)
        if reduction == "none":
            return loss
        total = loss.sum()
        return total / denom if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad):
        x, lse, w, v, idx, owned, denom = ctx.saved_tensors
        reduction, eps, vocab = ctx.setting
        scale = grad / denom if reduction == "mean" else grad
        a = (w * (1 - eps) + v * eps) * scale
        g = (x - lse.unsqueeze(1)).exp() * a.unsqueeze(1)
        if eps > 0:
            g = g - (v * scale * (eps / vocab)).unsqueeze(1)
        if x.shape[1] > 0:
            hit = _C.where(owned, w * scale * (1 - eps), _C.zeros_like(w))
            g = g.scatter_add(1, idx, (-hit).unsqueeze(1))
        return g, None, None, None, None, None, None, None, None


def _shard_of(size, n, index):
    """{offset, length} of piece `index` of `n` along a dim of `size` (See Note [Placements])."""
    chunk = -(-size // n) if n else 0
    start = min(size, chunk * index)
    return start, min(size, start + chunk) - start


def _class_sharded(what, input, name):
    """(mesh, the mesh dim sharding the class dim) of (N, C) or (C,) `input`, or a ValueError."""
    if input.ndim not in (1, 2):
        raise ValueError(f"{what}: expected {name} of shape (N, C) or (C,), got "
                         f"{tuple(input.shape)}; flatten the leading dims first (the class dim "
                         "must be the last)")
    cdim = input.ndim - 1
    placements = input.placements
    shard_dims = [i for i, p in enumerate(placements) if p.is_shard()]
    if len(shard_dims) != 1 or not placements[shard_dims[0]].is_shard(cdim) or any(
            not p.is_replicate() for i, p in enumerate(placements) if i != shard_dims[0]):
        raise ValueError(f"{what}: expected the {name} sharded on the class dim (Shard(-1)) "
                         f"along one mesh dim and replicated along the others, got placements "
                         f"{placements}")
    return input.device_mesh, shard_dims[0]


def _loss_args(what, input, target, weight, reduction, ignore_index):
    """Checks a loss call on class-sharded `input`; returns (mesh, mesh dim, offset of this
    rank's classes, the number of classes, the flat int64 target, the weight, the local (N, C_r)
    input)."""
    mesh, mdim = _class_sharded(what, input, "logits" if "cross" in what else "log-probabilities")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{what}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    if isinstance(target, DTensor):
        if any(not p.is_replicate() for p in target.placements):
            raise ValueError(f"{what}: the target must be a plain tensor or a Replicate() "
                             f"DTensor, got placements {target.placements}")
        target = target.to_local()
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    vocab = input.shape[-1]
    batch = () if input.ndim == 1 else (input.shape[0],)
    if tuple(target.shape) != batch:
        raise ValueError(f"{what}: expected a target of shape {batch} for an input of shape "
                         f"{tuple(input.shape)}, got {tuple(target.shape)}")
    if target.dtype.is_floating_point:
        raise NotImplementedError(f"{what}: class probabilities as target are not supported; "
                                  "pass class indices")
    if weight is not None and tuple(weight.shape) != (vocab,):
        raise ValueError(f"{what}: weight must have shape ({vocab},), got {tuple(weight.shape)}")
    target = target.to(_C.int64).reshape([-1])
    bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
    if _on_gang(mesh) and str(target.device).startswith("remote"):
        # Each worker holds its own targets: any worker's bad one counts.
        anywhere = DTensor.from_local(bad.any().reshape([1]).to(_C.int64), mesh,
                                      [Partial("max")] * mesh.ndim)
        if anywhere.full_tensor().item():
            raise IndexError(f"{what}: a target is out of bounds for {vocab} classes on some "
                             f"worker of {mesh}")
    elif bad.any().item():
        raise IndexError(f"{what}: target {target[bad][0].item()} is out of bounds for "
                         f"{vocab} classes")
    if _on_gang(mesh):  # no local shapes here: Note [Loss parallel on a gang]
        return mesh, mdim, None, vocab, target, weight, None
    offset, _ = _shard_of(vocab, mesh.size(mdim), mesh.get_local_rank(mdim))
    local = input.to_local()
    x = local.reshape([1, -1]) if input.ndim == 1 else local
    return mesh, mdim, offset, vocab, target, weight, x


def _replicated_loss(loss, input, reduction, mesh):
    if input.ndim == 1 and reduction == "none":
        loss = loss.reshape([])
    return DTensor.from_local(loss, mesh, [Replicate()] * mesh.ndim)


def _cross_entropy(input, target, weight, reduction, ignore_index, label_smoothing):
    what = "cross_entropy under loss_parallel()"
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{what}: label_smoothing must be between 0.0 and 1.0, got "
                         f"{label_smoothing}")
    if label_smoothing > 0 and weight is not None:
        raise NotImplementedError(f"{what}: label_smoothing with class weights is not supported "
                                  "in Kiln yet")
    mesh, mdim, offset, vocab, target, weight, x = _loss_args(what, input, target, weight,
                                                              reduction, ignore_index)
    if _on_gang(mesh):
        return _gang_nll_loss(_gang_log_softmax(input, None), target, weight, reduction,
                              ignore_index, float(label_smoothing))
    loss = _VocabParallelCrossEntropy.apply(x, target, weight, mesh.get_group(mdim), offset,
                                            vocab, reduction, ignore_index, float(label_smoothing))
    return _replicated_loss(loss, input, reduction, mesh)


class _VocabParallelLogSoftmax(Function):
    """log_softmax over the class dim of (N, C_r) local logits: x - (m + log sum exp(x - m)),
    m and the sum all-reduced. Backward: g - softmax * (the sum of g over all classes), one
    all-reduce of O(N) values."""

    @staticmethod
    def forward(ctx, x, group):
        n, vr = x.shape
        m = x.amax([1]) if vr > 0 else _C.full([n], -math.inf, dtype=x.dtype)
        m = _all_reduce(group, m, "max")
        m = _C.where(m == -math.inf, _C.zeros_like(m), m)
        s = (x - m.unsqueeze(1)).exp().sum([1]) if vr > 0 else _C.zeros_like(m)
        out = x - (m + _all_reduce(group, s, "sum").log()).unsqueeze(1)
        ctx.save_for_backward(out)
        ctx.group = group
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        total = _all_reduce(ctx.group, grad.sum([1]), "sum")
        return grad - out.exp() * total.unsqueeze(1), None


class _VocabParallelNllLoss(Function):
    """nll_loss of (N, C_r) local log-probabilities: the rank owning each target's class
    contributes -w * logp[target], all-reduced; the gradient is -w (times the reduction's scale)
    at the owned target columns."""

    @staticmethod
    def forward(ctx, x, target, weight, group, offset, reduction, ignore_index):
        n, vr = x.shape
        valid = target != ignore_index
        local_t = target - offset
        owned = valid & (local_t >= 0) & (local_t < vr)
        idx = _C.where(owned, local_t, _C.zeros_like(local_t)).unsqueeze(1)
        zero = _C.zeros([n], dtype=x.dtype)
        picked = _C.where(owned, x.gather(1, idx).squeeze(1), zero) if vr > 0 else zero
        picked = _all_reduce(group, picked, "sum")
        v = valid.to(x.dtype)
        w = v if weight is None else weight[_C.where(valid, target, _C.zeros_like(target))] * v
        loss = -picked * w
        denom = w.sum()
        ctx.save_for_backward(w, idx, owned, denom)
        ctx.setting = (reduction, tuple(x.shape))
        if reduction == "none":
            return loss
        total = loss.sum()
        return total / denom if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad):
        w, idx, owned, denom = ctx.saved_tensors
        reduction, shape = ctx.setting
        scale = grad / denom if reduction == "mean" else grad
        g = _C.zeros(list(shape), dtype=w.dtype)
        if shape[1] > 0:
            hit = _C.where(owned, w * scale, _C.zeros_like(w))
            g = g.scatter_add(1, idx, (-hit).unsqueeze(1))
        return g, None, None, None, None, None, None


def _log_softmax(input, dim, dtype):
    what = "log_softmax under loss_parallel()"
    mesh, mdim = _class_sharded(what, input, "input")
    if dim not in (input.ndim - 1, -1):
        raise ValueError(f"{what}: expected dim to be the class dim ({input.ndim - 1} or -1), the "
                         f"sharded one, got {dim}")
    if _on_gang(mesh):
        return _gang_log_softmax(input, dtype)
    local = input.to_local()
    if dtype is not None:
        local = local.to(dtype)
    x = local.reshape([1, -1]) if input.ndim == 1 else local
    out = _VocabParallelLogSoftmax.apply(x, mesh.get_group(mdim))
    out = out.reshape(list(local.shape))
    return DTensor.from_local(out, mesh, input.placements, shape=tuple(input.shape))


def _nll_loss(input, target, weight, reduction, ignore_index):
    what = "nll_loss under loss_parallel()"
    mesh, mdim, offset, _, target, weight, x = _loss_args(what, input, target, weight,
                                                           reduction, ignore_index)
    if _on_gang(mesh):
        return _gang_nll_loss(input, target, weight, reduction, ignore_index, 0.0)
    loss = _VocabParallelNllLoss.apply(x, target, weight, mesh.get_group(mdim), offset,
                                       reduction, ignore_index)
    return _replicated_loss(loss, input, reduction, mesh)


# Note [Loss parallel on a gang]: on a gang's mesh (Note [Remote DTensor] in kiln/dist/remote.h)
# one client records for every worker, so the local computations above, which take this rank's
# class offset and call the process group themselves, cannot be recorded. There the same losses
# are composed of DTensor ops that every worker runs on its own classes: the row maximum and the
# sum of exp are reductions of the class dim (Partial, then one all-reduce of O(N) values each),
# and the target's log-probability is a sum over the classes against a one-hot of the target
# (times its weight): the targets, replicated, compared with the class ids, sharded like the
# logits, so each worker makes its own columns of it and no rank needs to know where its classes
# start. Autograd through these ops gives the same gradients, placed like the logits. The one-hot
# costs each worker its (N, C_r) piece, as much as its logits.

def _on_gang(mesh):
    return mesh.device_type.startswith("remote")


def _gang_log_softmax(input, dtype):
    x = input if dtype is None else input.to(dtype)
    rep = [Replicate()] * x.device_mesh.ndim
    m = x.detach().amax([-1], keepdim=True).redistribute(x.device_mesh, rep)
    m = _C.where(m == -math.inf, _C.zeros_like(m), m)  # a row of -inf: 0, not nan
    z = x - m
    return z - z.exp().sum([-1], keepdim=True).redistribute(x.device_mesh, rep).log()


def _gang_nll_loss(logp, target, weight, reduction, ignore_index, eps):
    """The loss of log-probabilities `logp` (a class-sharded DTensor) against flat int64 class
    indices `target`, as _VocabParallelCrossEntropy computes it (eps: label smoothing)."""
    mesh, vocab = logp.device_mesh, logp.shape[-1]
    rep = [Replicate()] * mesh.ndim
    x = logp.reshape([1, vocab]) if logp.ndim == 1 else logp
    valid = target != ignore_index
    safe = _C.where(valid, target, _C.zeros_like(target))
    v = valid.to(logp.dtype)
    w = v if weight is None else weight.to(target.device)[safe].to(logp.dtype) * v
    classes = distribute_tensor(_C.arange(0, vocab).reshape([1, vocab]), mesh, list(x.placements))
    rows = distribute_tensor(safe.unsqueeze(1), mesh, rep)
    pick = (rows == classes).to(logp.dtype) * distribute_tensor(w.unsqueeze(1), mesh, rep)
    loss = -(x * pick).sum([-1])  # Partial along the class mesh dim
    if eps > 0:
        smooth = x.sum([-1]) * distribute_tensor(v * (eps / vocab), mesh, rep)
        loss = loss * (1 - eps) - smooth
    loss = loss.redistribute(mesh, rep)
    if reduction == "none":
        return loss.reshape([]) if logp.ndim == 1 else loss
    total = loss.sum()
    return total / w.sum() if reduction == "mean" else total


class _LossParallelOps:
    """What kiln.nn.functional routes DTensor inputs to while loss_parallel() is active."""
    cross_entropy = staticmethod(_cross_entropy)
    log_softmax = staticmethod(_log_softmax)
    nll_loss = staticmethod(_nll_loss)


_depth = 0


@contextlib.contextmanager
def loss_parallel():
    """Within it, kiln.nn.functional's cross_entropy (and nn.CrossEntropyLoss), log_softmax and
    nll_loss (and nn.NLLLoss) on DTensors sharded on the class dim run on the shards with
    all-reduces of O(N) values, never gathering the class dim (Note [Vocab-parallel cross
    entropy]). Losses are Replicate() DTensors; log_softmax keeps its input's placements; the
    inputs' gradients have their placements. Inputs must be (N, C) or (C,); targets plain tensors
    or Replicate() DTensors of class indices. Plain tensors are unaffected."""
    global _depth
    _depth += 1
    F._loss_parallel = _LossParallelOps
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            F._loss_parallel = None
