// kiln/dist/plan.h: plans FSDP x TP training of a Llama-shaped model on a mesh of any size, in
// one process, in about a second: no rank runs and no tensor holds data.
//
//   kiln::dist::PlanOptions o;
//   o.model = kiln::dist::LlamaShape::llama3_70b();
//   o.dp = 128; o.tp = 8;                       // 1,024 ranks
//   kiln::dist::PlanReport r = kiln::dist::plan_fsdp_tp(o);
//   std::cout << r.str();                       // per-rank memory and traffic, beside ZeRO-3's
//
// `kiln plan --model llama3-70b --dp 128 --tp 8` prints the same (client/cli/plan_main.cpp).
//
// Note [Planning with a fake group]: the planner makes a fake process group (Note [Fake process
// group] in comm/process_group.cpp) of dp * tp ranks with this process as `rank`, and lays a
// (dp, tp) DeviceMesh over it. Every parameter gets the placements FSDP2 x TP gives it: Shard(0)
// along dp, and along tp Megatron's plan (wq, wk, wv, w1, w3 and the output layer column-wise,
// Shard(0); wo and w2 row-wise, Shard(1); the embedding row-wise by vocabulary, Shard(0); the
// norms replicated). Its local shape comes from local_shape(), uneven shards included. Memory is
// FSDP2's sharded state with a bf16 compute policy and Adam: float32 parameters, float32
// gradients and two float32 moments per local element. Traffic comes from issuing one step's
// collectives on meta tensors through the fake group, which counts the bytes each sends:
//  - FSDP: per unit (the embedding, each layer, the final norm with the output layer) an
//    all-gather of its bf16 shards before the forward and again before the backward, and a
//    reduce-scatter of its float32 gradients;
//  - TP: per layer an all-reduce of the (batch, seq, dim) bf16 activations after wo and after w2
//    in the forward, and of the input gradients of wq/wk/wv and w1/w3 in the backward; one more
//    for the embedding's Partial output, and one for the output layer's input gradient; the
//    vocabulary-parallel loss all-reduces three (batch, seq) float32 tensors.
// It models the collectives of that schedule, not a run of the modules; activation memory is
// not modelled. The report puts beside them ZeRO-3's formulas: 16 Psi / N bytes of state (Psi
// parameters over N ranks) and (2 + 2 + 4) Psi / tp * (dp - 1) / dp bytes of FSDP traffic, and
// Megatron's 4 L all-reduces of 2 b s h bytes for TP.
#pragma once

#include <map>
#include <string>

#include "kiln/dist/process_group.h"

namespace kiln::dist {

struct LlamaShape {
  std::string name;
  int64_t vocab = 0, dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0;
  static LlamaShape llama3_8b();
  static LlamaShape llama3_70b();
  // "llama3-8b" or "llama3-70b" (ValueError naming the known ones otherwise).
  static LlamaShape by_name(std::string_view name);
  int64_t num_parameters() const;
};

struct PlanOptions {
  LlamaShape model = LlamaShape::llama3_70b();
  int64_t dp = 1, tp = 1;
  int64_t rank = 0;               // which rank's shards to report
  int64_t batch = 1, seq = 4096;  // sequences per data-parallel rank per step, and their length
};

struct PlanReport {
  int64_t world = 0, psi = 0;
  int64_t param_bytes = 0, grad_bytes = 0, optim_bytes = 0;  // this rank's sharded state
  int64_t largest_unit_bytes = 0;        // the largest FSDP unit gathered in bf16 (transient)
  int64_t fsdp_bytes = 0, tp_bytes = 0;  // sent by this rank per step
  std::map<std::string, CommStats, std::less<>> fsdp_comm, tp_comm;
  double zero3_state_bytes = 0, zero3_comm_bytes = 0, megatron_tp_bytes = 0;
  double seconds = 0;  // how long planning took

  int64_t state_bytes() const { return param_bytes + grad_bytes + optim_bytes; }
  std::string str() const;  // the table `kiln plan` prints
};

// ValueError for a bad shape, mesh or rank, and when a process group exists already (the
// planner makes, and destroys, its own fake one).
PlanReport plan_fsdp_tp(const PlanOptions& options);

}  // namespace kiln::dist
