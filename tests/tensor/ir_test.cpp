// The graph IR (kiln/ir.h): recording from meta functions, the printer, the verifier (one test
// per kind of corruption) and the interpreter replaying recorded graphs bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/ir.h"
#include "kiln/meta.h"
#include "test_util.h"

namespace kiln::ir {
namespace {

using Sizes = std::vector<int64_t>;
const IValue kNone;

TensorSpec f32(IntArrayRef sizes) { return meta::contiguous_spec(sizes, kFloat32, kCPU); }

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// x: (2, 3), b: (3,) -> add, t, rand (seed 7), slice
Graph small_graph() {
  Graph g;
  ValueRef x = g.add_input(f32({2, 3}));
  ValueRef b = g.add_input(f32({3}));
  ValueRef y = g.add_node("add", {x, b, Scalar(1)})[0];
  ValueRef z = g.add_node("t", {y})[0];
  ValueRef r = g.add_node("rand", {Sizes{3, 2}, kNone, kNone, kNone}, GeneratorState{7, 0})[0];
  ValueRef s = g.add_node("slice", {z, int64_t{0}, int64_t{1}, kNone, int64_t{1}})[0];
  g.set_outputs({z, r, s});
  return g;
}

// Problems of `g` that mention `needle`.
int count_problems(const Graph& g, const std::string& needle) {
  int n = 0;
  for (const std::string& p : verify(g)) n += p.find(needle) != std::string::npos;
  return n;
}

std::string all_problems(const Graph& g) {
  std::string s;
  for (const std::string& p : verify(g)) s += p + "\n";
  return s;
}

TEST(Ir, PrintsAStableReadableText) {
  EXPECT_EQ(small_graph().str(),
            "graph(%0 : float32[2, 3], %1 : float32[3]):\n"
            "  %2 : float32[2, 3] = add(%0, %1, alpha=1)\n"
            "  %3 : float32[3, 2] strides=[1, 3] = t(%2)\n"
            "  %4 : float32[3, 2] = rand([3, 2], generator=Philox(seed=7, offset=0), dtype=None, device=None)\n"
            "  %5 : float32[2, 2] strides=[1, 3] offset=1 = slice(%3, 0, 1, None, 1)\n"
            "  return (%3, %4, %5)\n");
}

TEST(Ir, RecordingUsesMetaFunctionsOnly) {
  Graph g = small_graph();
  ASSERT_EQ(g.nodes().size(), 4u);
  const Node& add = g.nodes()[0];
  EXPECT_EQ(add.op, Dispatcher::get().find("add"));
  EXPECT_EQ(add.inputs(), (std::vector<ValueId>{0, 1}));
  ASSERT_EQ(add.attributes().size(), 1u);
  EXPECT_EQ(add.attributes()[0].to_scalar().to_int(), 1);
  const TensorSpec& t = g.value(3).meta;
  EXPECT_EQ(t.alias_of, 0);  // t is a view of its argument 0
  EXPECT_EQ(g.value(5).meta.offset, 1);
  // Broadcasting and promotion come from the meta function.
  Graph h;
  ValueRef a = h.add_input(meta::contiguous_spec({4, 1}, kInt32, kCPU));
  ValueRef b = h.add_input(meta::contiguous_spec({3}, kFloat64, kCPU));
  const TensorSpec& c = h.value(h.add_node("add", {a, b, Scalar(2)})[0].id).meta;
  EXPECT_EQ(c.sizes.ref(), IntArrayRef({4, 3}));
  EXPECT_EQ(c.dtype, kFloat64);
}

TEST(Ir, RecordingRejectsBadNodes) {
  Graph g;
  ValueRef x = g.add_input(f32({2, 3}));
  ValueRef y = g.add_input(f32({4}));
  testing::expect_error(ErrorKind::Value, "ir: unknown op 'frobnicate'", [&] { g.add_node("frobnicate", {x}); });
  testing::expect_error(ErrorKind::Value, "expects 3 arguments", [&] { g.add_node("add", {x, x}); });
  testing::expect_error(ErrorKind::Value, "argument 'other' (Tensor) must be a value reference",
                        [&] { g.add_node("add", {x, Scalar(1), Scalar(1)}); });
  testing::expect_error(ErrorKind::Value, "argument 'alpha' (Scalar) got an attribute of type str",
                        [&] { g.add_node("add", {x, x, "one"}); });
  testing::expect_error(ErrorKind::Value, "uses unknown value %9", [&] { g.add_node("t", {ValueRef{9}}); });
  // The op's own meta function validates shapes.
  testing::expect_error(ErrorKind::Value, "not broadcastable", [&] { g.add_node("add", {x, y, Scalar(1)}); });
  testing::expect_error(ErrorKind::Value, "not a random op", [&] { g.add_node("t", {x}, GeneratorState{1, 2}); });
  testing::expect_error(ErrorKind::Value, "graph output %42", [&] { g.set_outputs({ValueRef{42}}); });
  EXPECT_TRUE(g.nodes().empty());
  EXPECT_TRUE(verify(g).empty());
}

TEST(Ir, ValidGraphPassesTheVerifier) {
  Graph g = small_graph();
  EXPECT_TRUE(verify(g).empty()) << all_problems(g);
  verify_or_throw(g);
}

TEST(Ir, VerifierReportsUnknownOp) {
  Graph g = small_graph();
  g.nodes()[1].op = nullptr;
  g.nodes()[1].op_name = "frobnicate";
  EXPECT_EQ(count_problems(g, "node 1 'frobnicate': unknown op 'frobnicate'"), 1) << all_problems(g);
}

TEST(Ir, VerifierReportsArity) {
  Graph g = small_graph();
  g.nodes()[0].args.pop_back();
  EXPECT_EQ(count_problems(g, "node 0 'add': expects 3 arguments"), 1) << all_problems(g);
}

TEST(Ir, VerifierReportsArgumentKinds) {
  Graph g = small_graph();
  g.nodes()[0].args[1] = NodeArg(Scalar(2));            // a Tensor argument as an attribute
  g.nodes()[3].args[1] = NodeArg(ValueRef{0});          // an int argument as a value
  EXPECT_EQ(count_problems(g, "node 0 'add': argument 'other' (Tensor) must be a value reference"), 1)
      << all_problems(g);
  EXPECT_EQ(count_problems(g, "node 3 'slice': argument 'dim' (int) must be an attribute"), 1)
      << all_problems(g);
}

TEST(Ir, VerifierReportsAttributeTypes) {
  Graph g = small_graph();
  g.nodes()[0].args[2] = NodeArg(std::string("one"));
  g.nodes()[2].args[0] = NodeArg(2.5);                  // int[] given a float
  g.nodes()[2].args[2] = NodeArg(kCPU);                 // ScalarType? given a Device
  EXPECT_EQ(count_problems(g, "node 0 'add': argument 'alpha' (Scalar) got an attribute of type str"), 1)
      << all_problems(g);
  EXPECT_EQ(count_problems(g, "node 2 'rand': argument 'size' (int[]) got an attribute of type float"), 1);
  EXPECT_EQ(count_problems(g, "node 2 'rand': argument 'dtype' (ScalarType?) got an attribute of type Device"), 1);
}

TEST(Ir, VerifierReportsUseBeforeDefinition) {
  Graph g = small_graph();
  g.nodes()[0].args[0] = NodeArg(ValueRef{3});  // %3 is defined by node 1
  g.nodes()[1].args[0] = NodeArg(ValueRef{77});
  EXPECT_EQ(count_problems(g, "node 0 'add': uses %3 before it is defined"), 1) << all_problems(g);
  EXPECT_EQ(count_problems(g, "node 1 't': uses %77, which is not a value of the graph"), 1);
}

TEST(Ir, VerifierReportsOutputMetaMismatch) {
  Graph g = small_graph();
  g.value(2).meta.sizes = DimVector({3, 3});
  g.value(2).meta.strides = DimVector({3, 1});
  g.value(4).meta.dtype = kFloat64;
  EXPECT_EQ(count_problems(g, "node 0 'add': output %2 is float32[3, 3]"), 1) << all_problems(g);
  EXPECT_EQ(count_problems(g, "meta function gives float32[2, 3]"), 1);
  EXPECT_EQ(count_problems(g, "node 2 'rand': output %4 is float64[3, 2]"), 1) << all_problems(g);
  // An output count that disagrees with the meta function.
  Graph h = small_graph();
  h.nodes()[1].outputs.clear();
  EXPECT_EQ(count_problems(h, "node 1 't': has 0 outputs but its meta function gives 1"), 1) << all_problems(h);
}

TEST(Ir, VerifierReportsDuplicateOutputIds) {
  Graph g = small_graph();
  g.nodes()[1].outputs[0] = 2;  // node 0 already defines %2
  EXPECT_EQ(count_problems(g, "node 1 't': redefines %2"), 1) << all_problems(g);
  Graph h = small_graph();
  h.nodes()[0].outputs[0] = 0;  // a graph input
  EXPECT_EQ(count_problems(h, "node 0 'add': redefines %0"), 1) << all_problems(h);
}

TEST(Ir, VerifierReportsUndefinedGraphOutputs) {
  Graph g = small_graph();
  g.outputs().push_back(99);
  EXPECT_EQ(count_problems(g, "graph output %99 is not defined"), 1) << all_problems(g);
  Graph h = small_graph();
  h.nodes().pop_back();  // %5 now has no producer
  EXPECT_EQ(count_problems(h, "graph output %5 is not defined"), 1) << all_problems(h);
}

TEST(Ir, VerifierReportsRandomState) {
  Graph g = small_graph();
  g.nodes()[2].rng.reset();
  g.nodes()[1].rng = GeneratorState{1, 1};
  EXPECT_EQ(count_problems(g, "node 2 'rand': random op without a recorded (seed, offset)"), 1)
      << all_problems(g);
  EXPECT_EQ(count_problems(g, "node 1 't': (seed, offset) recorded on an op that is not random"), 1);
  g.nodes()[2].rng = GeneratorState{7, 0};
  g.nodes()[2].args[1] = NodeArg(Generator(3));
  EXPECT_EQ(count_problems(g, "node 2 'rand': random op holds a Generator"), 1) << all_problems(g);
}

TEST(Ir, VerifyOrThrowListsEveryProblem) {
  Graph g = small_graph();
  g.nodes()[0].args.pop_back();
  g.outputs().push_back(99);
  try {
    verify_or_throw(g);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    std::string msg = e.what();
    EXPECT_NE(msg.find("node 0 'add': expects 3 arguments"), std::string::npos) << msg;
    EXPECT_NE(msg.find("graph output %99 is not defined"), std::string::npos) << msg;
  }
}

// ---- Interpreter ---------------------------------------------------------------------------

// The same program, eagerly and as a recording (x: (3, 4)).
std::vector<Tensor> eager_program(const Tensor& x) {
  Tensor noise = randn({3, 4});
  Tensor y = add(x, noise, 0.5);
  Tensor z = y.t();                                       // (4, 3), a view
  Tensor w = z.clone();
  Tensor u = w.slice(0, 1, std::nullopt, 2).uniform_(-1, 1);  // in place on a strided view
  Tensor p = bernoulli(rand({4, 3}, std::nullopt, kFloat64));
  Tensor ints = randint(0, 100, {5}, std::nullopt, kInt32);
  Tensor perm = randperm(7);
  Tensor c = empty({4, 3}).copy_(z);
  Tensor n = c.normal_(2, 3);
  return {z, w, u, p, ints, perm, n};
}

Graph record_program() {
  Graph g;
  ValueRef x = g.add_input(f32({3, 4}));
  ValueRef noise = g.add_node("randn", {Sizes{3, 4}, kNone, kNone, kNone})[0];
  ValueRef y = g.add_node("add", {x, noise, Scalar(0.5)})[0];
  ValueRef z = g.add_node("t", {y})[0];
  ValueRef w = g.add_node("clone", {z})[0];
  ValueRef ws = g.add_node("slice", {w, int64_t{0}, int64_t{1}, kNone, int64_t{2}})[0];
  ValueRef u = g.add_node("uniform_", {ws, -1.0, 1.0, kNone})[0];
  ValueRef r = g.add_node("rand", {Sizes{4, 3}, kNone, kFloat64, kNone})[0];
  ValueRef p = g.add_node("bernoulli", {r, kNone})[0];
  ValueRef ints = g.add_node("randint", {int64_t{0}, int64_t{100}, Sizes{5}, kNone, kInt32, kNone})[0];
  ValueRef perm = g.add_node("randperm", {int64_t{7}, kNone, kNone, kNone})[0];
  ValueRef e = g.add_node("empty", {Sizes{4, 3}, kNone, kNone})[0];
  ValueRef c = g.add_node("copy_", {e, z, false})[0];
  ValueRef n = g.add_node("normal_", {c, 2.0, 3.0, kNone})[0];
  g.set_outputs({z, w, u, p, ints, perm, n});
  return g;
}

TEST(Ir, ReplayReproducesEagerBitForBit) {
  Tensor x = testing::random({3, 4});
  manual_seed(9);
  std::vector<Tensor> eager = eager_program(x);
  GeneratorState after_eager = default_generator().get_state();

  manual_seed(9);
  Graph g = record_program();
  // Recording advanced the default generator exactly as the eager calls did.
  EXPECT_EQ(default_generator().get_state().offset, after_eager.offset);
  EXPECT_TRUE(verify(g).empty()) << all_problems(g);

  std::vector<Tensor> replay = run(g, {x});
  ASSERT_EQ(replay.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    EXPECT_TRUE(bit_equal(replay[i], eager[i])) << "output " << i;
    EXPECT_EQ(replay[i].strides(), eager[i].strides()) << "output " << i;
  }
  // Replays use the recorded (seed, offset), whatever the default generator does meanwhile.
  manual_seed(12345);
  std::vector<Tensor> again = run(g, {x});
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(bit_equal(again[i], eager[i])) << i;
  // Aliasing is preserved: u is a view of w, as in eager mode.
  EXPECT_TRUE(replay[2].is_alias_of(replay[1]));
  // Output metas match the recorded ones.
  for (size_t i = 0; i < replay.size(); ++i) {
    const TensorSpec& s = g.value(g.outputs()[i]).meta;
    EXPECT_EQ(replay[i].sizes(), s.sizes.ref());
    EXPECT_EQ(replay[i].dtype(), s.dtype);
  }
}

TEST(Ir, RecordingReservesFromAnExplicitGenerator) {
  Generator gen(31);
  Graph g;
  ValueRef r = g.add_node("randn", {Sizes{10}, gen, kNone, kNone})[0];
  g.set_outputs({r});
  ASSERT_TRUE(g.nodes()[0].rng.has_value());
  EXPECT_EQ(g.nodes()[0].rng->seed, 31u);
  EXPECT_EQ(g.nodes()[0].rng->offset, 0u);
  EXPECT_EQ(gen.get_state().offset, random_op_counters("randn", 10, kFloat32));
  EXPECT_TRUE(g.nodes()[0].args[1].attribute().is_none());
  Generator fresh(31);
  EXPECT_TRUE(bit_equal(run(g, {})[0], randn({10}, fresh)));
}

TEST(Ir, RunChecksItsInputs) {
  Graph g = small_graph();
  testing::expect_error(ErrorKind::Value, "takes 2 inputs, got 1", [&] { run(g, {ones({2, 3})}); });
  testing::expect_error(ErrorKind::Value, "input 1 is float64[3]", [&] {
    run(g, {ones({2, 3}), ones({3}, kFloat64)});
  });
  auto out = run(g, {ones({2, 3}), ones({3})});
  ASSERT_EQ(out.size(), 3u);
  testing::expect_close(out[0], full({3, 2}, 2.0));
  EXPECT_TRUE(out[2].is_alias_of(out[0]));
}

TEST(Ir, ZeroSizeValues) {
  Graph g;
  ValueRef x = g.add_input(f32({0, 3}));
  ValueRef y = g.add_node("add", {x, x, Scalar(1)})[0];
  ValueRef r = g.add_node("rand", {Sizes{0}, kNone, kNone, kNone})[0];
  g.set_outputs({y, r});
  EXPECT_TRUE(verify(g).empty()) << all_problems(g);
  auto out = run(g, {empty({0, 3})});
  EXPECT_EQ(out[0].sizes(), IntArrayRef({0, 3}));
  EXPECT_EQ(out[1].numel(), 0);
}

}  // namespace
}  // namespace kiln::ir
