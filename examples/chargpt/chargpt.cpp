// Trains the byte-level GPT of gpt.h on real English text, the plain fortune files of Debian's
// `fortunes` package, then samples from it. Run it with scripts/chargpt, or by hand:
//   build/bin/chargpt [--data DIR] [--steps N] [--eval-every K] [--ckpt DIR [--resume]]
//                     [--prompt TEXT] [--temperature T] [--top-k K] [--sample-bytes N] [--seed S]
//                     [--fsdp N [--bf16]] [--tp M] [--print-losses] [--remote COORDINATOR]
//   build/bin/kiln run --nproc 4 build/bin/chargpt --fsdp 4
//   build/bin/chargpt --fsdp 2 --tp 2 --remote COORDINATOR   # or: kiln submit --workers 4 -- ...
// --fsdp N trains on N ranks (`kiln run --nproc N`), every block and then the whole model
// fully_shard-ed, each rank taking kBatch / N rows of each batch; --tp M shards every block's
// attention and MLP over M ranks (qkv and fc column-wise, proj and out row-wise), every rank
// taking the whole batch. Either trains the same model on the same batches as one process does,
// so the losses match it to float rounding (--print-losses prints every step's loss in full).
// Both together (`kiln run --nproc 4 build/bin/chargpt --fsdp 2 --tp 2`) train 2-D: tensor
// parallel inside each pair of ranks, FSDP across the pairs. --bf16 (with --fsdp) is FSDP's mixed
// precision: parameters gathered and computed in bfloat16, gradients reduced in float32, float32
// shards and optimizer; its losses follow the float32 run to about 1e-3. As examples/chargpt.py
// does, rank 0 prints. With --remote (or as the driver of `kiln submit --workers N`) this one
// process records the program for a gang of fsdp x tp workers, which run it on their shards (Note
// [Remote DTensor] in kiln/dist/remote.h), with the same losses.
// The files of DIR (default /usr/share/games/fortunes; *.dat and *.u8 skipped) are concatenated
// as bytes in sorted order; the first 90% train, the rest validate. Each step draws 16 random
// windows of 128 bytes (seeded). Every K steps it prints the mean training loss since the last
// line, the validation loss (the same 16 validation batches every time) and the step time, and
// with --ckpt saves a training checkpoint (model, optimizer, scheduler, RNG and batch-sampler
// state); --resume continues from it. A run of the default 400 steps or more exits with status 1
// if the final validation loss is not below 2.5 nats per byte.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gpt.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/client/session.h"
#include "kiln/dist/device_mesh.h"
#include "kiln/dist/fsdp.h"
#include "kiln/dist/tensor_parallel.h"
#include "kiln/nn/checkpoint.h"

using namespace kiln;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string data = "/usr/share/games/fortunes";
  int64_t steps = 400;  // ~4 min at the ~0.6 s/step of a lightly loaded 2-core machine; val 2.29
  int64_t eval_every = 100;
  std::string ckpt;
  bool resume = false;
  std::string prompt = "The meaning of life is";
  double temperature = 0.8;
  int64_t top_k = 40;
  int64_t sample_bytes = 300;
  uint64_t seed = 1337;
  int64_t fsdp = 1;   // FSDP ranks (under kiln run)
  int64_t tp = 1;     // tensor-parallel ranks (under kiln run)
  bool bf16 = false;  // with --fsdp: compute in bfloat16, reduce gradients in float32
  bool print_losses = false;
  std::string remote;  // a coordinator: train on a gang of fsdp x tp of its workers
};

