// kiln_bench: times the WORKLOADS.md workloads through Kiln's C++ API and, in the same run, the
// references the issue names: oneDNN's dnnl_sgemm called directly ("onednn-direct") and plain
// OpenMP loops ("openmp-loop"). One JSON object per line.
//
//   kiln_bench [--only
//   dispatch,gemm,elementwise,reduction,autograd,kernels,mlp,cnn,gpt,distributed,
//                      sharded,quantized] [--quick]
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include "kiln/autograd/autograd.h"
#include "kiln/autograd/engine.h"
#include "kiln/dist/ddp.h"
#include "kiln/dist/dtensor.h"
#include "kiln/dist/fsdp.h"
#include "kiln/dist/process_group.h"
#include "kiln/dist/tensor_parallel.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"

using namespace kiln;

namespace {

// The references: plain OpenMP loops over raw buffers, as a C programmer would write them.
__attribute__((noinline)) void omp_add(const float* __restrict x, const float* __restrict y,
                                       float* __restrict z, int64_t n, int threads) {
#pragma omp parallel for simd schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) z[i] = x[i] + y[i];
}

__attribute__((noinline)) float omp_sum(const float* __restrict x, int64_t n, int threads) {
  float acc = 0;
#pragma omp parallel for simd reduction(+ : acc) schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) acc += x[i];
  return acc;
}

void emit(const char* workload, const std::string& metric, double value, const char* unit,
          const char* impl) {
  std::printf(
      "{\"workload\": \"%s\", \"metric\": \"%s\", \"value\": %.4f, \"unit\": \"%s\", \"impl\": "
      "\"%s\"}\n",
      workload, metric.c_str(), value, unit, impl);
  std::fflush(stdout);
}

// Best of `repeat` timings of `inner` calls, after one warm-up call (seconds per call).
double best_time(const std::function<void()>& fn, int repeat = 5, int inner = 1) {
  if (repeat > 1) fn();
  double best = 1e30;
  for (int r = 0; r < repeat; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < inner; ++i) fn();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, t / inner);
  }
  return best;
}

// Best times of `a` and `b`, alternating them in each repetition so that drift in the
// machine's speed (turbo, neighbours) falls on both sides alike.
std::pair<double, double> best_time_pair(const std::function<void()>& a,
                                         const std::function<void()>& b, int repeat = 7) {
  double ta = 1e30, tb = 1e30;
  a();
  b();
  for (int r = 0; r < repeat; ++r) {
    ta = std::min(ta, best_time(a, 1));
    tb = std::min(tb, best_time(b, 1));
  }
  return {ta, tb};
}

void w_dispatch(bool quick) {
  int n = quick ? 20000 : 200000;
  Tensor a = ones({1}), b = ones({1});
  Tensor c;
  double t = best_time(
      [&] {
        for (int i = 0; i < n; ++i) c = a + b;
      },
      3);
  emit("dispatch", "add_1elem", t / n * 1e9, "ns/op", "kiln-cpp");
  a.requires_grad_(true);
  double tg = best_time(
      [&] {
        for (int i = 0; i < n; ++i) c = a * b;
      },
      3);
  emit("dispatch", "mul_1elem_requires_grad", tg / n * 1e9, "ns/op", "kiln-cpp");
}

void w_autograd(bool) {
  Tensor x = ones({1}).requires_grad_(true);
  double t = best_time(
      [&] {
        Tensor y = x;
        for (int i = 0; i < 1000; ++i) y = y * 1.0001;
        y.backward();
      },
      3);
  emit("autograd", "backward_chain_1000_tiny", t * 1e3, "ms", "kiln-cpp");
}

