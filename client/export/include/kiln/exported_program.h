// kiln/exported_program.h: a function exported for inference as one self-contained file (the
// program as protobuf, its weights as safetensors, no code), and kiln::ExportedProgram, which
// loads such a file and runs it with no Python and no caller's code (kiln-run-program uses it).
//
//   kiln::ExportOptions o;
//   o.input_names = {"x"};
//   o.dynamic_dims = {{.input = 0, .dim = 0, .name = "batch"}};
//   kiln::export_program("mlp.kprog", [&](auto& in) { return std::vector{model->forward(in[0])}; },
//                        {kiln::randn({4, 32})}, o);
//   kiln::ExportedProgram p = kiln::ExportedProgram::load("mlp.kprog");  // checks every op here
//   std::vector<kiln::Tensor> y = p.run({kiln::randn({7, 32})});         // any batch size
//
// Note [Exported programs]: export_program captures the function under no_grad with
// compiler::export_step (See Note [Exported steps] in kiln/compiler/export.h): the graph as
// recorded, whose inputs are the arguments, the tensors it read (weights: a module's parameters
// and buffers, stored by name in the file) and wrapped numbers (held by the graph). A function
// that writes into an input or a weight (a BatchNorm in training mode: call eval() first) is
// refused, as is one whose outputs are not tensors. A weight is stored contiguous; one the graph
// reads as a view (an offset, other strides) is stored as its whole storage, flat, and rebuilt
// with a bounds-checked as_strided at load.
//
// Symbolic dims: the graph holds no symbols, so it is captured several times, and every integer
// that moves with the dims is recorded as a polynomial of them (Note [Symbolic dims by
// differences]). A run binds each symbol from its input's size, substitutes every recorded
// integer into the stored graph and rebuilds it through ir::Graph::add_node, so every op's meta
// function checks the new shapes again before anything runs (instantiations are cached by the
// symbols' values).
//
// Note [Symbolic dims by differences]: with symbols d_1..d_k at example sizes v, the function
// is captured at v, at v with d_i moved alone (k captures), and with each pair d_i, d_j moved
// together (k(k-1)/2). The captures must record the same ops with the same arguments; only
// integers (input sizes, strides and offsets, int and int-list attributes, integer Scalars) may
// differ. Each integer x is fitted as c + sum a_i d_i + sum b_ij d_i d_j (the product terms
// cover a reshape to B*T rows) from those captures by finite differences, with integer
// coefficients; one more capture with every d_i moved again checks every fit. A float that
// moves, a structure that changes (a Python branch on a size), or an integer that is not such a
// polynomial (T // 2, T * T) is refused, naming the integer and the sizes tried. A dim needs an
// example of at least 2 (sizes 0 and 1 specialize, as in torch.export) and room in [min, max]
// for two other sizes, tried in the order v+1, v-1, v+2, v-2, ...
//
// Note [Exported program file]: little-endian, 64-byte header, then the payload:
//   [0, 8)   magic "KILNPROG"
//   [8, 12)  format version (1); [12, 16) zero
//   [16, 24) P: bytes of the program (kiln.proto.ExportedProgram, program.proto)
//   [24, 32) W: bytes of the weights (safetensors)
//   [32, 64) SHA-256 of the payload, bytes [64, 64 + P + W)
// The reader checks the magic, the version, that the file holds exactly 64 + P + W bytes
// (truncated or trailing bytes), the checksum, then parses both parts and rebuilds the graph:
// each problem is a ValueError naming the file and what is wrong, and nothing runs before all of
// it passed, so an op this build lacks is refused at load, not halfway through a run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/compiler/compile.h"
#include "kiln/ir.h"
#include "kiln/safetensors.h"
#include "kiln/tensor.h"

namespace kiln {

// Dim `dim` of example argument `input` is symbolic, named `name`; dims that share a name must
// have the same size. `max` 0: unbounded.
struct DynamicDim {
  size_t input = 0;
  int64_t dim = 0;
  std::string name;
  int64_t min = 1;
  int64_t max = 0;
};

struct ExportOptions {
  std::vector<std::string> input_names;   // per argument; default "input0", "input1", ...
  std::vector<std::string> output_names;  // per output; default "output0", ...
  std::vector<DynamicDim> dynamic_dims;
  // Names for the tensors the function reads (a module's named_parameters and named_buffers),
  // matched by identity, or else as a view of the same storage and geometry; any other tensor
  // read is stored as "weight<k>".
  std::vector<std::pair<std::string, Tensor>> weight_names;
};

// Captures fn (Note [Exported programs]) and returns the file's bytes; ValueError or
// NotImplementedError naming what cannot be exported. fn runs several times, under no_grad.
std::string export_program_bytes(const compiler::Fn& fn, const std::vector<Tensor>& example_args,
                                 const ExportOptions& options = {});
// The same, written to `path` (through a temporary file renamed into place).
void export_program(const std::string& path, const compiler::Fn& fn,
                    const std::vector<Tensor>& example_args, const ExportOptions& options = {});

class ExportedProgram {
 public:
  // One argument or output: its name, dtype and sizes, a symbolic dim as its name ("batch"), a
  // size that depends on symbols as an expression ("2*batch + 1"), a static one as its number.
  struct Port {
    std::string name;
    ScalarType dtype = kFloat32;
    std::vector<std::string> dims;
  };

  // ValueError naming `path` and the problem (Note [Exported program file]).
  static ExportedProgram load(const std::string& path);
  static ExportedProgram from_bytes(std::string_view bytes, const std::string& what = "<bytes>");
  ExportedProgram(ExportedProgram&&) noexcept;
  ExportedProgram& operator=(ExportedProgram&&) noexcept;
  ~ExportedProgram();

  const std::vector<Port>& inputs() const;
  const std::vector<Port>& outputs() const;
  const TensorMap& weights() const;
  // Inputs, outputs, symbols, weights (count and bytes) and ops (name x count), for people.
  std::string describe() const;
  // Runs the program under no_grad on one tensor per input (CPU, any layout). ValueError naming
  // the input and dim for a wrong dtype, rank or static size, a symbol out of its range or bound
  // to two sizes; the meta functions then check everything else.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const;
  // As run, calling on_node(i, outputs) after node i of the file's graph ran (the graph's
  // nodes in file order, whatever the symbols): what calibration observes.
  std::vector<Tensor> run_observed(const std::vector<Tensor>& inputs,
                                   const ir::NodeObserver& on_node) const;
  // The file's bytes as loaded (kiln::quantization rewrites them).
  const std::string& bytes() const;
  // By name: every input, no other name; outputs by name.
  TensorMap run_named(const TensorMap& inputs) const;

 private:
  struct State;
  explicit ExportedProgram(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace kiln
