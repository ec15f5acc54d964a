// kiln/worker/session.h: the executor against eager CPU, random replay, poisoning, Fetch/Sync/
// Free, the memory limit and the stream-ending errors.
#include "kiln/worker/session.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "kiln/dist/process_group.h"
#include "kiln/proto/codec.h"
#include "test_util.h"

namespace kiln {
namespace {

using worker::Session;

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

proto::Argument V(int64_t id) {
  proto::Argument a;
  a.set_value(id);
  return a;
}
proto::Argument L(std::vector<int64_t> ids) {
  proto::Argument a;
  for (int64_t id : ids) a.mutable_values()->add_ids(id);
  return a;
}
proto::Argument A(const IValue& v) {
  proto::Argument a;
  *a.mutable_attribute() = proto::encode_attribute(v);
  return a;
}

struct BatchBuilder {
  proto::Batch b;
  uint64_t seq = 0;
  proto::Instruction& op(const std::string& name, std::vector<proto::Argument> args,
                         std::vector<int64_t> outs) {
    proto::Instruction& in = *b.add_commands()->mutable_op();
    in.set_seq(++seq);
    in.set_op(name);
    for (auto& a : args) *in.add_args() = a;
    for (int64_t o : outs) in.add_outputs(o);
    return in;
  }
  BatchBuilder& create(int64_t id, const Tensor& t, size_t chunk = 0) {
    for (auto& p : proto::encode_tensor(t, chunk)) {
      proto::Create& c = *b.add_commands()->mutable_create();
      c.set_id(id);
      *c.mutable_data() = p;
    }
    return *this;
  }
  BatchBuilder& fetch(uint64_t request, int64_t id) {
    proto::Fetch& f = *b.add_commands()->mutable_fetch();
    f.set_request(request);
    f.set_id(id);
    return *this;
  }
  BatchBuilder& free(std::vector<int64_t> ids) {
    proto::Free& f = *b.add_commands()->mutable_free();
    for (int64_t id : ids) f.add_ids(id);
    return *this;
  }
  BatchBuilder& sync(uint64_t request) {
    b.add_commands()->mutable_sync()->set_request(request);
    return *this;
  }
};

struct Replies {
  absl::Status status;
  std::vector<proto::WorkerMessage> replies;
};

Replies run(Session& s, const BatchBuilder& bb) {
  Replies r;
  r.status = s.run(bb.b, [&](proto::WorkerMessage&& m) { r.replies.push_back(std::move(m)); });
  return r;
}

// The tensor or error the fetch replies for `request` carry.
Tensor fetched(const Replies& r, uint64_t request, proto::Error* error = nullptr) {
  proto::TensorAssembler a;
  for (const auto& m : r.replies) {
    if (!m.has_fetch() || m.fetch().request() != request) continue;
    if (m.fetch().has_error()) {
      if (error) *error = m.fetch().error();
      return Tensor();
    }
    a.add(m.fetch().data());
  }
  return a.take();
}

Tensor fetch(Session& s, int64_t id, proto::Error* error = nullptr) {
  BatchBuilder bb;
  bb.fetch(99, id);
  Replies r = run(s, bb);
  EXPECT_TRUE(r.status.ok()) << r.status;
  return fetched(r, 99, error);
}

// Each id is poisoned with `code` and a message containing its needle.
void expect_poisoned(Session& s, const std::vector<std::pair<int64_t, std::string>>& want,
                     const std::string& code) {
  for (const auto& [id, needle] : want) {
    proto::Error e;
    EXPECT_FALSE(fetch(s, id, &e).defined()) << id;
    EXPECT_EQ(e.code(), code) << id;
    EXPECT_NE(e.message().find(needle), std::string::npos) << id << ": " << e.message();
  }
}

const proto::SyncReply* sync_reply(const Replies& r) {
  for (const auto& m : r.replies)
    if (m.has_sync()) return &m.sync();
  return nullptr;
}

TEST(WorkerSession, OpsMatchEagerCpu) {
  Session s({});
  Tensor x = testing::random({2, 3}), y = testing::random({3}, kFloat32, -1, 1, 7);
  Tensor w = testing::random({3, 4}, kFloat32, -1, 1, 9);
  BatchBuilder bb;
  bb.create(1, x).create(2, y).create(3, w);
  bb.op("add", {V(1), V(2), A(Scalar(2))}, {4});
  bb.op("mm", {V(4), V(3)}, {5});
  bb.op("sum", {V(5), A(std::vector<int64_t>{1}), A(true), A(IValue())}, {6});
  bb.op("t", {V(5)}, {7});
  bb.op("split", {V(5), A(int64_t{1}), A(int64_t{0})}, {8, 9});
  bb.op("cat", {L({4, 1}), A(int64_t{1})}, {10});
  bb.fetch(1, 4).fetch(2, 5).fetch(3, 6).fetch(4, 7).fetch(5, 9).fetch(6, 10).sync(6);
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  Tensor a = add(x, y, 2), m = mm(a, w);
  EXPECT_TRUE(bit_equal(fetched(r, 1), a));
  EXPECT_TRUE(bit_equal(fetched(r, 2), m));
  EXPECT_TRUE(bit_equal(fetched(r, 3), m.sum(std::vector<int64_t>{1}, true)));
  EXPECT_TRUE(bit_equal(fetched(r, 4), m.t()));
  EXPECT_TRUE(bit_equal(fetched(r, 5), split(m, 1, 0)[1]));
  EXPECT_TRUE(bit_equal(fetched(r, 6), cat({a, x}, 1)));
  ASSERT_NE(sync_reply(r), nullptr);
  EXPECT_EQ(sync_reply(r)->request(), 6u);
  EXPECT_FALSE(sync_reply(r)->has_error());
  EXPECT_EQ(s.instructions_run(), 6u);
  EXPECT_EQ(s.num_values(), 10);
  // A view shares its base's storage: x, y, w, add, mm, sum, cat are the distinct storages.
  EXPECT_EQ(s.memory_in_use_bytes(), (6 + 3 + 12 + 6 + 8 + 2 + 12) * 4u);
}

TEST(WorkerSession, RandomOpsReplayTheEagerDraw) {
  Generator g(1234);
  GeneratorState before = g.get_state();
  Tensor eager = randn({5, 7}, g);
  GeneratorState mid = g.get_state();
  Tensor x = ones({64});
  Tensor drop = dropout(x, 0.5, true, g);
  Session s({});
  BatchBuilder bb;
  proto::Instruction& r1 =
      bb.op("randn", {A(std::vector<int64_t>{5, 7}), A(IValue()), A(IValue()), A(IValue())}, {1});
  r1.mutable_rng()->set_seed(before.seed);
  r1.mutable_rng()->set_offset(before.offset);
  bb.create(2, x);
  proto::Instruction& r2 = bb.op("dropout", {V(2), A(0.5), A(true), A(IValue())}, {3});
  r2.mutable_rng()->set_seed(mid.seed);
  r2.mutable_rng()->set_offset(mid.offset);
  bb.fetch(1, 1).fetch(2, 3);
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_TRUE(bit_equal(fetched(r, 1), eager));
  EXPECT_TRUE(bit_equal(fetched(r, 2), drop));
}

TEST(WorkerSession, InPlaceOpsRebindTheirInput) {
  Session s({});
  Tensor x = testing::random({4}), y = testing::random({4}, kFloat32, -1, 1, 3);
  BatchBuilder bb;
  bb.create(1, x).create(2, y);
  bb.op("add_", {V(1), V(2), A(Scalar(1))}, {1});
  ASSERT_TRUE(run(s, bb).status.ok());
  EXPECT_TRUE(bit_equal(fetch(s, 1), add(x, y)));
  EXPECT_EQ(s.memory_in_use_bytes(), 32u);
  BatchBuilder out;
  out.op("mul.out", {V(1), V(2), V(2)}, {2});
  ASSERT_TRUE(run(s, out).status.ok());
  EXPECT_TRUE(bit_equal(fetch(s, 2), mul(add(x, y), y)));
  // Only an op that writes that argument in place may name an input's id as its output.
  for (auto [op, args] : std::vector<std::pair<std::string, std::vector<proto::Argument>>>{
           {"add", {V(1), V(2), A(Scalar(1))}}, {"add_", {V(2), V(1), A(Scalar(1))}}}) {
    Session s2({});
    BatchBuilder bad;
    bad.create(1, x).create(2, y);
    bad.op(op, args, {1});
    Replies r = run(s2, bad);
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find("op '" + op + "' (seq 1): output id 1 is already in use"),
              std::string::npos)
        << r.status;
  }
}

// See Note [Compiled batches]: the same recorded step, streamed again with new ids, data and random
// states, runs as one compiled graph from its second time on, and computes what eager does.
TEST(WorkerSession, ARepeatedStepRunsCompiledFromItsSecondTime) {
  Session s({});
  Tensor w = testing::random({4, 3}, kFloat32, -1, 1, 1), w_eager = w.clone();
  BatchBuilder init;
  init.create(1, w);
  ASSERT_TRUE(run(s, init).status.ok());
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int64_t b = 100 * (step + 1);  // fresh ids every step, as a client's are
    Tensor x = testing::random({5, 4}, kFloat32, -1, 1, 10 + step);
    const uint64_t seed = 7, offset = 40 * static_cast<uint64_t>(step);
    BatchBuilder bb;
    bb.create(b, x);
    bb.op("mm", {V(b), V(1)}, {b + 1});
    bb.op("relu", {V(b + 1)}, {b + 2});
    bb.op("tanh", {V(b + 2)}, {b + 3});
    bb.op("mul", {V(b + 3), V(b + 3)}, {b + 4});
    bb.op("add", {V(b + 4), V(b + 2), A(Scalar(1))}, {b + 5});
    bb.op("neg", {V(b + 5)}, {b + 6});
    bb.op("abs", {V(b + 6)}, {b + 7});
    bb.op("sqrt", {V(b + 7)}, {b + 8});
    bb.op("mul", {V(b + 8), V(b + 1)}, {b + 9});
    proto::Instruction& r = bb.op("rand", {A(std::vector<int64_t>{5, 3}), A(IValue()), A(IValue()), A(IValue())}, {b + 10});
    r.mutable_rng()->set_seed(seed);
    r.mutable_rng()->set_offset(offset);
    // A seeded op (dropout's recorded form): its seed and offset change every step.
    const int64_t dseed = 1000 + step, doff = 8 * step;
    bb.op("dropout_seeded", {V(b + 9), A(0.25), A(dseed), A(doff)}, {b + 18});
    bb.op("add", {V(b + 18), V(b + 10), A(Scalar(0.5))}, {b + 11});
    bb.op("sigmoid", {V(b + 11)}, {b + 12});
    bb.op("sin", {V(b + 12)}, {b + 13});
    bb.op("cos", {V(b + 13)}, {b + 14});
    bb.op("mul", {V(b + 14), V(b + 13)}, {b + 15});
    bb.op("sum", {V(b + 15), A(IValue()), A(false), A(IValue())}, {b + 16});
    bb.op("tanh", {V(1)}, {b + 17});
    bb.op("add_", {V(1), V(b + 17), A(Scalar(-0.01))}, {1});
    std::vector<int64_t> dead;
    for (int64_t k = 0; k <= 18; ++k)
      if (k != 16) dead.push_back(b + k);
    bb.free(dead).fetch(1, b + 16).free({b + 16});
    Replies rep = run(s, bb);
    ASSERT_TRUE(rep.status.ok()) << rep.status;
    proto::Error err;
    Tensor got_loss = fetched(rep, 1, &err);
    ASSERT_TRUE(got_loss.defined()) << err.DebugString();
    // The same step, eagerly.
    Tensor a1 = mm(x, w_eager), a2 = relu(a1), a3 = tanh(a2), a5 = add(a3 * a3, a2);
    Tensor a9 = sqrt(abs(neg(a5))) * a1;
    Generator g(seed);
    g.set_state({seed, offset});
    Tensor a10 = add(dropout_seeded(a9, 0.25, dseed, doff), rand({5, 3}, g), 0.5);
    Tensor a13 = sin(sigmoid(a10)), loss = (cos(a13) * a13).sum();
    w_eager.add_(tanh(w_eager), -0.01);
    testing::expect_close(got_loss, loss, 1e-6, 1e-6);
    testing::expect_close(fetch(s, 1), w_eager, 1e-6, 1e-6);
    EXPECT_EQ(s.num_values(), 1);  // w alone: the step's values were freed
  }
  EXPECT_EQ(s.compiled_runs(), 3u);
  EXPECT_EQ(s.instructions_run(), 4u * 19u);
}

