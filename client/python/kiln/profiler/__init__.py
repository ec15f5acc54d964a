"""kiln.profiler: torch.profiler's API over kiln::profiler (kiln/profiler.h, Note [Profiler hook]).
Every op call is an event (name, input shapes, dtype, bytes, FLOPs, thread, device), nested
inside record_function ranges and ProfilerStep#N ranges; profile_memory adds the CPU
allocator's allocations and frees.

    from kiln.profiler import profile, schedule, record_function, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True,
                 schedule=schedule(wait=1, warmup=1, active=2)) as prof:
        for batch in loader:
            with record_function("train_step"):
                step(batch)
            prof.step()
    prof.export_chrome_trace("trace.json")       # open in ui.perfetto.dev or chrome://tracing
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=10))
"""
import functools
import os
import socket
import time
import warnings
import weakref

from kiln import _C

__all__ = ["profile", "schedule", "record_function", "ProfilerActivity", "ProfilerAction",
           "tensorboard_trace_handler"]

ProfilerActivity = _C._ProfilerActivity
ProfilerAction = _C._ProfilerAction


def schedule(*, wait, warmup, active, repeat=0, skip_first=0):
    """torch.profiler.schedule: skip `skip_first` steps, then cycles of `wait` idle steps,
    `warmup` steps (recorded and thrown away) and `active` recorded steps; `repeat` cycles (0:
    forever). Returns a callable step -> ProfilerAction. Negative values raise ValueError."""
    for name, v in (("wait", wait), ("warmup", warmup), ("active", active), ("repeat", repeat),
                    ("skip_first", skip_first)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"schedule: {name} must be an int, got {type(v).__name__}")
    return _C._Schedule(wait, warmup, active, repeat, skip_first)


def tensorboard_trace_handler(dir_name, worker_name=None, use_gzip=False):
    """An on_trace_ready handler writing each collected cycle to
    dir_name/{worker_name}.{time in ms}.{step}.pt.trace.json (worker_name: host_pid; the step
    keeps two cycles that end in the same millisecond apart)."""
    if use_gzip:
        raise NotImplementedError("tensorboard_trace_handler: use_gzip is not supported")
    os.makedirs(dir_name, exist_ok=True)
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"

    def handler(prof):
        prof.export_chrome_trace(
            os.path.join(dir_name,
                         f"{worker}.{int(time.time() * 1000)}.{prof.step_num}.pt.trace.json"))

    return handler


class profile:
    """torch.profiler.profile. Without a schedule it records from __enter__ (or start()) to
    __exit__ (or stop()); with one, step() moves through the schedule and on_trace_ready(prof)
    runs after each cycle's last active step. key_averages() and export_chrome_trace() read the
    last collected cycle."""

    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None,
                 record_shapes=False, profile_memory=False, with_stack=False, with_flops=False,
                 with_modules=False, experimental_config=None, use_cuda=None):
        if with_stack or with_modules:
            warnings.warn("profile: with_stack and with_modules are ignored (Kiln records ops, "
                          "record_function ranges and memory, without Python stacks)")
        acts = [ProfilerActivity.CPU] if activities is None else list(activities)
        if use_cuda:
            acts.append(ProfilerActivity.CUDA)
        for a in acts:
            if not isinstance(a, ProfilerActivity):
                raise TypeError(f"profile: activities must be ProfilerActivity values, got "
                                f"{type(a).__name__}")
        ready = None
        if on_trace_ready is not None:
            if not callable(on_trace_ready):
                raise TypeError(f"profile: on_trace_ready must be callable, got "
                                f"{type(on_trace_ready).__name__}")
            me = weakref.ref(self)  # no cycle through the C++ callback

            def ready():
                on_trace_ready(me())
        self.schedule, self.on_trace_ready = schedule, on_trace_ready
        self.record_shapes, self.profile_memory = bool(record_shapes), bool(profile_memory)
        self.with_flops = bool(with_flops)
        self._prof = _C._Profile(acts, schedule, ready, self.record_shapes, self.profile_memory,
                                 self.with_flops)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop()
        return False

    def start(self):
        self._prof.start()

    def stop(self):
        self._prof.stop()

    def step(self):
        """Ends the current step: a ProfilerStep#N range when recording, then the schedule's
        action for the next step."""
        self._prof.step()

    @property
    def step_num(self):
        return self._prof.step_num

    @property
    def current_action(self):
        return self._prof.current_action

    def key_averages(self, group_by_input_shape=False, group_by_stack_n=0):
        """One row per op name (and input shapes when group_by_input_shape, which needs
        record_shapes=True): count, total and self CPU time, FLOPs, memory; .table(sort_by=...,
        row_limit=...) prints PyTorch's table."""
        if group_by_stack_n:
            raise NotImplementedError("key_averages: group_by_stack_n needs with_stack")
        return self._prof.key_averages(bool(group_by_input_shape))

    def export_chrome_trace(self, path):
        """Writes the Chrome trace / Perfetto JSON of the last collected cycle to `path`."""
        self._prof.export_chrome_trace(os.fspath(path))


class record_function:
    """A named range around a block (context manager) or every call of a function (decorator),
    nested with the ops it runs in the trace and counted in key_averages."""

    def __init__(self, name, args=None):
        if not isinstance(name, str):
            raise TypeError(f"record_function: name must be a str, got {type(name).__name__}")
        self.name = name
        self._ranges = []  # a decorated function may recurse

    def __enter__(self):
        r = _C._RecordRange(self.name)
        r.enter()
        self._ranges.append(r)
        return self

    def __exit__(self, exc_type, exc, tb):
        self._ranges.pop().exit()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with record_function(self.name):
                return fn(*args, **kwargs)

        return wrapper