void w_gemm(bool quick) {
  std::vector<int64_t> sizes =
      quick ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{512, 1024, 2048};
  for (int64_t n : sizes) {
    manual_seed(0);
    Tensor A = randn({n, n}), B = randn({n, n});
    Tensor C;
    double flops = 2.0 * n * n * n;
    Tensor D = empty({n, n});
    const float* a = A.data_ptr<float>();
    const float* bb = B.data_ptr<float>();
    float* d = D.data_ptr<float>();
    auto [t, td] =
        best_time_pair([&] { C = mm(A, B); },
                       [&] { dnnl_sgemm('N', 'N', n, n, n, 1.0f, a, n, bb, n, 0.0f, d, n); });
    emit("gemm", "sgemm_" + std::to_string(n), flops / t / 1e9, "GFLOP/s", "kiln-cpp");
    emit("gemm", "sgemm_" + std::to_string(n), flops / td / 1e9, "GFLOP/s", "onednn-direct");
  }
}

void w_elementwise(bool) {
  const int64_t n = int64_t{1} << 24;
  manual_seed(0);
  Tensor a = randn({n}), b = randn({n}), c = empty({n});
  const float* x = a.data_ptr<float>();
  const float* y = b.data_ptr<float>();
  float* z = c.data_ptr<float>();
  int threads = get_num_threads();
  auto [t, tl] = best_time_pair([&] { add_out(c, a, b); }, [&] { omp_add(x, y, z, n, threads); });
  emit("elementwise", "add_16M", 12.0 * n / t / 1e9, "GB/s", "kiln-cpp");
  emit("elementwise", "add_16M", 12.0 * n / tl / 1e9, "GB/s", "openmp-loop");
  // As the reference's lambda, each result is dropped before the next call, so the allocator
  // hands the same block back (keeping the last one alive would add 64 MiB to the working set).
  double tg = best_time([&] { (void)gelu(a); });
  emit("elementwise", "gelu_16M", 8.0 * n / tg / 1e9, "GB/s", "kiln-cpp");
}

void w_reduction(bool) {
  const int64_t n = int64_t{1} << 24;
  manual_seed(0);
  Tensor a = randn({n});
  Tensor s;
  const float* x = a.data_ptr<float>();
  int threads = get_num_threads();
  volatile float sink = 0;
  auto [t, tl] = best_time_pair([&] { s = a.sum(); }, [&] { sink = omp_sum(x, n, threads); });
  emit("reduction", "sum_16M", 4.0 * n / t / 1e9, "GB/s", "kiln-cpp");
  (void)sink;
  emit("reduction", "sum_16M", 4.0 * n / tl / 1e9, "GB/s", "openmp-loop");
  Tensor X = randn({4096, 1024});
  double ts = best_time([&] { (void)softmax(X, -1); });  // dropped, as in w_elementwise
  emit("reduction", "softmax_4096x1024", 8.0 * X.numel() / ts / 1e9, "GB/s", "kiln-cpp");
}

// layer_norm_fwd_bwd_4096x1024, cross_entropy_fwd_bwd_4096x1000: forward, then the gradients of
// the inputs (autograd::grad, so nothing accumulates into .grad between repetitions).
void w_norm_loss(bool) {
  Tensor x = randn({4096, 1024}).requires_grad_(), g = randn({4096, 1024});
  Tensor w = ones({1024}).requires_grad_(), b = zeros({1024}).requires_grad_();
  double t = best_time([&] {
    Tensor y = layer_norm(x, {1024}, w, b);
    autograd::grad({y}, {x, w, b}, {g});
  });
  emit("kernels", "layer_norm_fwd_bwd_4096x1024", t * 1e3, "ms", "kiln-cpp");
  Tensor logits = randn({4096, 1000}).requires_grad_();
  Tensor target = randint(0, 1000, {4096});
  double tc = best_time([&] {
    Tensor loss = cross_entropy(logits, target);
    autograd::grad({loss}, {logits});
  });
  emit("kernels", "cross_entropy_fwd_bwd_4096x1000", tc * 1e3, "ms", "kiln-cpp");
}

