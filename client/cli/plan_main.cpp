// kiln-plan, run as `kiln plan`: plans FSDP x TP training of a Llama-shaped model on a mesh of
// any size in this one process (kiln/dist/plan.h; Note [Planning with a fake group]).
//
//   kiln plan --model llama3-70b --dp 128 --tp 8 [--batch 1 --seq 4096 --rank 0]
#include <cstdio>
#include <iostream>
#include <string>

#include "kiln/dist/plan.h"
#include "kiln/error.h"

namespace {

constexpr const char* kHelp = R"(usage: kiln plan [options]

Plans FSDP x TP training on a (dp, tp) mesh without running it: per-rank memory for parameters,
gradients and Adam state, and the bytes each rank sends per step, beside ZeRO-3's and Megatron's
formulas.

options:
  --model NAME   llama3-8b or llama3-70b (default llama3-70b)
  --dp N         data-parallel (FSDP) ranks (default 1)
  --tp N         tensor-parallel ranks (default 1)
  --batch N      sequences per data-parallel rank per step (default 1)
  --seq N        sequence length (default 4096)
  --rank N       the rank to report (default 0)
)";

int64_t parse_int(const std::string& flag, const std::string& v) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK(used == v.size() && !v.empty(), Value, "kiln plan: ", flag,
             " needs an integer, got '", v, "'");
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::dist::PlanOptions o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::fputs(kHelp, stdout);
        return 0;
      }
      KILN_CHECK(i + 1 < argc, Value, "kiln plan: ", a, " needs a value (see kiln plan --help)");
      const std::string v = argv[++i];
      if (a == "--model") {
        o.model = kiln::dist::LlamaShape::by_name(v);
      } else if (a == "--dp") {
        o.dp = parse_int(a, v);
      } else if (a == "--tp") {
        o.tp = parse_int(a, v);
      } else if (a == "--batch") {
        o.batch = parse_int(a, v);
      } else if (a == "--seq") {
        o.seq = parse_int(a, v);
      } else if (a == "--rank") {
        o.rank = parse_int(a, v);
      } else {
        KILN_FAIL(Value, "kiln plan: unknown option '", a, "' (see kiln plan --help)");
      }
    }
    const std::string plan = kiln::dist::plan_fsdp_tp(o).str();  // checks the options first
    std::cout << o.model.name << " on dp " << o.dp << " x tp " << o.tp << ", rank " << o.rank
              << ", batch " << o.batch << " x seq " << o.seq << "\n"
              << plan;
    return 0;
  } catch (const kiln::Error& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
