// kiln/worker/codec.h: tensors, attributes and graphs through their wire form, and malformed input.
#include "kiln/proto/codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "kiln/meta.h"
#include "test_util.h"

namespace kiln {
namespace {

using proto::decode_attribute;
using proto::encode_attribute;
using proto::encode_tensor;
using proto::TensorAssembler;

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

Tensor round_trip(const Tensor& t, size_t chunk = 0, size_t* pieces = nullptr) {
  std::vector<proto::TensorData> ps = proto::encode_tensor(t, chunk);
  if (pieces) *pieces = ps.size();
  proto::TensorAssembler a;
  for (const auto& p : ps) {
    EXPECT_FALSE(a.complete());
    a.add(p);
  }
  EXPECT_TRUE(a.complete());
  return a.take();
}

proto::TensorData piece(const std::string& dtype, std::vector<int64_t> shape, uint64_t offset,
                        std::string data) {
  proto::TensorData p;
  p.set_dtype(dtype);
  for (int64_t s : shape) p.add_shape(s);
  p.set_offset(offset);
  p.set_data(std::move(data));
  return p;
}

TEST(WorkerCodec, RoundTripsEveryDtype) {
  for (ScalarType dt : {kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16,
                        kFloat32, kFloat64}) {
    Tensor t = testing::random({3, 5}, dt);
    Tensor u = round_trip(t);
    EXPECT_TRUE(bit_equal(t, u)) << dt;
    EXPECT_TRUE(u.device().is_cpu());
  }
}

TEST(WorkerCodec, NonContiguousZeroDimAndZeroSize) {
  Tensor t = testing::random({4, 6});
  Tensor nc = testing::non_contiguous(t);
  EXPECT_TRUE(bit_equal(round_trip(nc), t));
  Tensor s = testing::random({}, kFloat64);
  EXPECT_TRUE(bit_equal(round_trip(s), s));
  size_t n = 0;
  Tensor z = empty_on({0, 3}, kFloat32, kCPU);
  Tensor zz = round_trip(z, 0, &n);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(zz.sizes(), z.sizes());
}

TEST(WorkerCodec, LargeTensorTravelsInPieces) {
  Tensor t = testing::random({5, 1024, 256}, kFloat32);  // 5 MiB
  size_t n = 0;
  Tensor u = round_trip(t, 0, &n);
  EXPECT_EQ(n, 5u);
  EXPECT_TRUE(bit_equal(t, u));
  EXPECT_TRUE(bit_equal(round_trip(t, 1000, &n), t));  // a chunk size that splits elements
  EXPECT_EQ(n, (t.nbytes() + 999) / 1000);
}

TEST(WorkerCodec, MalformedPiecesAreValueErrors) {
  std::string eight(8, '\0');
  testing::expect_error(ErrorKind::Value, "unknown dtype 'float33'", [&] {
    proto::TensorAssembler a;
    a.add(piece("float33", {2}, 0, eight));
  });
  testing::expect_error(ErrorKind::Value, "negative size -2", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {-2}, 0, ""));
  });
  testing::expect_error(ErrorKind::Value, "shape overflows", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {int64_t{1} << 40, int64_t{1} << 40}, 0, ""));
  });
  testing::expect_error(ErrorKind::Value, "first piece starts at byte 4", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {2}, 4, "1234"));
  });
  testing::expect_error(ErrorKind::Value, "expected the next at byte 4", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {2}, 0, "1234"));
    a.add(piece("float32", {2}, 5, "123"));
  });
  testing::expect_error(ErrorKind::Value, "differs from the first piece's", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {2}, 0, "1234"));
    a.add(piece("float32", {3}, 4, "1234"));
  });
  testing::expect_error(ErrorKind::Value, "differs from the first piece's", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {2}, 0, "1234"));
    a.add(piece("int32", {2}, 4, "1234"));
  });
  testing::expect_error(ErrorKind::Value, "runs past the tensor's 8 bytes", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {2}, 0, "123456789"));
  });
  testing::expect_error(ErrorKind::Value, "bool byte 7", [&] {
    proto::TensorAssembler a;
    a.add(piece("bool", {2}, 0, std::string("\x01\x07", 2)));
  });
  testing::expect_error(ErrorKind::Value, "incomplete, 4 of 8 bytes", [&] {
    proto::TensorAssembler a;
    a.add(piece("float32", {2}, 0, "1234"));
    a.take();
  });
}

TEST(WorkerCodec, AssemblerIsReusableAfterTake) {
  proto::TensorAssembler a;
  float v = 2.5f;
  a.add(piece("float32", {}, 0, std::string(reinterpret_cast<char*>(&v), 4)));
  EXPECT_EQ(a.take().item<float>(), 2.5f);
  EXPECT_FALSE(a.complete());
  a.add(piece("int64", {0}, 0, ""));
  EXPECT_EQ(a.take().numel(), 0);
}

TEST(WorkerCodec, AttributesRoundTrip) {
  std::vector<IValue> vs = {IValue(),
                            IValue(int64_t{-7}),
                            IValue(2.5),
                            IValue(true),
                            IValue(std::vector<int64_t>{1, -2, 3}),
                            IValue(std::string("mean")),
                            IValue(kBFloat16),
                            IValue(Device("cuda:1")),
                            IValue(Scalar(int64_t{3})),
                            IValue(Scalar(0.25)),
                            IValue(Scalar(true))};
  for (const IValue& v : vs) {
    IValue w = proto::decode_attribute(proto::encode_attribute(v));
    EXPECT_EQ(w.repr(), v.repr());
    EXPECT_EQ(w.variant().index(), v.variant().index()) << v.repr();
  }
  EXPECT_TRUE(proto::decode_attribute(proto::encode_attribute(IValue(Scalar(0.25)))).to_scalar().is_floating());
  EXPECT_TRUE(proto::decode_attribute(proto::encode_attribute(IValue(Scalar(true)))).to_scalar().is_bool());
}