// conv2d 32 -> 64 channels, 3x3, pad 1, no bias, on 32x32x16x16: forward, then backward for the
// input and the weight (gradients accumulate into .grad), as shared/bench/torch_reference.py.
void w_kernels_conv(bool) {
  Tensor x = randn({32, 32, 16, 16}).requires_grad_(), w = randn({64, 32, 3, 3}).requires_grad_();
  Tensor gy = ones({32, 64, 16, 16});
  double t = best_time([&] { conv2d(x, w, std::nullopt, {1, 1}, {1, 1}).backward(gy); }, 7);
  emit("kernels", "conv2d_fwd_bwd_b32_c32_16x16", t * 1e3, "ms", "kiln-cpp");
}

// Causal attention forward and backward through the fused kernel (torch_cpp_ref: written out).
void w_attention(bool quick) {
  for (int64_t T : {128, 512}) {
    manual_seed(0);
    Tensor q = randn({8, 8, T, 64}).requires_grad_(), k = randn({8, 8, T, 64}).requires_grad_();
    Tensor v = randn({8, 8, T, 64}).requires_grad_(), g = randn({8, 8, T, 64});
    double t = best_time(
        [&] {
          Tensor out = scaled_dot_product_attention(q, k, v, 0.0, true);
          autograd::grad({out}, {q, k, v}, {g});
        },
        quick ? 2 : 5);
    emit("kernels", "attention_fwd_bwd_b8_h8_t" + std::to_string(T) + "_d64", t * 1e3, "ms",
         "kiln-cpp");
  }
}

// The training workloads (mlp, cnn, gpt) as shared/bench/torch_reference.py's train_ms: one fixed
// batch; a step is zero_grad(set_to_none), forward, loss, backward, optimizer step and reading
// the loss; two warm-up steps, then the mean over `steps` steps (ms per step).
double train_ms(nn::Module& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y,
                const std::function<Tensor(const Tensor&, const Tensor&)>& loss_fn, int steps) {
  volatile float sink = 0;
  auto step = [&] {
    opt.zero_grad(true);
    Tensor loss = loss_fn(model.forward(x), y);
    loss.backward();
    opt.step();
    sink = loss.item<float>();
  };
  for (int i = 0; i < 2; ++i) step();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  (void)sink;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps * 1e3;
}

Tensor ce(const Tensor& logits, const Tensor& y) { return cross_entropy(logits, y); }
// The GPT's loss: (B, T, 256) logits against (B, T) bytes.
Tensor gpt_loss(const Tensor& logits, const Tensor& y) {
  return cross_entropy(logits.view({-1, 256}), y.view({-1}));
}

// torch_reference.py's mlp(): 784-1024-1024-10 with ReLUs.
std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(784, 1024), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(1024, 1024), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(1024, 10)});
}

// The MLP, cross-entropy, AdamW(1e-3), batch 512.
void w_mlp(bool quick) {
  manual_seed(0);
  auto m = mlp();
  optim::AdamW opt(m->parameters(), {.lr = 1e-3});
  Tensor x = randn({512, 784}), y = randint(0, 10, {512});
  emit("mlp_train", "step_b512", train_ms(*m, opt, x, y, ce, quick ? 5 : 20), "ms/step",
       "kiln-cpp");
}

// torch_reference.py's w_quantized: inference (no grad) of the MLP on a 512x784 batch, in float32
// and with its Linear layers dynamically quantized (int8 weights per output channel, prepacked
// once by quantize_weight_per_channel; activations quantized per batch by linear_int8_dynamic,
// the ReLUs fused into it as kiln.ao.quantization.quantize_dynamic does).
void w_quantized(bool quick) {
  manual_seed(0);
  auto m = mlp();
  Tensor x = randn({512, 784});
  autograd::NoGradGuard ng;
  emit("quantized", "mlp_infer_b512_fp32", best_time([&] { (void)m->forward(x); }, 10) * 1e3, "ms",
       "kiln-cpp");
  struct Layer {
    Tensor q, scale, bias;
    bool relu;
  };
  std::vector<Layer> layers;
  for (size_t i = 0; i < m->size(); ++i) {
    auto* lin = dynamic_cast<nn::Linear*>((*m)[static_cast<int64_t>(i)].get());
    if (!lin) continue;
    auto [q, scale] = quantize_weight_per_channel(lin->weight, 0);
    layers.push_back({q, scale, lin->bias, i + 1 < m->size()});
  }
  auto run = [&] {
    Tensor h = x;
    for (const Layer& l : layers) h = linear_int8_dynamic(h, l.q, l.scale, l.bias, l.relu);
    return h;
  };
  emit("quantized", "mlp_infer_b512_int8_dynamic", best_time([&] { (void)run(); }, 10) * 1e3, "ms",
       "kiln-cpp");
}