TEST(WorkerSession, FailuresPoisonDownstreamValuesOnly) {
  Session s({});
  BatchBuilder bb;
  bb.create(1, ones({2, 3})).create(2, ones({2, 3}));
  bb.op("mm", {V(1), V(2)}, {3});                      // seq 1 fails: shapes
  bb.op("relu", {V(3)}, {4});                          // seq 2 reads the poison
  bb.op("add", {V(1), V(2), A(Scalar(1))}, {5});       // independent: runs
  bb.op("add", {V(4), V(5), A(Scalar(1))}, {6});       // poisoned again
  bb.fetch(1, 6).fetch(2, 5).sync(3);
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  proto::Error e;
  EXPECT_FALSE(fetched(r, 1, &e).defined());
  EXPECT_EQ(e.code(), "INVALID_ARGUMENT");
  EXPECT_EQ(e.kind(), "value");
  EXPECT_EQ(e.seq(), 1u);
  EXPECT_EQ(e.op(), "mm");
  EXPECT_NE(e.message().find("mm"), std::string::npos) << e.message();
  EXPECT_TRUE(bit_equal(fetched(r, 2), full({2, 3}, 2.0)));
  ASSERT_NE(sync_reply(r), nullptr);
  EXPECT_EQ(sync_reply(r)->error().seq(), 1u);
  // The first failure is reported once; a clean stretch syncs clean.
  BatchBuilder next;
  next.op("add", {V(5), V(5), A(Scalar(1))}, {7}).set_seq(10);
  next.sync(4);
  Replies r2 = run(s, next);
  ASSERT_NE(sync_reply(r2), nullptr);
  EXPECT_FALSE(sync_reply(r2)->has_error());
}

