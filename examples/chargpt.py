"""examples/chargpt in Python: trains the byte-level GPT of examples/chargpt/gpt.h on the plain
fortune files of Debian's `fortunes` package, then samples from it. Same model, data, split,
batches, AdamW settings, schedule and seeds as chargpt.cpp, so the two print the same losses (to
float rounding) for the same arguments.

    PYTHONPATH=build/python .venv/bin/python examples/chargpt.py [--data DIR] [--steps N]
        [--eval-every K] [--ckpt DIR [--resume]] [--prompt TEXT] [--temperature T] [--top-k K]
        [--sample-bytes N] [--seed S] [--fsdp N [--bf16]] [--tp M] [--pp P] [--print-losses]
    build/bin/kiln run --nproc 4 .venv/bin/python examples/chargpt.py --fsdp 4

--fsdp N trains on N ranks (`kiln run --nproc N`), every block and then the whole model
fully_shard-ed, each rank taking BATCH / N rows of each batch; --tp M shards every block's
attention and MLP over M ranks (qkv and fc column-wise, proj and out row-wise), every rank taking
the whole batch. Either trains the same model on the same batches as one process does, so the
losses match it to float rounding (--print-losses prints every step's loss in full). Both
together (`kiln run --nproc 4 ... --fsdp 2 --tp 2`) train 2-D: tensor parallel inside each pair of
ranks, FSDP across the pairs. --bf16 (with --fsdp) is FSDP's mixed precision: parameters gathered
and computed in bfloat16, gradients reduced in float32, float32 shards and optimizer; its losses
follow the float32 run to about 1e-3. --pp P (2 or 4, under `kiln run --nproc P`) cuts the GPT
into P pipeline stages (kiln.distributed.pipelining, 1F1B over 4 microbatches of 4 rows); the
losses match one process too, and evaluation and sampling run through the pipeline.

The files of DIR (default /usr/share/games/fortunes; *.dat and *.u8 skipped) are concatenated as
bytes in sorted order; the first 90% train, the rest validate. Each step draws 16 random windows
of 128 bytes (seeded). Every K steps it prints the mean training loss since the last line, the
validation loss (the same 16 validation batches every time) and the step time, and with --ckpt
saves a training checkpoint through kiln.save (model, optimizer, scheduler, RNG and batch-sampler
state); --resume continues from it. A run of 400 steps or more exits with status 1 if the final
validation loss is not below 2.5 nats per byte.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

import kiln
import kiln.distributed
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

BATCH = 16
DEVICE = "cpu"  # where the model lives: a gang's "remote:N" with --remote or under kiln submit
EVAL_BATCHES = 16
LR, MIN_LR, WEIGHT_DECAY, WARMUP = 1e-3, 1e-4, 0.1, 50


class Block(nn.Module):
    """Pre-LayerNorm causal self-attention and a GELU MLP (x4). x: (B, T, C) -> (B, T, C)."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        B, T, C = x.shape
        # (B, T, C) -> (B, H, T, D) each
        q, k, v = (t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    """Token + learned position embeddings, blocks, a final LayerNorm and a linear head; the
    parameter names of gpt.h. idx: (B, T) int64, T <= block -> logits (B, T, vocab)."""

    def __init__(self, vocab=256, block=128, layers=4, heads=4, width=256):
        super().__init__()
        self.vocab, self.block = vocab, block
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        if T > self.block:
            raise ValueError(f"GPT: sequence length {T} exceeds the context of {self.block}")
        x = self.tok(idx) + self.pos(kiln.arange(T, device=idx.device))
        return self.head(self.ln(self.blocks(x)))


class Embeddings(nn.Module):
    """Token + learned position embeddings: idx (B, T) int64 -> (B, T, width)."""

    def __init__(self, vocab, block, width):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)

    def forward(self, idx):
        return self.tok(idx) + self.pos(kiln.arange(idx.shape[1], device=idx.device))


