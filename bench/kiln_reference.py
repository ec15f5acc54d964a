#!/usr/bin/env python3
"""Reference figures from PyTorch for the workloads in WORKLOADS.md.

Runs each workload with PyTorch on this machine's CPU and prints one JSON object
per line: {"workload", "metric", "value", "unit", "impl"}. The project's own
benchmark prints the same keys for the same workloads, so the two can be compared
side by side, in one run, as a ratio.

Usage: python3 torch_reference.py [--only NAME[,NAME...]] [--quick]
"""
import argparse
import json
import os
import sys
import time

import kiln as torch
import kiln.nn as nn
import kiln.nn.functional as F

IMPL = "kiln-py"


def emit(workload, metric, value, unit):
    print(json.dumps({"workload": workload, "metric": metric, "value": round(value, 4),
                      "unit": unit, "impl": IMPL}), flush=True)


def best_time(fn, repeat=5, inner=1):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def w_dispatch(quick):
    n = 20_000 if quick else 200_000
    a, b = torch.ones(1), torch.ones(1)
    t = best_time(lambda: [a + b for _ in range(n)], repeat=3)
    emit("dispatch", "add_1elem", t / n * 1e9, "ns/op")
    a.requires_grad_(True)
    t = best_time(lambda: [a * b for _ in range(n)], repeat=3)
    emit("dispatch", "mul_1elem_requires_grad", t / n * 1e9, "ns/op")


def w_gemm(quick):
    for n in ([512, 1024] if quick else [512, 1024, 2048]):
        A, B = torch.randn(n, n), torch.randn(n, n)
        t = best_time(lambda: torch.mm(A, B))
        emit("gemm", f"sgemm_{n}", 2 * n ** 3 / t / 1e9, "GFLOP/s")


def w_elementwise(quick):
    n = 1 << 24
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    t = best_time(lambda: torch.add(a, b, out=c))
    emit("elementwise", "add_16M", 3 * 4 * n / t / 1e9, "GB/s")
    t = best_time(lambda: F.gelu(a))
    emit("elementwise", "gelu_16M", 2 * 4 * n / t / 1e9, "GB/s")


def w_reduction(quick):
    n = 1 << 24
    a = torch.randn(n)
    t = best_time(lambda: a.sum())
    emit("reduction", "sum_16M", 4 * n / t / 1e9, "GB/s")
    x = torch.randn(4096, 1024)
    t = best_time(lambda: torch.softmax(x, dim=-1))
    emit("reduction", "softmax_4096x1024", 2 * 4 * x.numel() / t / 1e9, "GB/s")


def fwd_bwd_ms(fn, *shapes, repeat=5):
    xs = [torch.randn(*sh, requires_grad=True) for sh in shapes]

    def run():
        out = fn(*xs)
        out.backward(torch.ones_like(out))
    return best_time(run, repeat=repeat) * 1e3


def w_kernels(quick):
    torch.manual_seed(0)
    w = torch.randn(64, 32, 3, 3, requires_grad=True)
    emit("kernels", "conv2d_fwd_bwd_b32_c32_16x16",
         fwd_bwd_ms(lambda x: F.conv2d(x, w, padding=1), (32, 32, 16, 16)), "ms")
    emit("kernels", "layer_norm_fwd_bwd_4096x1024",
         fwd_bwd_ms(lambda x: F.layer_norm(x, (1024,)), (4096, 1024)), "ms")
    y = torch.randint(0, 1000, (4096,))
    emit("kernels", "cross_entropy_fwd_bwd_4096x1000",
         fwd_bwd_ms(lambda x: F.cross_entropy(x, y), (4096, 1000)), "ms")
    for T in ([128] if quick else [128, 512]):
        mask = torch.ones(T, T).tril() == 0

        def attn(q, k, v):
            att = (q @ k.transpose(-2, -1)) / 8.0
            return att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        sh = (8, 8, T, 64)
        emit("kernels", f"attention_fwd_bwd_b8_h8_t{T}_d64", fwd_bwd_ms(attn, sh, sh, sh), "ms")


def w_autograd(quick):
    x = torch.ones(1, requires_grad=True)

    def chain():
        y = x
        for _ in range(1000):
            y = y * 1.0001
        y.backward()
    emit("autograd", "backward_chain_1000_tiny", best_time(chain, repeat=3) * 1e3, "ms")


def train_ms(model, opt, make_batch, loss_fn, steps):
    x, y = make_batch()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(2):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps * 1e3


def mlp():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def w_mlp(quick):
    torch.manual_seed(0)
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ms = train_ms(m, opt, lambda: (torch.randn(512, 784), torch.randint(0, 10, (512,))),
                  F.cross_entropy, 5 if quick else 20)
    emit("mlp_train", "step_b512", ms, "ms/step")