TEST(WorkerSession, InstructionErrorsNameTheProblem) {
  Session s({});
  BatchBuilder bb;
  bb.create(1, ones({4}));
  bb.op("frobnicate", {V(1)}, {2});
  bb.op("add", {V(1), V(1)}, {3});
  bb.op("relu", {V(42)}, {4});
  bb.op("relu", {V(1)}, {5, 6});
  bb.op("split", {V(1), A(int64_t{1}), A(int64_t{0})}, {7, 8});
  bb.op("relu", {V(1)}, {9}).mutable_rng()->set_seed(3);
  bb.op("relu", {proto::Argument()}, {10});
  bb.op("add", {V(1), V(1), A(std::string("x"))}, {11});
  bb.op("zeros", {A(std::vector<int64_t>{2}), A(IValue()), A(Device("meta"))}, {12});
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<std::pair<int64_t, std::string>> want = {
      {2, "unknown op 'frobnicate' (not in the op table)"},
      {3, "add: expected 3 arguments (schema order, defaults included), got 2"},
      {4, "relu: unknown value id 42"},
      {5, "relu: returns 1 tensors but the instruction names 2 output ids"},
      {7, "split: returned 4 tensors but the instruction names 2 output ids"},
      {9, "relu: has a (seed, offset) but no generator argument"},
      {10, "relu: argument 0 (self) has no value"},
      {11, "expected"},
  };
  expect_poisoned(s, want, "INVALID_ARGUMENT");
  proto::Error e;
  fetch(s, 12, &e);  // a meta tensor cannot be fetched: its error answers the fetch
  EXPECT_EQ(e.op(), "fetch");
  fetch(s, 77, &e);
  EXPECT_EQ(e.message(), "fetch: unknown value id 77");
}