constexpr int64_t kBatch = 16;
constexpr int64_t kEvalBatches = 16;
constexpr double kLr = 1e-3, kMinLr = 1e-4, kWeightDecay = 0.1;
constexpr int64_t kWarmup = 50;

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "chargpt: %s\n", msg.c_str());
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      return argv[++i];
    };
    // A whole-string number, else exit 2 naming the flag (not std::stoll's uncaught exception).
    auto number = [&](auto parse) {
      std::string v = value();
      size_t used = 0;
      try {
        auto n = parse(v, &used);
        if (used == v.size()) return n;
      } catch (const std::exception&) {
      }
      usage_error(flag + " expects a number, got '" + v + "'");
    };
    auto integer = [&] {
      return number([](const std::string& v, size_t* used) { return std::stoll(v, used); });
    };
    if (flag == "--data")
      a.data = value();
    else if (flag == "--steps")
      a.steps = integer();
    else if (flag == "--eval-every")
      a.eval_every = integer();
    else if (flag == "--ckpt")
      a.ckpt = value();
    else if (flag == "--resume")
      a.resume = true;
    else if (flag == "--prompt")
      a.prompt = value();
    else if (flag == "--temperature")
      a.temperature = number([](const std::string& v, size_t* used) { return std::stod(v, used); });
    else if (flag == "--top-k")
      a.top_k = integer();
    else if (flag == "--sample-bytes")
      a.sample_bytes = integer();
    else if (flag == "--seed")
      a.seed = number([](const std::string& v, size_t* used) { return std::stoull(v, used); });
    else if (flag == "--fsdp")
      a.fsdp = integer();
    else if (flag == "--tp")
      a.tp = integer();
    else if (flag == "--bf16")
      a.bf16 = true;
    else if (flag == "--print-losses")
      a.print_losses = true;
    else if (flag == "--remote")
      a.remote = value();
    else
      usage_error("unknown argument " + flag + " (see the top of examples/chargpt/chargpt.cpp)");
  }
  // The checks and messages of examples/chargpt.py's parse_args.
  if (a.fsdp < 1 || a.tp < 1) usage_error("--fsdp and --tp must be >= 1");
  if (a.bf16 && a.fsdp == 1)
    usage_error("--bf16 is FSDP's mixed precision: it needs --fsdp N with N > 1");
  if (kBatch % a.fsdp != 0)
    usage_error("--fsdp " + std::to_string(a.fsdp) + " must divide the batch of " +
                std::to_string(kBatch));
  const char* world_env = std::getenv("WORLD_SIZE");
  const int64_t world = world_env ? std::atoll(world_env) : 1, ranks = a.fsdp * a.tp;
  const bool remote = !a.remote.empty() || std::getenv("KILN_JOB_ID");
  if (remote && world > 1)
    usage_error("--remote (or kiln submit) drives a gang from one process: not under kiln run");
  if (!remote && ranks > 1 && world != ranks)
    usage_error("--fsdp " + std::to_string(a.fsdp) + " --tp " + std::to_string(a.tp) + " needs " +
                std::to_string(ranks) + " ranks: run it as `kiln run --nproc " +
                std::to_string(ranks) + " ...` (WORLD_SIZE is " + std::to_string(world) + ")");
  if ((ranks > 1 || remote) && !a.ckpt.empty())
    usage_error("--ckpt with --fsdp, --tp or --remote (sharded checkpoints) is not supported yet");
  if (a.steps < 1 || a.eval_every < 1 || a.temperature <= 0 || a.top_k < 1)
    usage_error("--steps, --eval-every and --top-k must be >= 1, --temperature > 0");
  if (a.resume && a.ckpt.empty()) usage_error("--resume needs --ckpt DIR");
  return a;
}

// Shards `gpt` over a (dp, tp) mesh of args.fsdp x args.tp ranks, as examples/chargpt.py's
// parallelize() does: tensor parallel over "tp" first, then every block and the whole model
// fully_shard-ed over "dp" (2-D FSDP x TP: See Note [FSDP over TP]). The mesh is laid over the
// ranks of `kiln run`, or over a gang's workers when `device` is its remote device. Returns the
// module that training, evaluation and sampling call (the FSDP root, or `gpt` whose blocks call
// their linears through the tensor-parallel plan) and the mesh. bf16: FSDP's mixed precision.
struct Parallel {
  nn::ModulePtr model;
  dist::DeviceMesh mesh;  // undefined: one process
};

