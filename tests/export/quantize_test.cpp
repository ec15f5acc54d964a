// kiln::quantization (kiln/quantization.h): static int8 quantization of exported programs. A CNN
// with conv + batch norm + relu and an MLP are calibrated, converted and run from the new file at
// other batch sizes against the float program; the folded weights leave the file; the per-layer
// report; refusals (no layer, convert before calibration, NaN while calibrating).
#include <gtest/gtest.h>

#include <cmath>

#include "export_util.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/nn/nn.h"
#include "kiln/quantization.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using quantization::Calibrator;

class Cnn : public nn::Module {
 public:
  Cnn() : Module("Cnn") {
    c1 = register_module("c1", std::make_shared<nn::Conv2d>(1, 8, std::vector<int64_t>{3},
                                                            nn::ConvArgs{.padding = {1}}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(8));
    c2 = register_module("c2", std::make_shared<nn::Conv2d>(8, 16, std::vector<int64_t>{3},
                                                            nn::ConvArgs{.padding = {1}}));
    fc = register_module("fc", std::make_shared<nn::Linear>(16 * 4 * 4, 10));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = nn::MaxPool2d({2})(bn->forward(c1->forward(x)).relu());
    return fc->forward(c2->forward(h).relu().flatten(1));
  }
  std::shared_ptr<nn::Conv2d> c1, c2;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Linear> fc;
};

ExportedProgram export_module(const nn::ModulePtr& m, const Tensor& example) {
  return ExportedProgram::from_bytes(
      export_program_bytes(forward_of(m), {example}, batch_dynamic({"x"}, m)), "float");
}

// 10 log10(|ref|^2 / |got - ref|^2).
double sqnr_db(const Tensor& got, const Tensor& ref) {
  const Tensor err = got.to(kFloat64) - ref.to(kFloat64);
  return 10 * std::log10((ref.to(kFloat64) * ref.to(kFloat64)).sum().item<double>() /
                         (err * err).sum().item<double>());
}

TEST(Quantize, CnnWithBatchNormIsFoldedAndTracksTheFloatProgram) {
  auto cnn = std::make_shared<Cnn>();
  {  // running statistics that are not the defaults
    autograd::NoGradGuard g;
    cnn->forward(random({16, 1, 8, 8}, kFloat32, -2, 2, 5));
  }
  cnn->eval();
  ExportedProgram fp = export_module(cnn, random({3, 1, 8, 8}, kFloat32, -1, 1, 6));
  Calibrator c(fp);
  const std::vector<std::string> layers = c.layers();
  ASSERT_EQ(layers.size(), 3u);
  // c1 absorbs the batch norm's per-channel ops and the relu; c2 its bias and relu.
  EXPECT_EQ(layers[0].rfind("conv2d c1: convolution + add", 0), 0u) << layers[0];
  EXPECT_NE(layers[0].find("mul"), std::string::npos) << layers[0];
  EXPECT_TRUE(layers[0].ends_with("+ relu")) << layers[0];
  EXPECT_EQ(layers[1], "conv2d c2: convolution + add + relu");
  EXPECT_EQ(layers[2].rfind("linear fc: ", 0), 0u) << layers[2];
  expect_error(ErrorKind::Value, "convert before any calibration", [&] { c.convert(); });
  for (int k = 0; k < 8; ++k) c.observe({random({32, 1, 8, 8}, kFloat32, -1, 1, 100 + k)});
  EXPECT_EQ(c.batches_observed(), 8);
  ExportedProgram q = ExportedProgram::from_bytes(c.convert(), "int8");
  const std::string d = q.describe();
  EXPECT_NE(d.find("conv2d_int8 x2"), std::string::npos) << d;
  EXPECT_NE(d.find("linear_int8 x1"), std::string::npos) << d;
  EXPECT_EQ(d.find("convolution"), std::string::npos) << d;
  EXPECT_EQ(d.find("addmm"), std::string::npos) << d;
  // The float weights the layers folded away are gone; the batch is still symbolic.
  for (const char* gone : {"c1.weight", "c1.bias", "bn.running_mean", "bn.weight", "fc.weight"})
    EXPECT_EQ(q.weights().count(gone), 0u) << gone;
  EXPECT_EQ(q.weights().at("c1.weight_int8").dtype(), kInt8);
  EXPECT_EQ(q.inputs()[0].dims[0], "batch");
  for (int64_t b : {1, 5, 32}) {
    const Tensor x = random({b, 1, 8, 8}, kFloat32, -1, 1, 200 + b);
    const Tensor ref = fp.run({x})[0], got = q.run({x})[0];
    ASSERT_EQ(got.sizes(), ref.sizes());
    EXPECT_GT(sqnr_db(got, ref), 25) << "batch " << b;
  }
  const auto report = c.error_report({random({8, 1, 8, 8}, kFloat32, -1, 1, 300)});
  ASSERT_EQ(report.size(), 3u);
  EXPECT_EQ(report[0].layer, "c1");
  EXPECT_EQ(report[0].op, "conv2d_int8");
  EXPECT_EQ(report[2].layer, "fc");
  for (const auto& e : report) {
    EXPECT_GT(e.sqnr_db, 20) << e.layer;
    EXPECT_GT(e.max_abs, 0) << e.layer;
    EXPECT_LE(e.mean_abs, e.max_abs) << e.layer;
  }
}

TEST(Quantize, MlpFusesReluAndKeepsTheGeluFloat) {
  auto mlp = std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(12, 64), std::make_shared<nn::ReLU>(),
                                 std::make_shared<nn::Linear>(64, 64), std::make_shared<nn::GELU>(),
                                 std::make_shared<nn::Linear>(64, 5)});
  mlp->eval();
  ExportedProgram fp = export_module(mlp, random({4, 12}, kFloat32, -1, 1, 1));
  Calibrator c(fp);
  const std::vector<std::string> layers = c.layers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_EQ(layers[0], "linear 0: addmm + relu");
  EXPECT_EQ(layers[1], "linear 2: addmm");
  for (int k = 0; k < 4; ++k) c.observe({random({64, 12}, kFloat32, -1, 1, 10 + k)});
  ExportedProgram q = ExportedProgram::from_bytes(c.convert(), "int8");
  const std::string d = q.describe();
  // Layer 2's output goes through the GELU as float and is quantized again for layer 4.
  EXPECT_NE(d.find("dequantize_per_tensor x2"), std::string::npos) << d;
  EXPECT_NE(d.find("quantize_per_tensor x2"), std::string::npos) << d;
  const Tensor x = random({9, 12}, kFloat32, -1, 1, 50);
  EXPECT_GT(sqnr_db(q.run({x})[0], fp.run({x})[0]), 25);
}

TEST(Quantize, Refusals) {
  auto fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2 + 1}; };
  ExportedProgram plain = ExportedProgram::from_bytes(
      export_program_bytes(fn, {random({3, 4}, kFloat32, -1, 1, 1)}), "plain");
  expect_error(ErrorKind::Value, "no layer to quantize", [&] { Calibrator c(plain); });

  auto lin = std::make_shared<nn::Linear>(4, 3);
  ExportedProgram fp = export_module(lin, random({2, 4}, kFloat32, -1, 1, 2));
  Calibrator c(fp);
  const Tensor bad = random({2, 4}, kFloat32, -1, 1, 3) / zeros({2, 4});  // infinities
  expect_error(ErrorKind::Value, "NaN or infinite", [&] { c.observe({bad}); });
  EXPECT_EQ(c.batches_observed(), 0);  // the failed batch left no range behind
  expect_error(ErrorKind::Value, "input 'x' is int64", [&] { c.observe({zeros({2, 4}, kInt64)}); });
  c.observe({random({2, 4}, kFloat32, -1, 1, 4)});
  EXPECT_NO_THROW(ExportedProgram::from_bytes(c.convert(), "int8"));
}

}  // namespace
}  // namespace kiln::testing