TEST(WorkerSession, StreamEndingErrors) {
  auto expect_end = [](BatchBuilder bb, const std::string& needle) {
    Session s({});
    Replies r = run(s, bb);
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(r.status.message().find(needle), std::string::npos) << r.status;
  };
  BatchBuilder empty;
  empty.b.add_commands();
  expect_end(empty, "command 0 of the batch has no kind (empty command)");
  BatchBuilder taken;
  taken.create(1, ones({2})).create(2, ones({2}));
  taken.op("relu", {V(1)}, {2});
  expect_end(taken, "command 2 of the batch: op 'relu' (seq 1): output id 2 is already in use");
  BatchBuilder twice;
  twice.create(1, ones({2})).create(1, ones({2}));
  expect_end(twice, "create of value id 1: the id is already in use");
  BatchBuilder zero;
  zero.create(1, ones({2}));
  zero.op("relu", {V(1)}, {0});
  expect_end(zero, "output id 0 is not > 0");
  BatchBuilder dup;
  dup.create(1, ones({4}));
  dup.op("split", {V(1), A(int64_t{2}), A(int64_t{0})}, {3, 3});
  expect_end(dup, "output id 3 appears twice");
  BatchBuilder pieces;
  pieces.create(5, ones({1000}), 1000);
  pieces.b.mutable_commands(1)->mutable_create()->mutable_data()->set_offset(7);
  expect_end(pieces, "create of value id 5: tensor data: piece at byte 7, expected the next at byte 1000");
  BatchBuilder shape;
  shape.create(5, ones({1000}), 1000);
  shape.b.mutable_commands(2)->mutable_create()->mutable_data()->set_shape(0, 3);
  expect_end(shape, "differs from the first piece's");
  BatchBuilder dtype;
  dtype.create(5, ones({2}));
  dtype.b.mutable_commands(0)->mutable_create()->mutable_data()->set_dtype("float128");
  expect_end(dtype, "unknown dtype 'float128'");
}