def gpt_chain(vocab=256, block=128, layers=4, heads=4, width=256):
    """GPT's computation as an nn.Sequential (embeddings, blocks, final LayerNorm, head): the form
    kiln.distributed.pipelining.pipeline() cuts into stages ("1.2" starts a stage at block 2)."""
    return nn.Sequential(Embeddings(vocab, block, width),
                         nn.Sequential(*[Block(width, heads) for _ in range(layers)]),
                         nn.LayerNorm(width), nn.Linear(width, vocab, bias=False))


def decay_groups(model, weight_decay):
    """nanoGPT's AdamW grouping: matrices decay by weight_decay, vectors not at all."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


def read_fortunes(directory):
    """(bytes of the plain fortune files of `directory` concatenated in sorted order, count)."""
    names = sorted(n for n in os.listdir(directory)
                   if not n.endswith((".dat", ".u8"))
                   and not os.path.islink(os.path.join(directory, n))
                   and os.path.isfile(os.path.join(directory, n)))
    text = b"".join(open(os.path.join(directory, n), "rb").read() for n in names)
    return np.frombuffer(text, dtype=np.uint8), len(names)


def get_batch(text, block, gen):
    """x, y: (BATCH, block) int64; y is x shifted by one byte. Window starts come from `gen`."""
    starts = kiln.randint(0, len(text) - block, (BATCH,), generator=gen).numpy()
    idx = starts[:, None] + np.arange(block)
    return (kiln.from_numpy(text[idx].astype(np.int64)),
            kiln.from_numpy(text[idx + 1].astype(np.int64)))


def lm_loss(model, x, y):
    logits = model(x.to(DEVICE)).float()  # bfloat16 under --bf16: the loss is taken in float32
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(DEVICE).reshape(-1))


@kiln.no_grad()
def evaluate(model, text):
    """The mean loss over EVAL_BATCHES batches of `text`, always the same ones (a fixed seed)."""
    gen = kiln.Generator().manual_seed(0)
    return sum(lm_loss(model, *get_batch(text, model.block, gen)).item()
               for _ in range(EVAL_BATCHES)) / EVAL_BATCHES


def save(path, step, model, opt, sched, batch_gen):
    """A training checkpoint: the model and the optimizer's tensors as groups, the rest as JSON."""
    osd = opt.state_dict()
    kiln.save({"model": dict(model.state_dict()),
               "optimizer": {f"{i}.{k}": v for i, s in osd["state"].items() for k, v in s.items()},
               "optimizer_groups": osd["param_groups"], "scheduler": sched.state_dict(),
               "step": step, "rng": list(kiln.default_generator().get_state()),
               "batch_rng": list(batch_gen.get_state())}, path)


def load(path, model, opt, sched, batch_gen):
    """Restores what save() wrote; returns the step it was taken at."""
    c = kiln.load(path)
    model.load_state_dict(c["model"])
    state = {}
    for key, t in c["optimizer"].items():
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = t
    opt.load_state_dict({"state": state, "param_groups": c["optimizer_groups"]})
    sched.load_state_dict(c["scheduler"])
    kiln.default_generator().set_state(tuple(c["rng"]))
    batch_gen.set_state(tuple(c["batch_rng"]))
    return c["step"]


@kiln.no_grad()
def sample(model, prompt, n, temperature, top_k, seed):
    """Continues `prompt` by `n` bytes, each drawn from the top_k most likely next bytes at
    `temperature`; prints the printable ones as they come."""
    model.eval()
    rng = np.random.default_rng(seed)
    ctx = list(prompt.encode()) or [ord("\n")]

    def put(c):
        if 32 <= c < 127 or c in (9, 10):
            sys.stdout.write(chr(c))
    for c in ctx:
        put(c)
    for _ in range(n):
        idx = kiln.tensor([ctx[-model.block:]]).to(DEVICE)
        logits = model(idx)[0, -1].numpy().astype(np.float64)  # (vocab)
        top = np.argsort(-logits, kind="stable")[:min(top_k, model.vocab)]
        p = np.exp((logits[top] - logits[top[0]]) / temperature)
        nxt = int(top[rng.choice(len(top), p=p / p.sum())])
        ctx.append(nxt)
        put(nxt)
    print(flush=True)
    model.train()