Parallel parallelize(const std::shared_ptr<chargpt::GPT>& gpt, int64_t fsdp, int64_t tp, bool bf16,
                     Device device) {
  dist::DeviceMesh mesh = dist::init_device_mesh(
      device.type() == DeviceType::Remote ? device.str() : "cpu", {fsdp, tp}, {"dp", "tp"});
  Parallel p{gpt, mesh};
  if (tp > 1) {
    using dist::ColwiseParallel, dist::RowwiseParallel;
    // qkv's output stays a DTensor: its q, k, v split cuts across the column shards.
    auto plan = std::make_shared<dist::TensorParallel>(dist::parallelize_module(
        *gpt, mesh["tp"],
        {{"blocks.*.qkv", ColwiseParallel(std::nullopt, std::nullopt, /*use_local_output=*/false)},
         {"blocks.*.proj", RowwiseParallel()},
         {"blocks.*.fc", ColwiseParallel()},
         {"blocks.*.out", RowwiseParallel()}}));
    for (const auto& [name, child] : gpt->blocks->named_children()) {
      std::string prefix = "blocks." + name + ".";
      std::dynamic_pointer_cast<chargpt::Block>(child)->call_linear =
          [plan, prefix](std::string_view linear, const Tensor& x) {
            return plan->forward(prefix + std::string(linear), x);
          };
    }
  }
  if (fsdp > 1) {
    dist::DeviceMesh dp = mesh["dp"];
    dist::FSDPOptions options;
    if (bf16) options.mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32};
    for (const auto& [name, block] : gpt->blocks->named_children())
      gpt->blocks->replace_module(name, dist::fully_shard(block, dp, options));
    p.model = dist::fully_shard(gpt, dp, options);
  }
  return p;
}

// This rank's rows of a batch, [r * B / dp, (r + 1) * B / dp) for dp rank r (each worker keeps its
// own on a gang).
Tensor my_rows(const Tensor& t, const dist::DeviceMesh& mesh) {
  if (!mesh.defined()) return t;
  return dist::distribute_tensor(t, mesh, {dist::Shard(0), dist::Replicate()}).to_local();
}

// The mean over the dp ranks of each one's loss (the whole batch's loss).
double dp_mean(const Tensor& loss, const dist::DeviceMesh& mesh) {
  if (!mesh.defined() || mesh.size(0) == 1) return loss.item<float>();
  return dist::DTensor::from_local(loss.detach().reshape({1}), mesh["dp"],
                                   {dist::Partial(dist::ReduceOp::Avg)})
      .full_tensor()
      .item<float>();
}

// Python's repr of a float: the shortest text that reads back as the same double.
std::string float_repr(double v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
}

// The plain fortune files of `dir` (regular files, not *.dat or *.u8), concatenated in sorted
// name order. Empty when there are none.
std::string read_fortunes(const std::string& dir, int& files) {
  std::vector<fs::path> paths;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    std::string ext = e.path().extension().string();
    if (e.is_symlink() || !e.is_regular_file() || ext == ".dat" || ext == ".u8") continue;
    paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  std::string text;
  for (const fs::path& p : paths) {
    std::ifstream in(p, std::ios::binary);
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  files = static_cast<int>(paths.size());
  return text;
}

// x, y: (kBatch, block) int64; y is x shifted by one byte. Window starts come from `gen`.
std::pair<Tensor, Tensor> get_batch(const std::string& text, int64_t block, Generator& gen) {
  Tensor starts = randint(0, static_cast<int64_t>(text.size()) - block, {kBatch}, gen);
  Tensor x = empty({kBatch, block}, kInt64), y = empty({kBatch, block}, kInt64);
  const int64_t* s = starts.data_ptr<int64_t>();
  int64_t *px = x.data_ptr<int64_t>(), *py = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t t = 0; t < block; ++t) {
      px[b * block + t] = static_cast<unsigned char>(text[s[b] + t]);
      py[b * block + t] = static_cast<unsigned char>(text[s[b] + t + 1]);
    }
  return {x, y};
}