// See Note [Remote DTensor]. A worker without a gang refuses meshes, and DTensor commands that name
// an unknown or failed mesh, or bad ids, get errors naming them (the gang itself is tested in
// tests/python/test_dtensor.py).
TEST(WorkerSession, DTensorCommandsWithoutAGangNameTheProblem) {
  if (dist::is_initialized()) GTEST_SKIP() << "a process group exists in this process";
  Session s({});
  BatchBuilder bb;
  bb.create(1, ones({4, 2}));
  proto::MeshCreate& m = *bb.b.add_commands()->mutable_mesh();
  m.set_root(7);
  m.add_shape(2);
  auto dtensor_arg = [](proto::Instruction& in, int64_t root) {
    proto::DTensorArg& d = *in.add_dtensor_args();
    d.set_arg(0);
    d.set_elem(-1);
    d.mutable_spec()->mutable_mesh()->set_root(root);
    d.mutable_spec()->mutable_mesh()->add_root_dims()->add_values(0);
    d.mutable_spec()->add_placements()->set_kind(1);
    for (int64_t v : {4, 2}) d.mutable_spec()->add_shape(v);
    for (int64_t v : {2, 1}) d.mutable_spec()->add_stride(v);
  };
  dtensor_arg(bb.op("relu", {V(1)}, {2}), 7);
  dtensor_arg(bb.op("relu", {V(1)}, {3}), 8);
  proto::Redistribute& r = *bb.b.add_commands()->mutable_redistribute();
  r.set_seq(9);
  r.set_input(42);
  r.set_output(4);
  bb.sync(1);
  Replies rep = run(s, bb);
  ASSERT_TRUE(rep.status.ok()) << rep.status;
  const proto::SyncReply* sync = sync_reply(rep);
  ASSERT_NE(sync, nullptr);
  EXPECT_NE(sync->error().message().find("this worker has no process group"), std::string::npos)
      << sync->error().message();
  expect_poisoned(s,
                  {{2,
                    "device mesh 7 could not be made: init_device_mesh: this worker has no "
                    "process group"},
                   {3, "unknown device mesh 8 (no MeshCreate named it)"},
                   {4, "redistribute: unknown value id 42"}},
                  "INVALID_ARGUMENT");

  BatchBuilder again;
  *again.b.add_commands()->mutable_mesh() = m;
  Replies twice = run(s, again);
  EXPECT_NE(twice.status.message().find("MeshCreate: device mesh 7 exists already"),
            std::string::npos)
      << twice.status;
  BatchBuilder zero;
  zero.b.add_commands()->mutable_redistribute()->set_input(1);
  Replies z = run(s, zero);
  EXPECT_NE(z.status.message().find("output id 0 is not > 0"), std::string::npos) << z.status;
}