class Pipelined:
    """--pp: this rank's stage of the GPT cut into `pp` stages (gpt_chain, the same parameters as
    GPT for one seed), trained by 1F1B over 4 microbatches; called as the whole model (evaluate,
    sample), it runs the batch through the pipeline and every rank gets the logits."""

    def __init__(self, model, pp, block):
        from kiln.distributed import pipelining
        self.rank, self.pp, self.block, self.vocab = kiln.distributed.get_rank(), pp, block, 256
        per = len(model[1]) // pp  # blocks per stage
        pipe = pipelining.pipeline(model, split_points=[f"1.{per * k}" for k in range(1, pp)])
        self.stage = pipe.build_stage(self.rank)
        self.train_schedule = pipelining.Schedule1F1B(
            self.stage, n_microbatches=4,
            loss_fn=lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                      y.reshape(-1)))
        self.eval_schedule = pipelining.ScheduleGPipe(self.stage, n_microbatches=1)

    def parameters(self):
        return self.stage.submod.parameters()

    def eval(self):
        self.stage.submod.eval()

    def train(self):
        self.stage.submod.train()

    def __call__(self, idx):
        first, last = self.rank == 0, self.rank == self.pp - 1
        out = self.eval_schedule.eval(idx) if first else self.eval_schedule.eval()
        if not last:
            out = kiln.empty([idx.shape[0], idx.shape[1], self.vocab])
        kiln.distributed.broadcast(out, src=self.pp - 1)
        return out

    def step(self, x, y):
        """Forward and backward of the batch; returns its loss (the mean over the microbatches),
        the same on every rank."""
        losses = []
        if self.rank == 0:
            self.train_schedule.step(x)
        elif self.rank == self.pp - 1:
            self.train_schedule.step(target=y, losses=losses)
        else:
            self.train_schedule.step()
        t = kiln.tensor([sum(loss.item() for loss in losses) / 4 if losses else 0.0])
        kiln.distributed.broadcast(t, src=self.pp - 1)
        return t.item()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--prompt", default="The meaning of life is")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--sample-bytes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--fsdp", type=int, default=1, help="FSDP ranks (under kiln run)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (under kiln run)")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages, 2 or 4 (under kiln run)")
    ap.add_argument("--bf16", action="store_true",
                    help="with --fsdp: compute in bfloat16, reduce gradients in float32")
    ap.add_argument("--print-losses", action="store_true", help="print every step's loss")
    ap.add_argument("--remote", default="",
                    help="a coordinator: train on a gang of fsdp x tp of its workers")
    args = ap.parse_args(argv)
    if args.fsdp < 1 or args.tp < 1:
        ap.error("--fsdp and --tp must be >= 1")
    if args.bf16 and args.fsdp == 1:
        ap.error("--bf16 is FSDP's mixed precision: it needs --fsdp N with N > 1")
    if BATCH % args.fsdp:
        ap.error(f"--fsdp {args.fsdp} must divide the batch of {BATCH}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    remote = args.remote or os.environ.get("KILN_JOB_ID")
    if remote and world > 1:
        ap.error("--remote (or kiln submit) drives a gang from one process: not under kiln run")
    if not remote and args.fsdp * args.tp > 1 and world != args.fsdp * args.tp:
        ap.error(f"--fsdp {args.fsdp} --tp {args.tp} needs {args.fsdp * args.tp} ranks: run it "
                 f"as `kiln run --nproc {args.fsdp * args.tp} ...` (WORLD_SIZE is {world})")
    if (args.fsdp * args.tp > 1 or remote) and args.ckpt:
        ap.error("--ckpt with --fsdp, --tp or --remote (sharded checkpoints) is not supported yet")
    if args.pp != 1:
        if args.pp not in (2, 4):
            ap.error(f"--pp {args.pp}: the GPT's 4 blocks cut into 2 or 4 stages")
        if args.fsdp * args.tp > 1 or remote or args.ckpt:
            ap.error("--pp runs alone: not with --fsdp, --tp, --remote or --ckpt")
        if world != args.pp:
            ap.error(f"--pp {args.pp} needs {args.pp} ranks: run it as `kiln run --nproc "
                     f"{args.pp} ...` (WORLD_SIZE is {world})")
    if args.steps < 1 or args.eval_every < 1 or args.temperature <= 0 or args.top_k < 1:
        ap.error("--steps, --eval-every and --top-k must be >= 1, --temperature > 0")
    if args.resume and not args.ckpt:
        ap.error("--resume needs --ckpt DIR")
    return args


def parallelize(model, fsdp, tp, bf16=False):
    """Shards `model` over a (dp, tp) mesh of fsdp x tp ranks: tensor parallel over "tp" first,
    then every block and the whole model fully_shard-ed over "dp" (2-D FSDP x TP). The mesh is laid
    over the ranks of `kiln run`, or over the workers of the session's gang (DEVICE "remote:N":
    this one process records the program every worker runs). Returns the mesh. bf16: FSDP gathers
    the parameters in bfloat16 (forward and backward compute in it) and reduces the gradients in
    float32; the shards and the optimizer stay float32."""
    from kiln.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(DEVICE, (fsdp, tp), mesh_dim_names=("dp", "tp"))
    if tp > 1:
        from kiln.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                      parallelize_module)
        # qkv's output stays a DTensor: its q, k, v split cuts across the column shards.
        parallelize_module(model, mesh["tp"],
                           {"blocks.*.qkv": ColwiseParallel(use_local_output=False),
                            "blocks.*.proj": RowwiseParallel(),
                            "blocks.*.fc": ColwiseParallel(),
                            "blocks.*.out": RowwiseParallel()})
    if fsdp > 1:
        from kiln.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy()
        if bf16:
            mp = MixedPrecisionPolicy(param_dtype=kiln.bfloat16, reduce_dtype=kiln.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"], mp_policy=mp)
        fully_shard(model, mesh=mesh["dp"], mp_policy=mp)
    return mesh


def my_rows(t, mesh):
    """This rank's rows of a batch: rows [r * B / dp, (r + 1) * B / dp) for dp rank r (each
    worker keeps its own on a gang)."""
    if mesh is None:
        return t
    from kiln.distributed.tensor import Replicate, Shard, distribute_tensor
    return distribute_tensor(t, mesh, [Shard(0), Replicate()]).to_local()


def dp_mean(loss, mesh):
    """The mean over the dp ranks of each one's loss (the whole batch's loss)."""
    if mesh is None or mesh.size(0) == 1:
        return loss.item()
    from kiln.distributed.tensor import DTensor, Partial
    return DTensor.from_local(loss.detach().reshape([1]), mesh["dp"],
                              [Partial("avg")]).full_tensor().item()


def main(argv):
    args = parse_args(argv)
    missing = "(install the fortunes: sudo apt-get install fortunes, or pass --data DIR)"
    if not os.path.isdir(args.data):
        print(f"chargpt: data directory {args.data} not found {missing}", file=sys.stderr)
        return 2
    text, files = read_fortunes(args.data)
    block = 128
    if len(text) < 20 * (block + 1):
        print(f"chargpt: only {len(text)} bytes of text in {args.data} {missing}", file=sys.stderr)
        return 2
    n_train = len(text) * 9 // 10
    train, val = text[:n_train], text[n_train:]
    print(f"chargpt: {files} files, {len(text)} bytes: {len(train)} train / {len(val)} validation")

    global DEVICE
    session = None
    if args.remote or os.environ.get("KILN_JOB_ID"):  # a job's driver trains on the job's gang
        session = kiln.connect(args.remote or None, workers=args.fsdp * args.tp, wait_ms=60000)
        DEVICE = str(session.device)
        print(f"chargpt: recording for a gang of {session.world_size} workers ({DEVICE})")
    kiln.manual_seed(args.seed)
    model = GPT(block=block) if args.pp == 1 else gpt_chain(block=block)
    n_params = sum(p.numel() for p in model.parameters())
    model.to(DEVICE)
    mesh = None
    if args.pp > 1:
        kiln.distributed.init_process_group()
        model = Pipelined(model, args.pp, block)
        if model.rank:  # one rank prints
            sys.stdout = open(os.devnull, "w")
    if args.fsdp * args.tp > 1:
        import warnings
        warnings.simplefilter("ignore")  # DTensor's replicate-path warnings (attention)
        mesh = parallelize(model, args.fsdp, args.tp, args.bf16)
        if session is None and kiln.distributed.get_rank():  # one rank prints
            sys.stdout = open(os.devnull, "w")
    opt = kiln.optim.AdamW(decay_groups(model, WEIGHT_DECAY), lr=LR)
    # Linear warm-up from LR / 10, then cosine annealing down to MIN_LR at the last step.
    sched = SequentialLR(opt, [LinearLR(opt, start_factor=0.1, total_iters=WARMUP),
                               CosineAnnealingLR(opt, T_max=max(1, args.steps - WARMUP),
                                                 eta_min=MIN_LR)], milestones=[WARMUP])
    batch_gen = kiln.Generator().manual_seed(args.seed)
    step = 0
    if args.resume and os.path.isdir(args.ckpt) and os.listdir(args.ckpt):  # saved atomically
        step = load(args.ckpt, model, opt, sched, batch_gen)
        print(f"chargpt: resumed from {args.ckpt} at step {step}")
    elif args.resume:
        print(f"chargpt: no checkpoint in {args.ckpt} yet; starting from step 0")
    print(f"chargpt: GPT 4 layers, 4 heads, width 256, context {block}: {n_params / 1e6:.2f}M "
          f"parameters; batch {BATCH}, AdamW lr {LR:g}, {args.steps} steps"
          + (f"; FSDP on {args.fsdp} ranks" if args.fsdp > 1 else "")
          + (f"; tensor parallel on {args.tp} ranks" if args.tp > 1 else "")
          + (f"; {args.pp} pipeline stages (1F1B, 4 microbatches)" if args.pp > 1 else "")
          + ("; bfloat16 compute" if args.bf16 else ""), flush=True)

    start = last = time.perf_counter()
    loss_sum, losses, val_loss = 0.0, 0, math.nan
    while step < args.steps:
        x, y = get_batch(train, block, batch_gen)
        opt.zero_grad()
        if args.pp > 1:
            value = model.step(x, y)
        else:
            loss = lm_loss(model, my_rows(x, mesh), my_rows(y, mesh))
            loss.backward()
            value = dp_mean(loss, mesh)  # this rank's rows: the batch's loss is the mean over dp
        opt.step()
        sched.step()
        loss_sum += value
        losses += 1
        step += 1
        if args.print_losses:
            print(f"step {step} loss {value!r}", flush=True)
        if step % args.eval_every and step != args.steps:
            continue
        ms = (time.perf_counter() - last) / losses * 1e3
        val_loss = evaluate(model, val)
        print(f"step {step} train loss {loss_sum / losses:.4f} val loss {val_loss:.4f} "
              f"({ms:.0f} ms/step, lr {sched.get_last_lr()[0]:.2e})", flush=True)
        if args.ckpt:
            save(args.ckpt, step, model, opt, sched, batch_gen)
        loss_sum, losses, last = 0.0, 0, time.perf_counter()
    if math.isnan(val_loss):
        val_loss = evaluate(model, val)
    print(f"chargpt: validation loss {val_loss:.4f} after {step} steps "
          f"({time.perf_counter() - start:.0f} s; ln 256 = {math.log(256):.4f})")
    print(f"--- sample (temperature {args.temperature:g}, top-k {args.top_k}) ---")
    sample(model, args.prompt, args.sample_bytes, args.temperature, args.top_k, args.seed)
    if args.steps >= 400 and val_loss >= 2.5:
        print("chargpt: FAILED, validation loss not below 2.5")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