Device g_device = kCPU;  // where the model lives: a gang's remote device with --remote

Tensor lm_loss(nn::Module& model, const Tensor& x, const Tensor& y) {
  // bfloat16 under --bf16: the loss is taken in float32
  Tensor logits = model.forward(x.to(std::nullopt, g_device)).to(kFloat32);
  return cross_entropy(logits.reshape({-1, logits.size(-1)}),
                       y.to(std::nullopt, g_device).reshape({-1}));
}

// The mean loss over kEvalBatches batches of `text`, always the same ones (a fixed seed).
double evaluate(nn::Module& model, int64_t block, const std::string& text) {
  autograd::NoGradGuard no_grad;
  Generator gen(0);
  double sum = 0;
  for (int64_t i = 0; i < kEvalBatches; ++i) {
    auto [x, y] = get_batch(text, block, gen);
    sum += lm_loss(model, x, y).item<float>();
  }
  return sum / kEvalBatches;
}

// Everything a resumed run needs (Note [Atomic checkpoints] in kiln/nn/checkpoint.h).
void save(const std::string& dir, int64_t step, chargpt::GPT& model, optim::AdamW& opt,
          optim::LRScheduler& sched, Generator& batch_gen) {
  nn::Checkpoint c;
  for (const auto& [name, t] : model.state_dict()) c.groups["model"][name] = t;
  optim::StateDict osd = opt.state_dict();
  c.groups["optimizer"] = TensorMap(osd.state.begin(), osd.state.end());
  GeneratorState rng = default_generator().get_state(), data = batch_gen.get_state();
  c.metadata = json{{"step", step},
                    {"optimizer", json::parse(osd.groups_to_json())},
                    {"scheduler", sched.state_dict()},
                    {"rng", {rng.seed, rng.offset}},
                    {"batch_rng", {data.seed, data.offset}}}
                   .dump();
  nn::save_checkpoint(dir, c);
}

// Restores what save() wrote; returns the step it was taken at.
int64_t load(const std::string& dir, chargpt::GPT& model, optim::AdamW& opt,
             optim::LRScheduler& sched, Generator& batch_gen) {
  nn::Checkpoint c = nn::load_checkpoint(dir);
  nn::StateDict msd;
  for (const auto& [name, t] : c.groups.at("model")) msd.insert(name, t);
  model.load_state_dict(msd);
  json meta = json::parse(c.metadata);
  optim::StateDict osd;
  const TensorMap& ostate = c.groups.at("optimizer");
  osd.state = std::map<std::string, Tensor>(ostate.begin(), ostate.end());
  osd.param_groups = optim::StateDict::groups_from_json(meta.at("optimizer").dump());
  opt.load_state_dict(osd);
  sched.load_state_dict(meta.at("scheduler").get<std::map<std::string, double>>());
  default_generator().set_state({meta.at("rng")[0], meta.at("rng")[1]});
  batch_gen.set_state({meta.at("batch_rng")[0], meta.at("batch_rng")[1]});
  return meta.at("step").get<int64_t>();
}