// The DTensor path on a one-rank world (no store, no transport): instructions run at the
// DTensor key, results are checked against the client's specs, and bad specs are named.
TEST(WorkerSession, DTensorInstructionsRunOnTheShardsAndCheckTheirSpecs) {
  if (dist::is_initialized()) GTEST_SKIP() << "a process group exists in this process";
  dist::InitOptions o;
  o.init_method = "";
  o.rank = 0;
  o.world_size = 1;
  dist::init_process_group(o);
  {
    Session s({});
    auto spec = [](int kind, std::vector<int64_t> shape) {
      proto::DTensorSpec p;
      p.mutable_mesh()->set_root(1);
      p.mutable_mesh()->add_root_dims()->add_values(0);
      p.add_placements()->set_kind(kind);
      DimVector st = contiguous_strides(IntArrayRef(shape));
      for (int64_t v : shape) p.add_shape(v);
      for (int64_t v : st) p.add_stride(v);
      return p;
    };
    auto dtensor_op = [&](BatchBuilder& bb, int64_t out, proto::DTensorSpec in,
                          proto::DTensorSpec result) {
      proto::Instruction& ins = bb.op("neg", {V(1)}, {out});
      proto::DTensorArg& d = *ins.add_dtensor_args();
      d.set_arg(0);
      d.set_elem(-1);
      *d.mutable_spec() = std::move(in);
      *ins.add_results() = std::move(result);
    };
    BatchBuilder bb;
    proto::MeshCreate& m = *bb.b.add_commands()->mutable_mesh();
    m.set_root(1);
    m.add_shape(1);
    m.add_names("dp");
    bb.create(1, arange(0, 8, 1, kFloat32).reshape({4, 2}));
    dtensor_op(bb, 2, spec(0, {4, 2}), spec(0, {4, 2}));  // Shard(0) -> Shard(0): fine
    dtensor_op(bb, 3, spec(0, {4, 2}), spec(1, {4, 2}));  // the client expected Replicate
    dtensor_op(bb, 4, spec(1, {5, 2}), spec(1, {5, 2}));  // not this rank's shape
    dtensor_op(bb, 5, spec(7, {4, 2}), spec(7, {4, 2}));  // no such placement
    constexpr int64_t kHuge = std::numeric_limits<int64_t>::max();
    dtensor_op(bb, 7, spec(0, {kHuge, 2}), spec(0, {kHuge, 2}));  // more than int64 counts
    proto::Redistribute& r = *bb.b.add_commands()->mutable_redistribute();
    r.set_seq(9);
    r.set_input(2);
    r.set_output(6);
    *r.mutable_from() = spec(0, {4, 2});
    r.add_to()->set_kind(2);  // Partial(sum): rank 0 of one keeps the values
    Replies rep = run(s, bb);
    ASSERT_TRUE(rep.status.ok()) << rep.status;
    Tensor want = arange(0, 8, 1, kFloat32).reshape({4, 2}).neg();
    EXPECT_TRUE(bit_equal(fetch(s, 2), want));
    EXPECT_TRUE(bit_equal(fetch(s, 6), want));
    expect_poisoned(s,
                    {{3, "neg: this worker's DTensor dispatch gave result 0 [Shard(0)] of shape "
                         "[4, 2], the client's [Replicate()] of shape [4, 2]"}},
                    "INTERNAL");
    // FSDP's reshard on a gang: Release frees the memory and keeps the value; reading it is an
    // error until a redistribute `into` it refills it.
    const uint64_t before = s.memory_in_use_bytes();
    BatchBuilder rel;
    rel.b.add_commands()->mutable_release()->add_ids(6);
    rel.op("neg", {V(6)}, {8});
    ASSERT_TRUE(run(s, rel).status.ok());
    EXPECT_EQ(s.memory_in_use_bytes(), before - 32);
    expect_poisoned(s, {{8, "value id 6 was released (FSDP resharded it after forward)"}},
                    "INVALID_ARGUMENT");
    proto::Error e;
    EXPECT_FALSE(fetch(s, 6, &e).defined());
    EXPECT_NE(e.message().find("was released"), std::string::npos) << e.message();
    BatchBuilder back;
    proto::Redistribute& into = *back.b.add_commands()->mutable_redistribute();
    into = r;
    into.set_into(true);
    ASSERT_TRUE(run(s, back).status.ok());
    EXPECT_EQ(s.memory_in_use_bytes(), before);
    EXPECT_TRUE(bit_equal(fetch(s, 6), want));
    // A DTensor argument named twice, and a refill of a value that does not exist (no stray
    // id is left for it).
    BatchBuilder odd;
    proto::Instruction& twice = odd.op("neg", {V(1)}, {9});
    for (int k = 0; k < 2; ++k) {
      proto::DTensorArg& d = *twice.add_dtensor_args();
      d.set_elem(-1);
      *d.mutable_spec() = spec(0, {4, 2});
    }
    proto::Redistribute& stray = *odd.b.add_commands()->mutable_redistribute();
    stray = r;
    stray.set_output(77);
    stray.set_into(true);
    odd.sync(3);
    const int64_t values = s.num_values();
    Replies o = run(s, odd);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(s.num_values(), values + 1);  // id 9 (poisoned), not 77
    expect_poisoned(s, {{9, "neg: DTensor argument 0 is not a tensor, or is named twice"}},
                    "INVALID_ARGUMENT");
    expect_poisoned(s,
                    {{4, "rank 0 holds a shard of shape [4, 2] but [Replicate()] of global shape "
                         "[5, 2] give it [5, 2]"},
                     {5, "placement kind 7 (expected 0 Shard, 1 Replicate, 2 Partial)"},
                     {7, "spans more elements than int64 counts"}},
                    "INVALID_ARGUMENT");
  }
  dist::destroy_process_group();
}

