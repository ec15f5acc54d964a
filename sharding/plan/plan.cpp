// The FSDP x TP planner (kiln/dist/plan.h; Note [Planning with a fake group]).
#include "kiln/dist/plan.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"

namespace kiln::dist {

LlamaShape LlamaShape::llama3_8b() { return {"llama3-8b", 128256, 4096, 32, 32, 8, 14336}; }
LlamaShape LlamaShape::llama3_70b() { return {"llama3-70b", 128256, 8192, 80, 64, 8, 28672}; }

LlamaShape LlamaShape::by_name(std::string_view name) {
  for (const LlamaShape& s : {llama3_8b(), llama3_70b()})
    if (s.name == name) return s;
  KILN_FAIL(Value, "unknown model '", name, "' (known: llama3-8b, llama3-70b)");
}

namespace {

struct Param {
  DimVector shape;
  Placement tp;  // along the tp mesh dim (See Note [Planning with a fake group])
};

// The FSDP units: the embedding, each layer, the final norm with the output layer.
std::vector<std::vector<Param>> units(const LlamaShape& m) {
  const int64_t hd = m.dim / m.heads;
  std::vector<std::vector<Param>> u;
  u.push_back({{{m.vocab, m.dim}, Shard(0)}});
  for (int64_t l = 0; l < m.layers; ++l)
    u.push_back({{{m.dim}, Replicate()},
                 {{m.heads * hd, m.dim}, Shard(0)},
                 {{m.kv_heads * hd, m.dim}, Shard(0)},
                 {{m.kv_heads * hd, m.dim}, Shard(0)},
                 {{m.dim, m.heads * hd}, Shard(1)},
                 {{m.dim}, Replicate()},
                 {{m.ffn, m.dim}, Shard(0)},
                 {{m.ffn, m.dim}, Shard(0)},
                 {{m.dim, m.ffn}, Shard(1)}});
  u.push_back({{{m.dim}, Replicate()}, {{m.vocab, m.dim}, Shard(0)}});
  return u;
}

void check_shape(const LlamaShape& m) {
  KILN_CHECK(m.vocab > 0 && m.dim > 0 && m.layers > 0 && m.heads > 0 && m.kv_heads > 0 &&
                 m.ffn > 0 && m.dim % m.heads == 0 && m.heads % m.kv_heads == 0,
             Value, "plan: bad model shape '", m.name, "' (vocab ", m.vocab, ", dim ", m.dim,
             ", layers ", m.layers, ", heads ", m.heads, ", kv_heads ", m.kv_heads, ", ffn ", m.ffn,
             ")");
}

Tensor meta(int64_t numel, ScalarType dtype) { return empty_on({numel}, dtype, kMeta); }

// The difference of two snapshots of the fake group's counts.
std::map<std::string, CommStats, std::less<>> since(
    const std::map<std::string, CommStats, std::less<>>& before) {
  auto now = fake_comm_stats();
  for (auto& [op, c] : now) {
    auto it = before.find(op);
    if (it == before.end()) continue;
    c.calls -= it->second.calls;
    c.bytes -= it->second.bytes;
  }
  std::erase_if(now, [](const auto& e) { return e.second.calls == 0; });
  return now;
}

int64_t total(const std::map<std::string, CommStats, std::less<>>& c) {
  int64_t b = 0;
  for (const auto& [op, s] : c) b += s.bytes;
  return b;
}

}  // namespace

int64_t LlamaShape::num_parameters() const {
  int64_t n = 0;
  for (const auto& unit : units(*this))
    for (const Param& p : unit) n += numel_of(IntArrayRef(p.shape));
  return n;
}

PlanReport plan_fsdp_tp(const PlanOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  check_shape(o.model);
  KILN_CHECK(o.dp >= 1 && o.tp >= 1 && o.dp <= (1 << 20) / o.tp, Value,
             "plan: dp and tp must be >= 1 with dp * tp <= 2^20, got dp ", o.dp, ", tp ", o.tp);
  KILN_CHECK(o.rank >= 0 && o.rank < o.dp * o.tp, Value, "plan: rank ", o.rank,
             " is not in a world of ", o.dp * o.tp);
  KILN_CHECK(o.batch >= 1 && o.seq >= 1, Value, "plan: batch and seq must be >= 1, got ", o.batch,
             " and ", o.seq);
  KILN_CHECK(!is_initialized(), Value,
             "plan: a process group exists already; the planner makes its own fake one");
  InitOptions io;
  io.backend = "fake";
  io.init_method = "";
  io.rank = static_cast<int>(o.rank);
  io.world_size = static_cast<int>(o.dp * o.tp);
  init_process_group(io);
  struct Destroy {
    ~Destroy() { destroy_process_group(); }
  } destroy;
  reset_fake_comm_stats();
  const DeviceMesh mesh = init_device_mesh("cpu", {o.dp, o.tp}, {"dp", "tp"});
  ProcessGroupPtr dp = mesh.group("dp"), tp = mesh.group("tp");
  const LlamaShape& m = o.model;

  PlanReport r;
  r.world = o.dp * o.tp;
  r.psi = m.num_parameters();
  const auto all_units = units(m);
  std::vector<int64_t> local(all_units.size());  // elements of each unit's shards here
  for (size_t u = 0; u < all_units.size(); ++u) {
    int64_t n = 0, full = 0;
    for (const Param& p : all_units[u]) {
      n += numel_of(IntArrayRef(local_shape(IntArrayRef(p.shape), mesh, {Shard(0), p.tp})));
      full += numel_of(IntArrayRef(local_shape(IntArrayRef(p.shape), mesh, {Replicate(), p.tp})));
    }
    local[u] = n;
    r.largest_unit_bytes = std::max(r.largest_unit_bytes, 2 * full);
  }
  for (int64_t n : local) {
    r.param_bytes += 4 * n;
    r.grad_bytes += 4 * n;
    r.optim_bytes += 8 * n;
  }

  // One step's collectives (See Note [Planning with a fake group]). A unit's flat buffer holds
  // this rank's shards (FSDP2 pads uneven ones to the largest: less than a row per parameter).
  auto gather = [&](size_t u) {
    Tensor in = meta(local[u], kBFloat16), out = meta(local[u] * o.dp, kBFloat16);
    dp->all_gather_into_tensor(out, in)->wait();
  };
  auto reduce_scatter = [&](size_t u) {
    Tensor out = meta(local[u], kFloat32), in = meta(local[u] * o.dp, kFloat32);
    dp->reduce_scatter_tensor(out, in, ReduceOp::Avg)->wait();
  };
  Tensor act = meta(o.batch * o.seq * m.dim, kBFloat16);
  auto tp_all_reduce = [&](Tensor t) { tp->all_reduce(t)->wait(); };
  const auto fsdp0 = fake_comm_stats();
  for (size_t u = 0; u < all_units.size(); ++u) gather(u);  // forward
  for (size_t u = all_units.size(); u-- > 0;) gather(u);    // backward
  for (size_t u = all_units.size(); u-- > 0;) reduce_scatter(u);
  r.fsdp_comm = since(fsdp0);
  const auto tp0 = fake_comm_stats();
  tp_all_reduce(act);  // the embedding's Partial output
  for (int64_t l = 0; l < m.layers; ++l) {
    tp_all_reduce(act);  // after wo
    tp_all_reduce(act);  // after w2
  }
  for (int i = 0; i < 3; ++i) tp_all_reduce(meta(o.batch * o.seq, kFloat32));  // the loss
  tp_all_reduce(act);  // the output layer's input gradient
  for (int64_t l = 0; l < m.layers; ++l) {
    tp_all_reduce(act);  // into w1/w3
    tp_all_reduce(act);  // into wq/wk/wv
  }
  r.tp_comm = since(tp0);
  r.fsdp_bytes = total(r.fsdp_comm);
  r.tp_bytes = total(r.tp_comm);

  const double psi = static_cast<double>(r.psi), n = static_cast<double>(r.world);
  const double dpf = static_cast<double>(o.dp), tpf = static_cast<double>(o.tp);
  r.zero3_state_bytes = 16 * psi / n;
  r.zero3_comm_bytes = 8 * psi / tpf * (dpf - 1) / dpf;
  r.megatron_tp_bytes = 4.0 * static_cast<double>(m.layers) * 2 * (tpf - 1) / tpf * 2 *
                        static_cast<double>(o.batch * o.seq * m.dim);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string PlanReport::str() const {
  auto gib = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%10.3f GiB", b / (1024.0 * 1024 * 1024));
    return std::string(buf);
  };
  auto ratio = [](double a, double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%7.3f", b > 0 ? a / b : (a == 0 ? 1.0 : 0.0));
    return std::string(buf);
  };
  std::ostringstream os;
  os << "parameters (Psi): " << psi << ", ranks (N): " << world << "\n\n"
     << "per rank                         planned        formula   planned/formula\n"
     << "  parameters (fp32 shards)  " << gib(param_bytes) << "\n"
     << "  gradients (fp32 shards)   " << gib(grad_bytes) << "\n"
     << "  Adam moments (fp32)       " << gib(optim_bytes) << "\n"
     << "  state total               " << gib(state_bytes()) << "  " << gib(zero3_state_bytes)
     << "  " << ratio(state_bytes(), zero3_state_bytes) << "   (ZeRO-3: 16 Psi / N)\n"
     << "  largest unit gathered     " << gib(largest_unit_bytes) << "   (bf16, transient)\n"
     << "sent per step\n"
     << "  FSDP (dp group)           " << gib(fsdp_bytes) << "  " << gib(zero3_comm_bytes) << "  "
     << ratio(fsdp_bytes, zero3_comm_bytes) << "   (ZeRO-3: 8 Psi / tp (dp-1)/dp)\n"
     << "  TP (tp group)             " << gib(tp_bytes) << "  " << gib(megatron_tp_bytes) << "  "
     << ratio(tp_bytes, megatron_tp_bytes) << "   (Megatron: 4 L x 2 b s h bf16 all-reduces)\n";
  for (const auto* c : {&fsdp_comm, &tp_comm})
    for (const auto& [op, s] : *c)
      os << "    " << (c == &fsdp_comm ? "dp " : "tp ") << op << ": " << s.calls << " calls, "
         << gib(static_cast<double>(s.bytes)) << "\n";
  char buf[64];
  std::snprintf(buf, sizeof buf, "planned in %.2f s\n", seconds);
  os << buf;
  return os.str();
}

}  // namespace kiln::dist
