"""Pipeline-parallel training speed (issue 21's benchmark): the GPT of WORKLOADS.md (byte vocab,
context 128, 4 layers, 4 heads, width 256), batch 16 in 8 microbatches, cut in as many stages as
`kiln run` starts ranks (2 or 4; 1: the same model unpipelined, the reference) and trained with
SGD through each schedule. Prints one JSON line per schedule on rank 0: the median step time and
the bubble (1 - busy time of all ranks / (ranks x step time)); interleaved_1f1b runs 2 stages
per rank, so 2 ranks make a 4-stage pipeline.
    kiln run --nproc 2 .venv/bin/python bench/pipeline_bench.py [--quick]"""
import json
import os
import sys
import time

import kiln
import kiln.distributed as dist
import kiln.nn.functional as F
from kiln.distributed import pipelining as pp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from chargpt import gpt_chain  # noqa: E402  the example's GPT, as a chain of modules

VOCAB, BLOCK, LAYERS, HEADS, WIDTH, BATCH, MICRO = 256, 128, 4, 4, 256, 16, 8


def gpt():
    kiln.manual_seed(0)
    return gpt_chain(VOCAB, BLOCK, LAYERS, HEADS, WIDTH)


def lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def emit(metric, value, unit):
    print(json.dumps({"workload": "pipeline_train", "metric": metric, "value": round(value, 3),
                      "unit": unit, "impl": "kiln-py"}), flush=True)


def main():
    steps = 3 if "--quick" in sys.argv else 8
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    kiln.manual_seed(1)
    x = kiln.randint(0, VOCAB, (BATCH, BLOCK))
    y = kiln.randint(0, VOCAB, (BATCH, BLOCK))
    if world == 1:  # the reference: the whole model, the whole batch, one process
        model = gpt()
        opt = kiln.optim.SGD(model.parameters(), lr=1e-3)
        times = []
        for _ in range(steps + 1):
            t0 = time.perf_counter()
            opt.zero_grad()
            lm_loss(model(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        emit("step_1stage", sorted(times[1:])[len(times[1:]) // 2] * 1e3, "ms/step")
        return
    if rank == 0:
        emit(f"bubble_{world}stages_formula", (world - 1) / (MICRO + world - 1), "fraction")
    kinds = [("gpipe", 1), ("1f1b", 1), ("zbh1", 1)]
    if world == 2:
        kinds.append(("interleaved_1f1b", 2))
    for kind, v in kinds:
        n = world * v
        per = LAYERS // n if n <= LAYERS else 0
        if per == 0:
            continue
        # Stage 0 gets the embeddings, the last the norm and head; the blocks split evenly.
        cuts = [f"1.{per * i}" for i in range(1, n)]
        pipe = pp.pipeline(gpt(), split_points=cuts)
        stages = [pipe.build_stage(c * world + rank) for c in range(v)]
        cls = {"gpipe": pp.ScheduleGPipe, "1f1b": pp.Schedule1F1B, "zbh1": pp.ScheduleZBH1,
               "interleaved_1f1b": pp.ScheduleInterleaved1F1B}[kind]
        sched = cls(stages if v > 1 else stages[0], n_microbatches=MICRO, loss_fn=lm_loss)
        opt = kiln.optim.SGD([p for s in stages for p in s.submod.parameters()], lr=1e-3)
        last = (n - 1) % world == rank
        times, bubbles = [], []
        for _ in range(steps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            if rank == 0:
                sched.step(x, target=y if last else None)
            else:
                sched.step(target=y if last else None)
            opt.step()
            span = kiln.tensor([time.perf_counter() - t0])
            busy = kiln.tensor([sum(e - s for _, s, e in sched.last_timeline())])
            dist.all_reduce(span, op=dist.ReduceOp.MAX)
            dist.all_reduce(busy)
            times.append(span.item())
            bubbles.append(1 - busy.item() / (world * span.item()))
        mid = len(times[1:]) // 2
        if rank == 0:
            emit(f"step_{n}stages_{kind}", sorted(times[1:])[mid] * 1e3, "ms/step")
            emit(f"bubble_{n}stages_{kind}", sorted(bubbles[1:])[mid], "fraction")


if __name__ == "__main__":
    main()