TEST(WorkerSession, LargeValuesTravelInPiecesBothWays) {
  Session s({});
  Tensor t = testing::random({5 * 256, 1024}, kFloat32);  // 5 MiB
  BatchBuilder bb;
  bb.create(1, t).fetch(7, 1);
  EXPECT_EQ(bb.b.commands_size(), 6);
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.replies.size(), 5u);
  for (const auto& m : r.replies) EXPECT_EQ(m.fetch().request(), 7u);
  EXPECT_TRUE(bit_equal(fetched(r, 7), t));
  // A Create may also span batches.
  Session s2({});
  BatchBuilder all;
  all.create(1, t);
  for (int i = 0; i < all.b.commands_size(); ++i) {
    proto::Batch one;
    *one.add_commands() = all.b.commands(i);
    ASSERT_TRUE(s2.run(one, [](proto::WorkerMessage&&) {}).ok());
  }
  EXPECT_TRUE(bit_equal(fetch(s2, 1), t));
}

TEST(WorkerSession, FreeForgetsValuesAndIgnoresUnknownIds) {
  Session s({});
  BatchBuilder bb;
  bb.create(1, ones({8})).op("t", {V(1)}, {2});
  bb.free({1, 12345});
  ASSERT_TRUE(run(s, bb).status.ok());
  EXPECT_EQ(s.num_values(), 1);
  EXPECT_EQ(s.memory_in_use_bytes(), 32u);  // the view keeps the storage alive
  BatchBuilder f2;
  f2.free({2});
  ASSERT_TRUE(run(s, f2).status.ok());
  EXPECT_EQ(s.num_values(), 0);
  EXPECT_EQ(s.memory_in_use_bytes(), 0u);
  proto::Error e;
  fetch(s, 1, &e);
  EXPECT_EQ(e.message(), "fetch: unknown value id 1");
  // A freed id may be used again.
  BatchBuilder again;
  again.create(1, zeros({2}));
  EXPECT_TRUE(run(s, again).status.ok());
}

// An id whose Create has not received all its pieces reads as incomplete, not as unknown, both
// to an instruction and to a Fetch; its last piece completes it.
TEST(WorkerSession, AnIncompleteCreateIsReportedAsIncomplete) {
  Session s({});
  BatchBuilder bb;
  bb.create(1, ones({4}), 4);  // 16 bytes in 4 pieces; the last one comes later
  proto::Command last = bb.b.commands(3);
  bb.b.mutable_commands()->RemoveLast();
  bb.op("relu", {V(1)}, {2});
  bb.fetch(8, 1);
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::string why = "value id 1 is incomplete: its Create has received 12 of 16 bytes";
  proto::Error e;
  EXPECT_FALSE(fetched(r, 8, &e).defined());
  EXPECT_EQ(e.message(), "fetch: " + why);
  expect_poisoned(s, {{2, "relu: " + why}}, "INVALID_ARGUMENT");
  proto::Batch rest;
  *rest.add_commands() = last;
  ASSERT_TRUE(s.run(rest, [](proto::WorkerMessage&&) {}).ok());
  EXPECT_TRUE(bit_equal(fetch(s, 1), ones({4})));
}

