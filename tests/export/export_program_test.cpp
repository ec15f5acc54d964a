// kiln::export_program and kiln::ExportedProgram (kiln/exported_program.h): an MLP and a small
// CNN exported with a dynamic batch and run from the file against eager at other batch sizes;
// symbolic dims that multiply (a reshape to B*T rows); refusals at export (a branch on a size,
// a size that is no polynomial, a write into a weight); files refused at load (truncated,
// altered, another format, an op this build lacks); inputs refused at run, naming input and dim.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "export_util.h"
#include "file_format.h"  // client/export/src: to forge files
#include "kiln/autograd/grad_mode.h"
#include "kiln/exported_program.h"
#include "kiln/nn/nn.h"
#include "kiln/proto/program.pb.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

Tensor eager(const nn::ModulePtr& m, const Tensor& x) {
  autograd::NoGradGuard g;
  return m->forward(x);
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "." + std::to_string(::getpid()) + ".kprog"))
      .string();
}

std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(12, 32), std::make_shared<nn::GELU>(),
                                 std::make_shared<nn::Linear>(32, 5)});
}

TEST(ExportProgram, MlpFromFileMatchesEagerAtOtherBatchSizes) {
  auto mlp = make_mlp();
  mlp->eval();
  ExportOptions o = batch_dynamic({"x"}, mlp);
  const std::string path = tmp_path("mlp");
  export_program(path, forward_of(mlp), {random({4, 12}, kFloat32, -1, 1, 1)}, o);
  ExportedProgram p = ExportedProgram::load(path);
  std::filesystem::remove(path);
  ASSERT_EQ(p.inputs().size(), 1u);
  EXPECT_EQ(p.inputs()[0].name, "x");
  EXPECT_EQ(p.inputs()[0].dims, (std::vector<std::string>{"batch", "12"}));
  EXPECT_EQ(p.outputs()[0].dims, (std::vector<std::string>{"batch", "5"}));
  EXPECT_EQ(p.weights().count("0.weight"), 1u);
  EXPECT_EQ(p.weights().count("2.bias"), 1u);
  const std::string d = p.describe();
  EXPECT_NE(d.find("x: float32[batch, 12]"), std::string::npos) << d;
  EXPECT_NE(d.find("batch: dim 0 of x"), std::string::npos) << d;
  for (int64_t b : {4, 1, 7, 33}) {
    Tensor x = random({b, 12}, kFloat32, -1, 1, 10 + b);
    std::vector<Tensor> out = p.run({x});
    ASSERT_EQ(out.size(), 1u);
    expect_close(out[0], eager(mlp, x), 1e-6, 1e-6);
  }
  // By name.
  Tensor x = random({3, 12}, kFloat32, -1, 1, 99);
  TensorMap named = p.run_named({{"x", x}});
  expect_close(named.at("output0"), eager(mlp, x), 1e-6, 1e-6);
}