TEST(WorkerCodec, BadAttributesAreValueErrors) {
  testing::expect_error(ErrorKind::Value, "Tensor has no attribute form",
                        [] { proto::encode_attribute(IValue(zeros({1}))); });
  testing::expect_error(ErrorKind::Value, "has no attribute form",
                        [] { proto::encode_attribute(IValue(Generator(1))); });
  testing::expect_error(ErrorKind::Value, "attribute: no value set",
                        [] { proto::decode_attribute(proto::Attribute()); });
  proto::Attribute a;
  a.set_dtype("complex7");
  testing::expect_error(ErrorKind::Value, "unknown dtype 'complex7'", [&] { proto::decode_attribute(a); });
  a.set_device("gpu:x");
  testing::expect_error(ErrorKind::Value, "gpu:x", [&] { proto::decode_attribute(a); });
}

// ---- graphs (proto::encode_graph / proto::decode_graph) ----------------------------------------------------

ir::Graph sample_graph() {
  ir::Graph g;
  auto x = g.add_input(meta::contiguous_spec({2, 3}, kFloat32, kCPU));
  TensorSpec two = meta::contiguous_spec({}, kFloat64, kCPU);
  two.wrapped_number = true;
  auto e = g.add_input(two, Scalar(2.0));
  auto y = g.add_node("pow", {x, e})[0];
  auto r = g.add_node("rand", {std::vector<int64_t>{2, 3}, IValue(), IValue(), IValue()},
                      GeneratorState{7, 4})[0];
  auto z = g.add_node("add", {y, r, Scalar(0.5)})[0];
  auto parts = g.add_node("split", {z, int64_t{1}, int64_t{1}});
  auto c = g.add_node("cat", {std::vector<ir::ValueRef>{parts[1], parts[0]}, int64_t{1}})[0];
  g.set_outputs({c, y});
  return g;
}

TEST(GraphCodec, RoundTripsAndRunsTheSame) {
  ir::Graph g = sample_graph();
  ir::Graph back = proto::decode_graph(proto::encode_graph(g));
  EXPECT_EQ(back.str(), g.str());
  Tensor x = arange(0, 6, 1, kFloat32).reshape({2, 3}) - 2.5;
  Tensor two = scalar_to_tensor(Scalar(2.0));
  std::vector<Tensor> want = ir::run(g, {x, two}), got = ir::run(back, {x, two});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(bit_equal(got[0], want[0]));
  EXPECT_TRUE(bit_equal(got[1], want[1]));
  // Wire ids need not be the graph's own: any distinct ids decode to the same graph.
  proto::Graph p = proto::encode_graph(g);
  auto moved = [&](int64_t v) { return v * 10 + 1000; };
  for (auto& id : *p.mutable_inputs()) id = moved(id);
  for (auto& n : *p.mutable_nodes()) {
    for (auto& a : *n.mutable_args()) {
      if (a.kind_case() == proto::Argument::kValue) a.set_value(moved(a.value()));
      if (a.kind_case() == proto::Argument::kValues)
        for (auto& id : *a.mutable_values()->mutable_ids()) id = moved(id);
    }
    for (auto& o : *n.mutable_outputs()) o = moved(o);
  }
  for (auto& o : *p.mutable_outputs()) o = moved(o);
  EXPECT_EQ(proto::decode_graph(p).str(), g.str());
}

TEST(GraphCodec, MalformedGraphsNameWhatIsWrong) {
  const proto::Graph good = proto::encode_graph(sample_graph());
  auto expect_bad = [&](const std::string& what, const std::function<void(proto::Graph&)>& edit) {
    proto::Graph p = good;
    edit(p);
    testing::expect_error(ErrorKind::Value, what, [&] { proto::decode_graph(p); });
  };
  expect_bad("unknown op 'no_such_op'", [](proto::Graph& p) { p.mutable_nodes(0)->set_op("no_such_op"); });
  expect_bad("uses unknown value 999", [](proto::Graph& p) {
    p.mutable_nodes(0)->mutable_args(0)->set_value(999);
  });
  expect_bad("defines value 0 a second time", [](proto::Graph& p) { p.mutable_nodes(0)->set_outputs(0, 0); });
  expect_bad("names 2 outputs; the op makes 1", [](proto::Graph& p) { p.mutable_nodes(0)->add_outputs(77); });
  expect_bad("2 inputs but 1 input specs", [](proto::Graph& p) { p.mutable_input_specs()->RemoveLast(); });
  expect_bad("negative size", [](proto::Graph& p) { p.mutable_input_specs(0)->set_sizes(0, -4); });
  expect_bad("empty argument", [](proto::Graph& p) { p.mutable_nodes(1)->mutable_args(0)->Clear(); });
  expect_bad("the graph's outputs uses unknown value 4242", [](proto::Graph& p) { p.set_outputs(0, 4242); });
  expect_bad("node 0 'pow'", [](proto::Graph& p) { p.mutable_nodes(0)->mutable_args()->RemoveLast(); });
  proto::Graph bad_dtype = good;
  bad_dtype.mutable_input_specs(0)->set_dtype("float13");
  EXPECT_THROW(proto::decode_graph(bad_dtype), Error);
}

}  // namespace
}  // namespace kiln