TEST(WorkerSession, MemoryLimitPoisonsInsteadOfCrashing) {
  Session s({.memory_limit_bytes = 1000});
  BatchBuilder bb;
  bb.create(1, ones({100}));                                      // 400 bytes
  bb.op("zeros", {A(std::vector<int64_t>{400}), A(IValue()), A(IValue())}, {2});
  bb.op("relu", {V(1)}, {3});                                     // 800: fits
  bb.op("relu", {V(1)}, {4});                                     // 1200: refused after meta
  bb.op("zeros", {A(std::vector<int64_t>{int64_t{1} << 40}), A(IValue()), A(IValue())}, {5});
  bb.create(6, ones({1000}), 1000);                               // refused, spans 4 pieces
  bb.op("relu", {V(1)}, {7}).set_seq(70);
  bb.sync(1);
  Replies r = run(s, bb);
  ASSERT_TRUE(r.status.ok()) << r.status;
  const std::vector<std::pair<int64_t, std::string>> want = {
      {2, "worker memory limit 1000 bytes exceeded: op 'zeros' needs 1600 bytes with 400 in use"},
      {4, "worker memory limit 1000 bytes exceeded: op 'relu' needs 400 bytes with 800 in use"},
      {5, "op 'zeros' needs 4398046511104 bytes"},
      {6, "worker memory limit 1000 bytes exceeded: create of value id 6 needs 4000 bytes"},
      {7, "op 'relu' needs 400 bytes with 800 in use"},
  };
  expect_poisoned(s, want, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(sync_reply(r)->error().op(), "zeros");
  EXPECT_EQ(s.memory_in_use_bytes(), 800u);
  EXPECT_TRUE(bit_equal(fetch(s, 3), ones({100})));
}

TEST(WorkerSession, RemoteDeviceAttributesMeanTheWorkersDevice) {
  Session s({});
  BatchBuilder bb;
  bb.op("ones", {A(std::vector<int64_t>{2}), A(kInt64), A(Device("remote:3"))}, {1});
  ASSERT_TRUE(run(s, bb).status.ok());
  Tensor t = fetch(s, 1);
  EXPECT_TRUE(bit_equal(t, ones({2}, kInt64)));
}

// Not a benchmark, a budget: the executor's own cost per one-element op (the target is a few
// µs; the bound here is loose so a busy machine does not fail it).
TEST(WorkerSession, PerInstructionOverheadIsSmall) {
  Session s({});
  BatchBuilder init;
  init.create(1, ones({1})).create(2, ones({1}));
  ASSERT_TRUE(run(s, init).status.ok());
  constexpr int kOps = 100000, kPerBatch = 1000;
  std::vector<proto::Batch> batches;
  int64_t next = 3;
  for (int b = 0; b < kOps / kPerBatch; ++b) {
    BatchBuilder bb;
    for (int i = 0; i < kPerBatch; ++i) bb.op("add", {V(1), V(2), A(Scalar(1))}, {next++});
    proto::Free& f = *bb.b.add_commands()->mutable_free();
    for (int64_t id = next - kPerBatch; id < next; ++id) f.add_ids(id);
    batches.push_back(std::move(bb.b));
  }
  auto t0 = std::chrono::steady_clock::now();
  for (const proto::Batch& b : batches) ASSERT_TRUE(s.run(b, [](proto::WorkerMessage&&) {}).ok());
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count() / kOps;
  std::printf("[ info ] Session::run: %.2f us per one-element add (%d ops)\n", us, kOps);
  EXPECT_LT(us, 50.0);
  EXPECT_EQ(s.num_values(), 2);
}

}  // namespace
}  // namespace kiln
