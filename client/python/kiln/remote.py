"""kiln.connect: training on Kiln workers (DESIGN.md "Execution").

    with kiln.connect("127.0.0.1:5000") as s:       # a kiln-worker, or a coordinator
        model.to(s.device)                           # parameters now live on the worker
        loss = loss_fn(model(x.to(s.device)), y.to(s.device))
        loss.backward(); opt.step()                  # recorded, sent in batches
        print(loss.item())                           # a read: flushes and fetches

Ops on remote tensors are recorded by the client (autograd runs here) and run on the worker;
reads (item, numpy, tolist, printing, .to("cpu")) and sync() wait for them. An op that failed
on the worker raises at the next read, naming the op and the line of this process that
recorded it. kiln.connect("inproc", workers=N) runs N embedded workers in this process.

Data-parallel over N workers: one model replica per worker (s.replicate), each batch split
across them (s.scatter), gradients averaged (s.all_reduce_gradients) before the optimizer
steps: across the workers' own process group when the session is a coordinator's gang, else
through this process.
"""
import copy
import os

from kiln import _C
from kiln.autograd.grad_mode import no_grad

__all__ = ["connect", "Session"]

# Remote errors name the innermost frame outside this package (the user's line).
_C._set_call_site_package(os.path.dirname(os.path.abspath(__file__)) + os.sep)


class Session:
    """A connection to one worker or a gang of workers; close() (or the with block) ends it."""

    def __init__(self, cpp):
        self._s = cpp

    @property
    def device(self):
        """The device of rank 0's worker (kiln.device('remote:N'))."""
        return self._s.device(0)

    @property
    def devices(self):
        """One device per worker, by rank."""
        return [self._s.device(r) for r in range(self.world_size)]

    @property
    def world_size(self):
        return self._s.world_size()

    @property
    def session_id(self):
        """The coordinator's session id ("" for a direct or in-process connection)."""
        return self._s.session_id()

    def sync(self):
        """Waits until every worker ran everything recorded so far; raises the first error."""
        self._s.sync()

    def close(self):
        """Flushes and ends the session; later ops on its tensors raise. Idempotent."""
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        sid = f", session_id={self.session_id!r}" if self.session_id else ""
        return f"kiln.Session(world_size={self.world_size}{sid})"

    # ---- Data-parallel helpers -------------------------------------------------------------
    def replicate(self, module):
        """One copy of `module` per worker (rank 0 gets `module` itself, moved)."""
        copies = [copy.deepcopy(module) for _ in range(self.world_size - 1)]
        return [m.to(d) for m, d in zip([module] + copies, self.devices)]

    def scatter(self, tensor, dim=0):
        """Splits `tensor` into world_size nearly equal chunks along dim, chunk r on rank r."""
        n = self.world_size
        size = tensor.shape[dim]
        if size < n:
            raise ValueError(f"scatter: dim {dim} has {size} elements, fewer than the "
                             f"{n} workers")
        base, extra = divmod(size, n)
        chunks, start = [], 0
        for r, d in enumerate(self.devices):
            length = base + (1 if r < extra else 0)
            chunks.append(tensor.narrow(dim, start, length).to(d))
            start += length
        return chunks

    def all_reduce_gradients(self, replicas):
        """Averages the gradients of the replicas' parameters (one module or parameter list per
        rank, as from replicate()), in one flat bucket per rank."""
        if len(replicas) != self.world_size:
            raise ValueError(f"all_reduce_gradients: expected {self.world_size} replicas "
                             f"(one per worker), got {len(replicas)}")
        grads = [[p.grad for p in _parameters(m) if p.grad is not None] for m in replicas]
        if any(len(g) != len(grads[0]) for g in grads):
            raise ValueError("all_reduce_gradients: the replicas have different numbers of "
                             "gradients")
        if self.world_size == 1 or not grads[0]:
            return
        with no_grad():
            flats = [_C.cat([g.reshape(-1) for g in gs]) for gs in grads]
            if self.session_id:
                # The gang's process group, named "world" on every worker (worker/src/gang.h).
                reduced = [_C.all_reduce(f, "avg", "world") for f in flats]
                for gs, f in zip(grads, reduced):
                    _unflatten_into(gs, f)
                # Every rank's batch must be on its way before any rank waits in the collective.
                for r in range(self.world_size):
                    self._s.flush(r)
            else:
                # Embedded or direct workers have no common group: average here.
                mean = flats[0].to("cpu")
                for f in flats[1:]:
                    mean = mean + f.to("cpu")
                mean = mean / self.world_size
                for gs, d in zip(grads, self.devices):
                    _unflatten_into(gs, mean.to(d))


def _parameters(m):
    return list(m.parameters()) if hasattr(m, "parameters") else list(m)


def _unflatten_into(grads, flat):
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat.narrow(0, offset, n).view(g.shape))
        offset += n


def connect(address=None, workers=1, token=None, wait_ms=0):
    """Opens a session: `address` is a kiln-worker ("host:port", then workers must be 1), a
    kiln-coordinator (a gang of `workers`; waits up to wait_ms for free ones), or "inproc"
    (embedded workers). None: KILN_SESSION or KILN_COORDINATOR (set by `kiln submit`). The
    token defaults to KILN_TOKEN."""
    return Session(_C._connect(address or "", int(workers), token or "", int(wait_ms)))