// conv(3->32)-ReLU-maxpool2-conv(32->64)-ReLU-maxpool2-flatten-linear(4096->10), SGD momentum 0.9.
void w_cnn(bool quick) {
  manual_seed(0);
  auto conv = [](int64_t in, int64_t out) {
    return std::make_shared<nn::Conv2d>(in, out, std::vector<int64_t>{3},
                                        nn::ConvArgs{.padding = {1}});
  };
  auto pool = [] { return std::make_shared<nn::MaxPool2d>(std::vector<int64_t>{2}); };
  nn::Sequential m({conv(3, 32), std::make_shared<nn::ReLU>(), pool(), conv(32, 64),
                    std::make_shared<nn::ReLU>(), pool(), std::make_shared<nn::Flatten>(),
                    std::make_shared<nn::Linear>(64 * 8 * 8, 10)});
  optim::SGD opt(m.parameters(), {.lr = 0.01, .momentum = 0.9});
  Tensor x = randn({64, 3, 32, 32}), y = randint(0, 10, {64});
  emit("cnn_train", "step_b64", train_ms(m, opt, x, y, ce, quick ? 5 : 20), "ms/step", "kiln-cpp");
}

// torch_reference.py's GPT block: pre-LayerNorm, causal attention written out (no fused
// kernel), GELU MLP x4. x: (B, T, C) -> (B, T, C).
class Block : public nn::Module {
 public:
  Block(int64_t d, int64_t h) : nn::Module("Block"), h_(h) {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{d}));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{d}));
    qkv = register_module("qkv", std::make_shared<nn::Linear>(d, 3 * d));
    proj = register_module("proj", std::make_shared<nn::Linear>(d, d));
    fc = register_module("fc", std::make_shared<nn::Linear>(d, 4 * d));
    out = register_module("out", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override {
    int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    std::vector<Tensor> qkv_ = call("qkv", *qkv, ln1->forward(x)).split(C, 2);
    for (Tensor& t : qkv_) t = t.view({B, T, h_, C / h_}).transpose(1, 2);
    Tensor att = matmul(qkv_[0], qkv_[1].transpose(-2, -1)) / std::sqrt(double(C / h_));
    Tensor mask = eq(ones({T, T}).tril(), zeros({}));
    if (tp) mask = dist::distribute_tensor(mask, tp_mesh, {dist::Replicate()});
    att = softmax(att.masked_fill(mask, -INFINITY), -1);
    Tensor y = matmul(att, qkv_[2]).transpose(1, 2).reshape({B, T, C});
    Tensor x1 = x + call("proj", *proj, y);
    return x1 + call("out", *out, gelu(call("fc", *fc, ln2->forward(x1))));
  }
  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::Linear> qkv, proj, fc, out;
  // Tensor parallel (sharded_rank): the Linears are called through the plan, under `prefix`.
  const dist::TensorParallel* tp = nullptr;
  std::string prefix;
  dist::DeviceMesh tp_mesh;

 private:
  Tensor call(const char* name, nn::Linear& m, const Tensor& t) {
    return tp ? tp->forward(prefix + name, t) : m.forward(t);
  }
  int64_t h_;
};

