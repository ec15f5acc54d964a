// tests/conformance/compiled_path.cpp: the Compiled path (builds with kiln_compiler). The op on
// the sample, inside kiln::compile, with the sample's tensors as the function's arguments: the
// first call captures, the second replays the program (Note [Capture] in
// kiln/compiler/compile.h), and the replay's outputs must equal eager CPU's (random ops bit for
// bit: a program rebases its counters onto the generator's state at each run). A capture the
// compiler refuses is a failure, except where the output shape depends on values (nothing to
// compare: Note [Data-dependent shapes]). A floating op is then checked again between two
// neighbours that fuse with it (fused_chain). Replay runs the CPU kernels, so the path checks the
// CPU claims.
#include "conformance/path.h"
#include "kiln/compiler/compile.h"

namespace kiln::conformance {
namespace {

class CompiledPath : public Path {
 public:
  std::string name() const override { return "Compiled"; }
  testing::Backend claims() const override { return testing::Backend::CPU; }
  DispatchKey key() const override { return DispatchKey::CPU; }
  std::string unavailable() const override { return ""; }

  Outcome run(const Case& c) const override {
    const OpInfo& info = c.op().info();
    std::vector<Slot> slots;
    for (int i = 0; i < static_cast<int>(c.sample.size()); ++i) {
      const IValue& v = c.sample[i];
      if (v.is_tensor() && v.to_tensor().defined()) slots.push_back({i, -1});
      if (v.is_tensor_list())
        for (int k = 0; k < static_cast<int>(v.to_tensor_list().size()); ++k)
          slots.push_back({i, k});
    }
    const Stack templ = c.sample;
    auto fn = [&](const std::vector<Tensor>& ts) {
      Stack s = templ;
      for (size_t k = 0; k < slots.size(); ++k) put(s, slots[k], ts[k]);
      c.op().call_boxed(s);
      return testing::outputs_of(s);
    };
    // A fresh copy of the sample's tensors for each call (in-place ops write them).
    auto args = [&] {
      Stack s = to_device(c.sample, kCPU, info);
      std::vector<Tensor> ts;
      for (const Slot& sl : slots) ts.push_back(get(s, sl));
      return ts;
    };
    // The sample's generators are the program's (attributes, held by identity): each call
    // starts them where eager CPU's copy started.
    std::vector<std::pair<Generator, GeneratorState>> gens;
    for (const IValue& v : templ)
      if (v.is<Generator>()) gens.emplace_back(v.get<Generator>(), v.get<Generator>().get_state());
    auto reset_generators = [&] {
      for (auto& [g, st] : gens) g.set_state(st);
      manual_seed(c.seed);
    };
    compiler::CompiledFunction f = compiler::compile(fn);
    reset_generators();
    f(args());
    if (f.num_programs() == 0) {
      const std::string why = f.explain().empty() ? "no program" : f.explain().back().reason;
      if (why.find("data-dependent output shape") != std::string::npos)
        return Outcome::nothing_to_compare("nothing to compare: " + why);
      return Outcome::failed("kiln::compile did not capture the op: " + why);
    }
    reset_generators();
    std::vector<Tensor> got = f(args()), want = testing::outputs_of(c.cpu_out);
    if (f.num_replays() != 1)
      return Outcome::failed("the second call did not replay: " +
                             (f.explain().empty() ? std::string() : f.explain().back().reason));
    if (c.row.name.rfind("empty", 0) == 0) {  // uninitialized: compared by shape and dtype
      for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        got[i] = zeros(got[i].sizes(), got[i].dtype());
        want[i] = zeros(want[i].sizes(), want[i].dtype());
      }
    }
    if (std::string bad = compare_values(got, want, c.random()); !bad.empty())
      return Outcome::failed(bad);
    return fused_chain(c, fn, args, want);
  }

 private:
  // The op between two neighbours, neg(neg(op(...))), exact in floating point: where the op has
  // a lowering (Note [Fusion] in compiler/src/codegen.cpp) the three run as one generated loop,
  // which must agree with the eager kernel within the dtype's tolerance.
  template <typename Fn, typename Args>
  static Outcome fused_chain(const Case& c, const Fn& fn, const Args& args,
                             const std::vector<Tensor>& want) {
    if (want.size() != 1 || !want[0].defined() || !is_floating(want[0].dtype()) ||
        c.op().info().is_inplace || c.op().info().is_out || c.op().info().is_view ||
        c.random() || c.row.name.rfind("empty", 0) == 0)
      return Outcome::ok();
    compiler::CompiledFunction f = compiler::compile([&](const std::vector<Tensor>& ts) {
      return std::vector<Tensor>{neg(neg(fn(ts)[0]))};
    });
    manual_seed(c.seed);
    f(args());
    manual_seed(c.seed);
    std::vector<Tensor> got = f(args());
    if (f.num_replays() != 1)
      return Outcome::failed("in a chain, the second call did not replay: " +
                             (f.explain().empty() ? std::string() : f.explain().back().reason));
    std::string bad = compare_values(got, want, c.random());
    return Outcome::failed_unless(bad.empty() ? "" : "in a fused chain: " + bad);
  }
};

}  // namespace

KILN_CONFORMANCE_PATH(CompiledPath);

}  // namespace kiln::conformance
