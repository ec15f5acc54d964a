// kiln/quantization.h: static post-training int8 quantization of an exported program (the role
// of torch.ao.quantization's prepare_pt2e / convert_pt2e): observers, calibration, folding of
// conv/linear + per-channel affine (bias, eval-mode batch norm) + ReLU, int8 conv and linear.
//
//   kiln::ExportedProgram fp = kiln::ExportedProgram::load("cnn.kprog");
//   kiln::quantization::Calibrator c(fp);           // finds the layers (ValueError: none)
//   for (const kiln::Tensor& x : calibration_batches) c.observe({x});
//   std::string file = c.convert();                 // an exported program file, int8 inside
//   kiln::ExportedProgram q = kiln::ExportedProgram::from_bytes(file);
//   for (const auto& e : c.error_report({x})) std::cout << e.layer << " " << e.sqnr_db << "\n";
//
// Note [Post-training quantization]: the pass reads the program's graph at its example sizes.
// - Layers: a `convolution` (2-d, not transposed) or an `addmm`/`mm` whose weight is constant
//   (computed from the program's weights alone), then any chain of add/sub/mul/div by constants
//   that are per output channel (a conv's bias, an eval-mode batch norm's decomposition) and of
//   views to the same sizes (linear's reshape), then an optional relu; each value inside the
//   chain has one use. The chain folds into the weight and bias: a * op(x, W) + b =
//   op(x, a * W) + b, per channel.
// - Scheme: weights int8, symmetric per output channel (quantize_weight_per_channel);
//   activations uint8, asymmetric per tensor, from the min and max observed over calibration
//   (always including 0), as PyTorch's MinMaxObserver with quint8.
// - Rewrite: each layer becomes one linear_int8 / conv2d_int8 (relu fused), which reads uint8:
//   a quantize_per_tensor where its input is float, nothing where the input is another layer's
//   output or a view of one (views run on the uint8 tensor). A float consumer reads a layer's
//   output through dequantize_per_tensor. Weights the layers folded away leave the file; the new
//   ones are `<layer>.weight_int8`, `<layer>.weight_scale` and `<layer>.bias_folded`.
// - Symbolic dims survive: the graph is rebuilt node by node and every symbolic integer's path
//   is renumbered; a layer whose own nodes hold symbolic integers stays float.
// - The error report runs both programs on the same inputs and compares, per layer, the float
//   program's value at the layer's output with the quantized one, dequantized.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/exported_program.h"

namespace kiln::quantization {

struct LayerError {
  std::string layer;  // its weight's name without ".weight" ("features.0")
  std::string op;     // "conv2d_int8", "linear_int8"
  double max_abs = 0;
  double mean_abs = 0;
  double sqnr_db = 0;  // 10 log10(sum ref^2 / sum err^2); 300 when the error is 0
};

class Calibrator {
 public:
  // ValueError when the program has no layer to quantize.
  explicit Calibrator(const ExportedProgram& program);
  ~Calibrator();
  Calibrator(Calibrator&&) noexcept;

  // Runs the float program on `inputs` (as ExportedProgram::run takes them) and widens the
  // observed range of every floating value; returns the outputs. A NaN or infinite value is a
  // ValueError naming the node that made it.
  std::vector<Tensor> observe(const std::vector<Tensor>& inputs);
  int64_t batches_observed() const;
  // One line per layer: "conv2d features.0: convolution + add + sub + mul + mul + add + relu".
  std::vector<std::string> layers() const;
  // The quantized program's file (Note [Exported program file]); ValueError before observe().
  std::string convert() const;
  // Per layer, the quantized program against the float one on `inputs`.
  std::vector<LayerError> error_report(const std::vector<Tensor>& inputs) const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kiln::quantization