class GPT : public nn::Module {
 public:
  GPT(int64_t vocab = 256, int64_t block = 128, int64_t layers = 4, int64_t heads = 4,
      int64_t d = 256)
      : nn::Module("GPT") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(vocab, d));
    pos = register_module("pos", std::make_shared<nn::Embedding>(block, d));
    blocks = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int64_t i = 0; i < layers; ++i) blocks->push_back(std::make_shared<Block>(d, heads));
    ln = register_module("ln", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{d}));
    head = register_module("head", std::make_shared<nn::Linear>(d, vocab, false));
  }
  // idx: (B, T) int64 -> logits (B, T, vocab).
  Tensor forward(const Tensor& idx) override {
    Tensor x = tok->forward(idx) + pos->forward(arange(0, idx.size(1), 1, kInt64));
    return head->forward(ln->forward(blocks->forward(x)));
  }
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::Sequential> blocks;
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> head;
};

// Byte vocab 256, context 128, 4 layers, 4 heads, width 256, AdamW(3e-4), batch 16.
void w_gpt(bool quick) {
  manual_seed(0);
  GPT m;
  optim::AdamW opt(m.parameters(), {.lr = 3e-4});
  const int64_t B = 16, T = 128;
  Tensor x = randint(0, 256, {B, T}), y = randint(0, 256, {B, T});
  double ms = train_ms(m, opt, x, y, gpt_loss, quick ? 3 : 10);
  emit("gpt_train", "step_b16_t128", ms, "ms/step", "kiln-cpp");
  emit("gpt_train", "tokens_per_s", B * T / ms * 1e3, "tokens/s", "kiln-cpp");
}

// ---- distributed: ranks are this program re-executed (never forked after UCX starts)
// ---------------