// Continues `prompt` by `n` bytes, each drawn from the top_k most likely next bytes at
// `temperature`; prints the printable ones as they come.
void sample(nn::Module& model, const chargpt::GPTConfig& config, const std::string& prompt,
            int64_t n, double temperature, int64_t top_k, uint64_t seed) {
  autograd::NoGradGuard no_grad;
  model.eval();
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ctx(prompt.begin(), prompt.end());
  for (int64_t& c : ctx) c = static_cast<unsigned char>(c);
  if (ctx.empty()) ctx.push_back('\n');
  auto put = [](int64_t c) {
    if (std::isprint(static_cast<int>(c)) || c == '\n' || c == '\t')
      std::putchar(static_cast<int>(c));
  };
  std::for_each(ctx.begin(), ctx.end(), put);
  const int64_t V = config.vocab, block = config.block;
  for (int64_t i = 0; i < n; ++i) {
    int64_t T = std::min<int64_t>(ctx.size(), block);
    Tensor idx = empty({1, T}, kInt64);
    std::copy(ctx.end() - T, ctx.end(), idx.data_ptr<int64_t>());
    // logits of the last position: (1, T, V) -> (V)
    Tensor logits = model.forward(idx.to(std::nullopt, g_device))
                        .select(1, T - 1)
                        .reshape({V})
                        .to(std::nullopt, kCPU)
                        .contiguous();
    const float* l = logits.data_ptr<float>();
    std::vector<int64_t> order(V);
    for (int64_t v = 0; v < V; ++v) order[v] = v;
    int64_t k = std::min(top_k, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    std::vector<double> p(k);
    for (int64_t j = 0; j < k; ++j) p[j] = std::exp((l[order[j]] - l[order[0]]) / temperature);
    int64_t next = order[std::discrete_distribution<int64_t>(p.begin(), p.end())(rng)];
    ctx.push_back(next);
    put(next);
  }
  std::putchar('\n');
  model.train();
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse_args(argc, argv);
  if (!fs::is_directory(args.data)) {
    std::fprintf(stderr,
                 "chargpt: data directory %s not found (install the fortunes: sudo apt-get "
                 "install fortunes, or pass --data DIR)\n",
                 args.data.c_str());
    return 2;
  }
  int files = 0;
  std::string text = read_fortunes(args.data, files);
  chargpt::GPTConfig config;
  if (static_cast<int64_t>(text.size()) < 20 * (config.block + 1)) {
    std::fprintf(stderr,
                 "chargpt: only %zu bytes of text in %s (install the fortunes: sudo "
                 "apt-get install fortunes, or pass --data DIR)\n",
                 text.size(), args.data.c_str());
    return 2;
  }
  size_t n_train = text.size() * 9 / 10;
  std::string train = text.substr(0, n_train), val = text.substr(n_train);
  std::printf("chargpt: %d files, %zu bytes: %zu train / %zu validation\n", files, text.size(),
              train.size(), val.size());

  client::Session session;
  const bool remote = !args.remote.empty() || std::getenv("KILN_JOB_ID");
  if (remote) {  // a job's driver trains on the job's gang
    session = client::connect(args.remote,
                              {.workers = static_cast<int>(args.fsdp * args.tp), .wait_ms = 60000});
    g_device = session.device();
    std::printf("chargpt: recording for a gang of %d workers (%s)\n", session.world_size(),
                g_device.str().c_str());
  }
  manual_seed(args.seed);
  auto gpt = std::make_shared<chargpt::GPT>(config);
  int64_t n_params = 0;
  for (const Tensor& p : gpt->parameters()) n_params += p.numel();
  gpt->to(g_device);
  // What training, evaluation and sampling call: `gpt`, or under --fsdp its FSDP root.
  Parallel par{gpt};
  if (args.fsdp * args.tp > 1) {
    // DTensor's replicate-path warnings (attention), as examples/chargpt.py ignores them.
    set_warning_handler([](const std::string&) {});
    par = parallelize(gpt, args.fsdp, args.tp, args.bf16, g_device);
    // One rank prints.
    if (!remote && dist::default_group()->rank() != 0 && !std::freopen("/dev/null", "w", stdout))
      return 1;
  }
  nn::Module& model = *par.model;
  optim::AdamW opt(chargpt::decay_groups(model, kWeightDecay), {.lr = kLr});
  // Linear warm-up from kLr / 10, then cosine annealing down to kMinLr at the last step.
  optim::SequentialLR sched(
      opt,
      {std::make_shared<optim::LinearLR>(
           opt, optim::LinearLROptions{.start_factor = 0.1, .total_iters = kWarmup}),
       std::make_shared<optim::CosineAnnealingLR>(
           opt, optim::CosineAnnealingLROptions{.T_max = std::max<int64_t>(1, args.steps - kWarmup),
                                                .eta_min = kMinLr})},
      {kWarmup});
  Generator batch_gen(args.seed);
  int64_t step = 0;
  if (args.resume && nn::has_checkpoint(args.ckpt)) {
    step = load(args.ckpt, *gpt, opt, sched, batch_gen);
    std::printf("chargpt: resumed from %s at step %lld\n", args.ckpt.c_str(),
                static_cast<long long>(step));
  } else if (args.resume) {
    std::printf("chargpt: no checkpoint in %s yet; starting from step 0\n", args.ckpt.c_str());
  }
  std::printf(
      "chargpt: GPT %lld layers, %lld heads, width %lld, context %lld: %.2fM parameters; "
      "batch %lld, AdamW lr %g, %lld steps%s%s%s\n",
      static_cast<long long>(config.layers), static_cast<long long>(config.heads),
      static_cast<long long>(config.width), static_cast<long long>(config.block), n_params / 1e6,
      static_cast<long long>(kBatch), kLr, static_cast<long long>(args.steps),
      args.fsdp > 1 ? ("; FSDP on " + std::to_string(args.fsdp) + " ranks").c_str() : "",
      args.tp > 1 ? ("; tensor parallel on " + std::to_string(args.tp) + " ranks").c_str() : "",
      args.bf16 ? "; bfloat16 compute" : "");
  std::fflush(stdout);

  using clock = std::chrono::steady_clock;
  auto start = clock::now(), last = start;
  double loss_sum = 0;
  int64_t losses = 0;
  double val_loss = NAN;
  while (step < args.steps) {
    // Every rank draws the whole batch (the same generator stream as one process) and takes its
    // rows of it.
    auto [x, y] = get_batch(train, config.block, batch_gen);
    opt.zero_grad();
    Tensor loss = lm_loss(model, my_rows(x, par.mesh), my_rows(y, par.mesh));
    loss.backward();
    opt.step();
    sched.step();
    // This rank's rows: the batch's loss is the mean over the dp ranks.
    double value = dp_mean(loss, par.mesh);
    loss_sum += value;
    ++losses;
    ++step;
    if (args.print_losses) {
      std::printf("step %lld loss %s\n", static_cast<long long>(step), float_repr(value).c_str());
      std::fflush(stdout);
    }
    if (step % args.eval_every != 0 && step != args.steps) continue;
    double ms = std::chrono::duration<double, std::milli>(clock::now() - last).count() / losses;
    val_loss = evaluate(model, config.block, val);
    std::printf("step %lld train loss %.4f val loss %.4f (%.0f ms/step, lr %.2e)\n",
                static_cast<long long>(step), loss_sum / losses, val_loss, ms,
                sched.get_last_lr()[0]);
    std::fflush(stdout);
    if (!args.ckpt.empty()) save(args.ckpt, step, *gpt, opt, sched, batch_gen);
    loss_sum = 0;
    losses = 0;
    last = clock::now();
  }
  if (std::isnan(val_loss)) val_loss = evaluate(model, config.block, val);
  double seconds = std::chrono::duration<double>(clock::now() - start).count();
  std::printf("chargpt: validation loss %.4f after %lld steps (%.0f s; ln 256 = %.4f)\n", val_loss,
              static_cast<long long>(step), seconds, std::log(256.0));
  std::printf("--- sample (temperature %g, top-k %lld) ---\n", args.temperature,
              static_cast<long long>(args.top_k));
  sample(model, config, args.prompt, args.sample_bytes, args.temperature, args.top_k, args.seed);
  std::fflush(stdout);
  if (args.steps >= 400 && val_loss >= 2.5) {
    std::printf("chargpt: FAILED, validation loss not below 2.5\n");
    return 1;
  }
  return 0;
}
