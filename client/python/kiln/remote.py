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

Data-parallel over N workers: a session of N workers is one device, and every op recorded on
it runs on each worker (one program). s.scatter(batch) gives each worker its share of a batch
(one tensor of the share's shape); s.all_reduce_gradients(model) averages the gradients over
the gang's process group before the optimizer steps. That collective needs a coordinator's
gang of real workers: embedded workers have no process group.
"""
import os

from kiln import _C

__all__ = ["connect", "Session"]

# Remote errors name the innermost frame outside this package (the user's line).
_C._set_call_site_package(os.path.dirname(os.path.abspath(__file__)) + os.sep)


class Session:
    """A connection to one worker or a gang of workers; close() (or the with block) ends it."""

    def __init__(self, cpp):
        self._s = cpp

    @property
    def device(self):
        """The session's device (kiln.device('remote:N')); with N workers, ops run on each."""
        return self._s.device()

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

    # ---- Data-parallel ------------------------------------------------------------------
    def scatter(self, tensor):
        """`tensor` (on the CPU) split along dim 0 into world_size equal shards, shard r on
        worker r; the result has the shard's shape. With one worker: tensor.to(device)."""
        return self._s.scatter(tensor)

    def log_step(self, loss=None, tokens=0):
        """Marks the end of a training step for the job's telemetry (`kiln status`, the
        dashboard): every worker records its step time, the part not spent waiting for
        collectives, and its own value of `loss` (a one-element tensor on this session's device;
        a data-parallel rank's is its shard's). `tokens`: what the step processed on the whole
        gang, for tokens/s. Needs no round trip."""
        self._s.log_step(loss, float(tokens))

    def all_reduce_gradients(self, params):
        """Averages the .grad of `params` (a Module or an iterable of tensors) over the
        workers; nothing with one worker."""
        if hasattr(params, "parameters"):
            params = params.parameters()
        if self.world_size > 1 and not self.session_id:
            # Refused here: the failed collective would poison the gradients, and an in-place
            # optimizer step that reads them would silently not run.
            raise RuntimeError("all_reduce_gradients: embedded workers have no process group; "
                               "a data-parallel gang needs kiln.connect(COORDINATOR, workers=N)")
        self._s.all_reduce_gradients(list(params))


def connect(address=None, workers=1, token=None, wait_ms=0):
    """Opens a session: `address` is a kiln-worker ("host:port", then workers must be 1), a
    kiln-coordinator (a gang of `workers`; waits up to wait_ms for free ones), or "inproc"
    (embedded workers). None: KILN_COORDINATOR (set by `kiln submit`, with KILN_JOB_ID). The
    token defaults to KILN_TOKEN."""
    return Session(_C._connect(address or "", int(workers), token or "", int(wait_ms)))