// One rank of "distributed" (KILN_BENCH_RANK=distributed): as torch_reference.py's _dist_worker,
// the best of 5 (3 quick) timings of a 2^24-float sum all_reduce, each after a barrier; then DDP
// training of the MLP, AdamW(1e-3), batch 256 per rank, one thread per rank (OMP_NUM_THREADS=1).
int distributed_rank(bool quick) {
  auto pg = dist::init_process_group();
  const int64_t n = int64_t{1} << 24;
  Tensor x = ones({n});
  pg->all_reduce(x)->wait();
  double best = 1e30;
  for (int i = 0; i < (quick ? 3 : 5); ++i) {
    pg->barrier()->wait();
    auto t0 = std::chrono::steady_clock::now();
    pg->all_reduce(x)->wait();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  if (pg->rank() == 0)
    emit("allreduce", "ucx_2ranks_64MiB_algbw", 4.0 * n / best / 1e9, "GB/s", "kiln-cpp");
  manual_seed(0);
  auto ddp = std::make_shared<dist::DistributedDataParallel>(mlp());
  optim::AdamW opt(ddp->parameters(), {.lr = 1e-3});
  Tensor bx = randn({256, 784}), by = randint(0, 10, {256});
  double ms = train_ms(*ddp, opt, bx, by, ce, quick ? 5 : 20);
  if (pg->rank() == 0) emit("ddp_train", "mlp_step_2ranks_b256", ms, "ms/step", "kiln-cpp");
  ddp.reset();
  dist::destroy_process_group();
  return 0;
}

// Makes `gpt` tensor parallel over the 1-d `mesh`: every block's qkv and fc Colwise, proj and out
// Rowwise, its Linears called through the returned plan.
std::shared_ptr<dist::TensorParallel> tensor_parallel(GPT& gpt, const dist::DeviceMesh& mesh) {
  dist::ParallelizePlan plan;
  for (const auto& [name, block] : gpt.blocks->named_children()) {
    const std::string b = "blocks." + name + ".";
    plan.push_back({b + "qkv", dist::ColwiseParallel(std::nullopt, std::nullopt, false)});
    plan.push_back({b + "proj", dist::RowwiseParallel()});
    plan.push_back({b + "fc", dist::ColwiseParallel()});
    plan.push_back({b + "out", dist::RowwiseParallel()});
  }
  auto par = std::make_shared<dist::TensorParallel>(dist::parallelize_module(gpt, mesh, plan));
  for (const auto& [name, block] : gpt.blocks->named_children()) {
    auto& blk = static_cast<Block&>(*block);
    blk.tp = par.get();
    blk.prefix = "blocks." + name + ".";
    blk.tp_mesh = mesh;
  }
  return par;
}

// One rank of "sharded" (KILN_BENCH_RANK=sharded), as torch_reference.py's _sharded_worker: the
// per-op time of `a + b` on two DTensors sharded on dim 0 of a 1-d mesh (4 float32 per rank),
// after 20 warm-up calls: sharding propagation (cached after the first call) and dispatch; then
// FSDP training of gpt_train's GPT, each block and then the whole model fully_shard-ed (the
// defaults, reshard_after_forward on), AdamW(3e-4), batch 8 per rank, one thread per rank.
int sharded_rank(bool quick) {
  dist::DeviceMesh mesh = dist::init_device_mesh("cpu", {2});
  Tensor a = dist::distribute_tensor(ones({2, 4}), mesh, {dist::Shard(0)});
  Tensor b = dist::distribute_tensor(ones({2, 4}), mesh, {dist::Shard(0)});
  const int n = quick ? 200 : 2000;
  for (int i = 0; i < 20; ++i) (void)(a + b);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) (void)(a + b);
  const double us =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n * 1e6;
  if (mesh.group(0)->rank() == 0) emit("dtensor", "add_sharded_2ranks", us, "us/op", "kiln-cpp");
  manual_seed(0);
  auto gpt = std::make_shared<GPT>();
  for (const auto& [name, block] : gpt->blocks->named_children())
    gpt->blocks->replace_module(name, dist::fully_shard(block, mesh));
  auto model = dist::fully_shard(gpt, mesh);
  optim::AdamW opt(model->parameters(), {.lr = 3e-4});
  const int64_t B = 8, T = 128;
  Tensor x = randint(0, 256, {B, T}), y = randint(0, 256, {B, T});
  dist::fsdp_gather_stats(/*reset=*/true);
  const double ms = train_ms(*model, opt, x, y, gpt_loss, quick ? 2 : 5);
  const dist::FSDPGatherStats gs = dist::fsdp_gather_stats();
  if (mesh.group(0)->rank() == 0) {
    emit("fsdp_train", "gpt_step_2ranks_b8", ms, "ms/step", "kiln-cpp");
    // See Note [FSDP prefetch]. The share of all-gather time (issue to completion) that rank 0's
    // compute thread did not spend waiting.
    emit("fsdp_train", "allgather_hidden_fraction", gs.hidden_fraction(), "fraction", "kiln-cpp");
  }
  // Tensor parallel (no PyTorch row): each rank the whole batch of 16 (the work of gpt_train's
  // step, split by columns, not by rows).
  manual_seed(0);
  auto tpgpt = std::make_shared<GPT>();
  const auto par = tensor_parallel(*tpgpt, mesh);
  optim::AdamW tp_opt(tpgpt->parameters(), {.lr = 3e-4});
  Tensor tx = randint(0, 256, {2 * B, T}), ty = randint(0, 256, {2 * B, T});
  const double tp_ms = train_ms(*tpgpt, tp_opt, tx, ty, gpt_loss, quick ? 2 : 5);
  if (mesh.group(0)->rank() == 0)
    emit("tp_train", "gpt_step_2ranks_b16", tp_ms, "ms/step", "kiln-cpp");
  dist::destroy_process_group();
  return 0;
}