class SmallCnn : public nn::Module {
 public:
  SmallCnn() : Module("SmallCnn") {
    c1 = register_module("c1", std::make_shared<nn::Conv2d>(1, 4, std::vector<int64_t>{3},
                                                            nn::ConvArgs{.padding = {1}}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
    fc = register_module("fc", std::make_shared<nn::Linear>(4 * 4 * 4, 10));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = nn::MaxPool2d({2})(bn->forward(c1->forward(x)).relu());
    return fc->forward(h.flatten(1));
  }
  std::shared_ptr<nn::Conv2d> c1;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Linear> fc;
};

TEST(ExportProgram, CnnWithBatchNormInEvalMatchesEager) {
  auto cnn = std::make_shared<SmallCnn>();
  {  // running statistics that are not the defaults
    autograd::NoGradGuard g;
    cnn->forward(random({8, 1, 8, 8}, kFloat32, -2, 2, 5));
  }
  cnn->eval();
  const std::string bytes = export_program_bytes(
      forward_of(cnn), {random({3, 1, 8, 8}, kFloat32, -1, 1, 6)}, batch_dynamic({"image"}));
  ExportedProgram p = ExportedProgram::from_bytes(bytes, "cnn");
  for (int64_t b : {3, 2, 6}) {
    Tensor x = random({b, 1, 8, 8}, kFloat32, -1, 1, 20 + b);
    expect_close(p.run({x})[0], eager(cnn, x), 1e-5, 1e-6);
  }
  // Static spatial dims: a wrong one names the input and the dim.
  expect_error(ErrorKind::Value,
               "input 'image' dim 2 is 9; the program was exported with the "
               "static size 8",
               [&] {
                 p.run({random({2, 1, 9, 8}, kFloat32, -1, 1, 7)});
               });
  expect_error(ErrorKind::Value, "input 'image' is int64", [&] {
    p.run({zeros({2, 1, 8, 8}, kInt64)});
  });
  expect_error(ErrorKind::Value, "input 'image' has 3 dims", [&] { p.run({zeros({1, 8, 8})}); });
}

TEST(ExportProgram, ABatchNormInTrainingModeIsRefused) {
  auto cnn = std::make_shared<SmallCnn>();
  expect_error(ErrorKind::Value, "call eval() first", [&] {
    export_program_bytes(forward_of(cnn), {random({3, 1, 8, 8}, kFloat32, -1, 1, 6)});
  });
}

// (B, T, C) -> reshape (B*T, C) -> linear -> reshape (B, T, 2), with T dynamic too: sizes that
// are products of two symbols.
TEST(ExportProgram, TwoSymbolsAndTheirProduct) {
  auto lin = std::make_shared<nn::Linear>(6, 2);
  compiler::Fn fn = [lin](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    const int64_t b = x.size(0), t = x.size(1);
    Tensor y = lin->forward(x.reshape({b * t, 6})).reshape({b, t, 2});
    return std::vector<Tensor>{y, in[1] * 2};
  };
  ExportOptions o;
  o.input_names = {"x", "mask"};
  o.output_names = {"y", "mask2"};
  o.dynamic_dims = {{.input = 0, .dim = 0, .name = "B"},
                    {.input = 0, .dim = 1, .name = "T", .min = 2, .max = 16},
                    {.input = 1, .dim = 0, .name = "T"}};
  ExportedProgram p = ExportedProgram::from_bytes(
      export_program_bytes(fn, {random({3, 5, 6}, kFloat32, -1, 1, 1), ones({5})}, o), "bt");
  EXPECT_EQ(p.outputs()[0].dims, (std::vector<std::string>{"B", "T", "2"}));
  EXPECT_EQ(p.inputs()[1].dims, (std::vector<std::string>{"T"}));
  for (auto [b, t] : {std::pair<int64_t, int64_t>{3, 5}, {2, 9}, {7, 2}, {1, 16}}) {
    Tensor x = random({b, t, 6}, kFloat32, -1, 1, b * 100 + t);
    std::vector<Tensor> out = p.run({x, ones({t})});
    expect_close(out[0], fn({x, ones({t})})[0], 1e-6, 1e-6);
    expect_close(out[1], full({t}, 2.0), 0, 0);
  }
  expect_error(ErrorKind::Value, "input 'mask' dim 0 is 4; the program needs T = 5", [&] {
    p.run({random({3, 5, 6}, kFloat32, -1, 1, 1), ones({4})});
  });
  expect_error(ErrorKind::Value, "outside the range [2, 16]", [&] {
    p.run({random({3, 17, 6}, kFloat32, -1, 1, 1), ones({17})});
  });
}

TEST(ExportProgram, WhatCannotStaySymbolicIsRefused) {
  ExportOptions o = batch_dynamic({"x"});
  // A branch on the size records another program.
  expect_error(ErrorKind::Value, "records a different program", [&] {
    export_program_bytes(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0].size(0) > 4 ? in[0].exp() : in[0].sin()};
        },
        {random({4, 3}, kFloat32, -1, 1, 1)}, o);
  });
  // The first half of the rows: B // 2 is no polynomial of B.
  expect_error(ErrorKind::Value, "in a way an exported program cannot express", [&] {
    export_program_bytes(
        [](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{in[0].narrow(0, 0, in[0].size(0) / 2)};
        },
        {random({4, 3}, kFloat32, -1, 1, 1)}, o);
  });
  expect_error(ErrorKind::Value, "example size 1", [&] {
    export_program_bytes([](const std::vector<Tensor>& in) { return in; },
                         {random({1, 3}, kFloat32, -1, 1, 1)}, o);
  });
}

class ExportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mlp = make_mlp();
    mlp->eval();
    bytes = export_program_bytes(forward_of(mlp), {random({4, 12}, kFloat32, -1, 1, 1)},
                                 batch_dynamic({"x"}));
  }
  std::shared_ptr<nn::Sequential> mlp;
  std::string bytes;
};

TEST_F(ExportFileTest, TruncatedAlteredOrForeignFilesAreRefused) {
  EXPECT_NO_THROW(ExportedProgram::from_bytes(bytes, "whole"));
  expect_error(ErrorKind::Value, "cut: truncated: the header declares", [&] {
    ExportedProgram::from_bytes(std::string_view(bytes).substr(0, bytes.size() - 10), "cut");
  });
  expect_error(ErrorKind::Value, "shorter than the 64-byte header",
               [&] { ExportedProgram::from_bytes(bytes.substr(0, 20), "stub"); });
  expect_error(ErrorKind::Value, "unexpected bytes after",
               [&] { ExportedProgram::from_bytes(bytes + "xx", "long"); });
  for (size_t at : {size_t{80}, bytes.size() / 2, bytes.size() - 1}) {
    std::string altered = bytes;
    altered[at] = static_cast<char>(altered[at] ^ 0x01);
    expect_error(ErrorKind::Value, "altered: the checksum (SHA-256)",
                 [&] { ExportedProgram::from_bytes(altered, "altered"); });
  }
  std::string foreign = bytes;
  foreign[0] = 'X';
  expect_error(ErrorKind::Value, "not a Kiln exported program",
               [&] { ExportedProgram::from_bytes(foreign, "foreign"); });
  // Through a file too.
  const std::string path = tmp_path("cut");
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_error(ErrorKind::Value, path + ": truncated", [&] { ExportedProgram::load(path); });
  std::filesystem::remove(path);
  expect_error(ErrorKind::Value, "cannot open", [&] { ExportedProgram::load(path); });
}

TEST_F(ExportFileTest, AnOpThisBuildLacksIsRefusedAtLoad) {
  const exporting::Parts parts = exporting::unpack(bytes, "mlp");
  proto::ExportedProgram m;
  ASSERT_TRUE(m.ParseFromArray(parts.program.data(), static_cast<int>(parts.program.size())));
  ASSERT_GT(m.graph().nodes_size(), 1);
  m.mutable_graph()->mutable_nodes(1)->set_op("gelu_from_the_future");
  const std::string forged = exporting::pack(m.SerializeAsString(), parts.weights);
  expect_error(ErrorKind::Value, "uses ops this build of Kiln lacks: 'gelu_from_the_future'",
               [&] { ExportedProgram::from_bytes(forged, "future"); });
  // A symbolic integer pointing nowhere is refused at load too.
  proto::ExportedProgram bad;
  ASSERT_TRUE(bad.ParseFromArray(parts.program.data(), static_cast<int>(parts.program.size())));
  ASSERT_GT(bad.symbolic_size(), 0);
  bad.mutable_symbolic(0)->set_path(0, 99);
  expect_error(ErrorKind::Value, "symbolic integer", [&] {
    ExportedProgram::from_bytes(exporting::pack(bad.SerializeAsString(), parts.weights), "bad");
  });
}

}  // namespace
}  // namespace kiln::testing
