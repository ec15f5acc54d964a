"""The measured bubble of GPipe, 1F1B and ZB-H1 on 2 ranks under `kiln run`, against the closed
form (p-1)/(m+p-1) (See Note [Pipeline schedules] in sharding/include/kiln/dist/pipelining.h).
A timing test: ctest runs this file alone (RUN_SERIAL), since another test's load on this
machine's two cores delays the ranks' thread wake-ups by whole scheduler slices."""
import textwrap

from kiln_run import run_ranks

BUBBLE = textwrap.dedent("""
    import sys, time
    import kiln, kiln.distributed as dist, kiln.nn as nn
    from kiln.distributed import pipelining as pp

    dist.init_process_group()
    RANK, WORLD = dist.get_rank(), dist.get_world_size()

    # A stage made uniform for the purpose: each action takes a fixed time, whatever else runs.
    # (With real compute, two ranks on this machine's two shared cores run the same matmuls
    # 15-30% apart from rank to rank and step to step, which is noise, not the schedule's
    # bubble; the GPT's measured bubbles are in bench/pipeline_bench.py.) F sleeps T, and the
    # backward T per gradient it is asked for: B = 2T, I = W = T. The learned scale in front
    # makes every stage, the first too, compute its input's gradient. T is large against a
    # message's latency (0.1-0.5 ms here: the thread wake-ups of a virtual machine).
    T = 0.008
    asked = []   # the gradients each backward was asked for

    class Work(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, h, w):
            time.sleep(T)
            ctx.save_for_backward(h, w)
            return h * w

        @staticmethod
        def backward(ctx, g):
            h, w = ctx.saved_tensors
            gh = gw = None
            asked.append(ctx.needs_input_grad)
            if ctx.needs_input_grad[0]:      # I (ZB-H1 asks for it alone)
                time.sleep(T)
                gh = g * w
            if ctx.needs_input_grad[1]:      # W
                time.sleep(T)
                gw = (g * h).sum(0)
            return gh, gw

    class Uniform(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(kiln.ones(256))
            self.w = nn.Parameter(kiln.ones(256))
        def forward(self, x):
            return Work.apply(x * self.scale, self.w)

    m = int(sys.argv[1])
    stage = pp.PipelineStage(Uniform(), RANK, WORLD)
    results = {}
    for kind, cls in [("gpipe", pp.ScheduleGPipe), ("1f1b", pp.Schedule1F1B),
                      ("zbh1", pp.ScheduleZBH1)]:
        schedule = cls(stage, n_microbatches=m, loss_fn=lambda out, y: (out * y).mean())
        x, y = kiln.randn(64 * m, 256), kiln.randn(64 * m, 256)
        bubbles = []
        asked.clear()
        for step in range(7):
            dist.barrier()
            schedule.step(x, target=y) if RANK == 0 else schedule.step(target=y)
            # 1 - (busy time of all ranks) / (ranks x the step's time, from the barrier to the
            # last rank's end).
            busy = kiln.tensor([sum(e - s for _, s, e in schedule.last_timeline())])
            span = kiln.tensor([schedule.last_step_seconds()])
            dist.all_reduce(busy)
            dist.all_reduce(span, op=dist.ReduceOp.MAX)
            bubbles.append(1 - busy.item() / (WORLD * span.item()))
        results[kind] = min(bubbles)   # the step that other processes disturbed least
        # Every schedule's backward runs in two halves (B is I then W at once), and each half
        # computes only its own gradient: the last stage has an input gradient to send, the
        # first none, so its whole backward is W.
        assert set(asked) == ({(True, False), (False, True)} if RANK else {(True, True)}), \
            (kind, set(asked))
    want = (WORLD - 1) / (m + WORLD - 1)
    if RANK == 0:
        print("bubbles", results, "formula", want, flush=True)
    for kind in ("gpipe", "1f1b"):
        assert abs(results[kind] - want) <= 0.1 * want, (kind, results[kind], want)
    assert results["zbh1"] < results["1f1b"], results
    print(f"rank {RANK} ok", flush=True)
""")



def test_measured_bubbles(tmp_path):
    out = run_ranks(tmp_path, "bubble", BUBBLE, 2, "4", timeout=150, env={"OMP_NUM_THREADS": "1"})
    print(out)