// One of the 4 ranks of "sharded2d" (no PyTorch row): gpt_train's GPT on a 2x2 ("dp", "tp") mesh,
// tensor parallel over "tp" as in tp_train, then each block and the whole model fully_shard-ed
// over "dp" (Note [FSDP over TP]); each "dp" pair takes 8 rows of the batch of 16, so one step
// does gpt_train's work. On a machine with fewer than 4 cores the ranks share cores.
int sharded2d_rank(bool quick) {
  dist::DeviceMesh mesh = dist::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  manual_seed(0);
  auto gpt = std::make_shared<GPT>();
  const auto par = tensor_parallel(*gpt, mesh["tp"]);
  const dist::DeviceMesh dp = mesh["dp"];
  for (const auto& [name, block] : gpt->blocks->named_children())
    gpt->blocks->replace_module(name, dist::fully_shard(block, dp));
  auto model = dist::fully_shard(gpt, dp);
  optim::AdamW opt(model->parameters(), {.lr = 3e-4});
  const int64_t B = 8, T = 128;
  Tensor x = randint(0, 256, {B, T}), y = randint(0, 256, {B, T});
  const double ms = train_ms(*model, opt, x, y, gpt_loss, quick ? 2 : 5);
  if (mesh.coordinate() == std::vector<int64_t>{0, 0})
    emit("fsdp_tp_train", "gpt_step_4ranks_2x2_b16", ms, "ms/step", "kiln-cpp");
  dist::destroy_process_group();
  return 0;
}

// A spawned rank inherits this thread's CPU affinity, and with OMP_PROC_BIND set (scripts/bench
// sets it) OpenMP has bound this thread to a single core, which would put both ranks, and their
// comm threads, on that core. The ranks are spawned with every CPU allowed, each rank's OpenMP
// thread on its own core (OMP_PLACES).
// `mode` is what the `world` ranks run: "distributed" (distributed_rank), "sharded"
// (sharded_rank) or "sharded2d" (sharded2d_rank).
void spawn_ranks(const std::string& mode, bool quick, int world = 2) {
  dist::TCPStore store("127.0.0.1", 0, /*is_server=*/true);
  const int ncpu = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  cpu_set_t bound, all;
  sched_getaffinity(0, sizeof bound, &bound);
  CPU_ZERO(&all);
  for (int c = 0; c < ncpu && c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  sched_setaffinity(0, sizeof all, &all);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env = {"RANK=" + std::to_string(r),
                                    "LOCAL_RANK=" + std::to_string(r),
                                    "WORLD_SIZE=" + std::to_string(world),
                                    "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                    "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(store.port()),
                                    "KILN_AGENT_STORE=1",
                                    "OMP_NUM_THREADS=1",
                                    "KILN_BENCH_RANK=" + mode};
    env.push_back("OMP_PLACES={" + std::to_string(r % ncpu) + "}");
    for (char** e = environ; *e; ++e) env.push_back(*e);
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", q = quick ? "--quick" : "";
    char* argv[] = {exe.data(), quick ? q.data() : nullptr, nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) == 0)
      pids.push_back(pid);
  }
  sched_setaffinity(0, sizeof bound, &bound);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  std::set<std::string> only;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--only" && i + 1 < argc) {
      std::stringstream ss(argv[++i]);
      for (std::string name; std::getline(ss, name, ',');) only.insert(name);
    } else {
      std::fprintf(stderr, "usage: kiln_bench [--only NAMES] [--quick]\n");
      return 2;
    }
  }
  if (const char* env = std::getenv("KILN_BENCH_RANK")) {
    const std::string mode = env;
    if (mode == "sharded") return sharded_rank(quick);
    if (mode == "sharded2d") return sharded2d_rank(quick);
    return distributed_rank(quick);
  }
  auto want = [&](const char* name) { return only.empty() || only.count(name); };
  if (want("dispatch")) w_dispatch(quick);
  if (want("gemm")) w_gemm(quick);
  if (want("elementwise")) w_elementwise(quick);
  if (want("reduction")) w_reduction(quick);
  if (want("autograd")) w_autograd(quick);
  if (want("kernels")) w_norm_loss(quick);
  if (want("kernels")) w_kernels_conv(quick);
  if (want("kernels")) w_attention(quick);
  if (want("mlp")) w_mlp(quick);
  if (want("cnn")) w_cnn(quick);
  if (want("gpt")) w_gpt(quick);
  if (want("quantized")) w_quantized(quick);
  if (want("distributed")) spawn_ranks("distributed", quick);
  if (want("sharded")) spawn_ranks("sharded", quick);
  if (want("sharded")) spawn_ranks("sharded2d", quick, 4);
  return 0;
}
