"""kiln.nn.parallel: DistributedDataParallel (torch.nn.parallel.DistributedDataParallel).

    dist.init_process_group("ucx")                  # kiln run --nproc 2 python train.py
    model = kiln.nn.parallel.DistributedDataParallel(Net())
    loss = loss_fn(model(x), y)                     # x: this rank's share of the batch
    loss.backward()                                 # .grad: the mean over the ranks
    with model.no_sync():                           # accumulate locally, synchronise later
        loss_fn(model(x2), y2).backward()

The gradient work is C++'s (kiln::dist::Reducer, Note [DDP buckets] in kiln/dist/ddp.h): hooks on
the parameters copy each gradient into a bucket of about bucket_cap_mb, full buckets are
all-reduced (averaged) asynchronously while backward goes on, and the end of backward waits for
them and writes the averages back into .grad.
"""
from contextlib import contextmanager

from kiln import _C
from kiln.nn.module import Module

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0, broadcast_buffers=True,
                 process_group=None, bucket_cap_mb=25, find_unused_parameters=False, **kwargs):
        super().__init__()
        if device_ids not in (None, []) or output_device is not None:
            raise ValueError("DistributedDataParallel: device_ids/output_device are for CUDA "
                             "modules; Kiln's DDP runs on the CPU (leave them unset)")
        if dim != 0:
            raise ValueError("DistributedDataParallel: only dim=0 is supported")
        self.module = module
        group = _C._default_group() if process_group is None else process_group
        object.__setattr__(self, "process_group", group)
        object.__setattr__(self, "broadcast_buffers", broadcast_buffers)
        params = [(n, p) for n, p in module.named_parameters()]
        # Every replica starts from rank 0's parameters and buffers.
        _C._broadcast_tensors(group, [p for _, p in params] + [b for _, b in module.named_buffers()], 0)
        object.__setattr__(self, "reducer", _C._DdpReducer(params, group, float(bucket_cap_mb),
                                                           bool(find_unused_parameters)))

    def forward(self, *args, **kwargs):
        self.reducer.prepare_for_forward()
        if self.broadcast_buffers:
            _C._broadcast_tensors(self.process_group, [b for _, b in self.module.named_buffers()], 0)
        return self.module(*args, **kwargs)

    @property
    def require_backward_grad_sync(self):
        return self.reducer.sync

    @contextmanager
    def no_sync(self):
        """Inside, backward only accumulates into .grad; the first backward after it all-reduces
        the accumulated gradients."""
        prev = self.reducer.sync
        self.reducer.sync = False
        try:
            yield
        finally:
            self.reducer.sync = prev
