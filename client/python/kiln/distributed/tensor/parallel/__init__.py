"""kiln.distributed.tensor.parallel: tensor parallelism over DTensor
(torch.distributed.tensor.parallel's names and defaults).

    # kiln run --nproc 2 .venv/bin/python train.py
    from kiln.distributed.device_mesh import init_device_mesh
    from kiln.distributed.tensor import Shard
    from kiln.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                  SequenceParallel, loss_parallel,
                                                  parallelize_module)
    tp = init_device_mesh("cpu", (2,))
    parallelize_module(mlp, tp, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    y = mlp(x)                      # x and y: plain tensors, the same on every rank
    with loss_parallel():           # vocab-sharded logits, never gathered
        loss = F.cross_entropy(head_logits, target)
        loss.backward()

The styles shard nn.Linear and nn.Embedding (ColwiseParallel, RowwiseParallel) and norms and
dropout (SequenceParallel); PrepareModuleInput and PrepareModuleOutput convert any module's
inputs and outputs. See Note [Tensor parallel styles] and Note [Vocab-parallel cross entropy].
"""
from kiln.distributed.tensor.parallel.api import parallelize_module
from kiln.distributed.tensor.parallel.loss import loss_parallel
from kiln.distributed.tensor.parallel.style import (ColwiseParallel, ParallelStyle,
                                                    PrepareModuleInput, PrepareModuleOutput,
                                                    RowwiseParallel, SequenceParallel)

__all__ = ["parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel",
           "SequenceParallel", "PrepareModuleInput", "PrepareModuleOutput", "loss_parallel"]