def w_cnn(quick):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    ms = train_ms(m, opt, lambda: (torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))),
                  F.cross_entropy, 5 if quick else 20)
    emit("cnn_train", "step_b64", ms, "ms/step")


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (C // self.h) ** 0.5
        mask = torch.ones(T, T).tril() == 0
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=256, block=128, layers=4, heads=4, d=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T))
        return self.head(self.ln(self.blocks(x)))


def w_gpt(quick):
    torch.manual_seed(0)
    m = GPT()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    B, T = 16, 128
    ms = train_ms(m, opt, lambda: (torch.randint(0, 256, (B, T)), torch.randint(0, 256, (B, T))),
                  lambda logits, y: F.cross_entropy(logits.view(-1, 256), y.view(-1)),
                  3 if quick else 10)
    emit("gpt_train", "step_b16_t128", ms, "ms/step")
    emit("gpt_train", "tokens_per_s", B * T / ms * 1e3, "tokens/s")


def _dist_worker(rank, world, port, quick, q):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n = 1 << 24
    x = torch.ones(n)
    dist.all_reduce(x)
    best = float("inf")
    for _ in range(3 if quick else 5):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        best = min(best, time.perf_counter() - t0)
    # DDP on the MLP, batch 256 per rank
    torch.manual_seed(0)
    m = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ms = train_ms(m, opt, lambda: (torch.randn(256, 784), torch.randint(0, 10, (256,))),
                  F.cross_entropy, 5 if quick else 20)
    if rank == 0:
        q.put((4 * n / best / 1e9, ms))
    dist.destroy_process_group()


def w_distributed(quick):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_dist_worker, args=(r, 2, port, quick, q)) for r in range(2)]
    for p in procs:
        p.start()
    algbw, ms = q.get(timeout=600)
    for p in procs:
        p.join()
    emit("allreduce", "gloo_2ranks_64MiB_algbw", algbw, "GB/s")
    emit("ddp_train", "mlp_step_2ranks_b256", ms, "ms/step")


def w_compiled(quick):
    """The mlp, cnn and gpt steps with the model under torch.compile (Inductor's C++ backend).
    gpt_cold_s: compile plus the first step, from a fresh model, with Inductor's caches off."""
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"  # read when Inductor is first imported
    steps = 5 if quick else 20
    torch.manual_seed(0)
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ms = train_ms(torch.compile(m), opt,
                  lambda: (torch.randn(512, 784), torch.randint(0, 10, (512,))),
                  F.cross_entropy, steps)
    emit("compiled_train", "mlp_step_b512", ms, "ms/step")
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    ms = train_ms(torch.compile(m), opt,
                  lambda: (torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))),
                  F.cross_entropy, steps)
    emit("compiled_train", "cnn_step_b64", ms, "ms/step")
    torch.manual_seed(0)
    m = GPT()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    B, T = 16, 128
    x, y = torch.randint(0, 256, (B, T)), torch.randint(0, 256, (B, T))
    loss_fn = lambda logits, y: F.cross_entropy(logits.view(-1, 256), y.view(-1))
    t0 = time.perf_counter()
    cm = torch.compile(m)
    loss_fn(cm(x), y).backward()
    cold = time.perf_counter() - t0
    opt.zero_grad(set_to_none=True)
    ms = train_ms(cm, opt, lambda: (x, y), loss_fn, 3 if quick else 10)
    emit("compiled_train", "gpt_step_b16_t128", ms, "ms/step")
    emit("compiled_train", "gpt_cold_s", cold, "s")


def w_quantized(quick):
    """Inference of the MLP above, float32 and with dynamic int8 Linear layers."""
    torch.manual_seed(0)
    m = mlp().eval()
    x = torch.randn(512, 784)
    with torch.no_grad():
        emit("quantized", "mlp_infer_b512_fp32", best_time(lambda: m(x), repeat=10) * 1e3, "ms")
        q = torch.ao.quantization.quantize_dynamic(m, {nn.Linear}, dtype=torch.qint8)
        emit("quantized", "mlp_infer_b512_int8_dynamic", best_time(lambda: q(x), repeat=10) * 1e3,
             "ms")


WORKLOADS = {"dispatch": w_dispatch, "gemm": w_gemm, "elementwise": w_elementwise,
             "reduction": w_reduction, "kernels": w_kernels, "autograd": w_autograd, "mlp": w_mlp, "cnn": w_cnn, "gpt": w_gpt,
             "distributed": w_distributed, "compiled": w_compiled,
             "quantized": w_quantized}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(WORKLOADS)
    torch.set_num_threads(os.cpu_count() or 1)
    for name in names:
        WORKLOADS[name](args.quick)
    sys.exit(0)
