// kiln-run-program: loads an exported program (kiln.export, kiln/exported_program.h) and runs it,
// with no Python and none of the exporter's code.
//
//   kiln-run-program model.kprog --describe
//   kiln-run-program model.kprog --inputs in.safetensors --outputs out.safetensors
//
// The inputs file holds one tensor per program input, by name; the outputs file gets one per
// output, by name. Without --outputs, each output's name, dtype and shape is printed. Exit
// status: 0 done, 1 the program or its inputs were refused (the reason on stderr), 2 usage.
#include <cstring>
#include <iostream>
#include <string>

#include "kiln/exported_program.h"
#include "kiln/safetensors.h"
#include "kiln/scalar_type.h"

namespace {

constexpr const char* kUsage =
    "usage: kiln-run-program FILE --describe\n"
    "       kiln-run-program FILE --inputs IN.safetensors [--outputs OUT.safetensors]\n";

int usage(const std::string& why) {
  std::cerr << "kiln-run-program: " << why << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, inputs, outputs;
  bool describe = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--describe") {
      describe = true;
    } else if (a == "--inputs" || a == "--outputs") {
      if (i + 1 >= argc) return usage(a + " needs a file");
      (a == "--inputs" ? inputs : outputs) = argv[++i];
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option " + a);
    } else if (file.empty()) {
      file = a;
    } else {
      return usage("one program file only");
    }
  }
  if (file.empty()) return usage("no program file");
  if (!describe && inputs.empty()) return usage("give --describe or --inputs");
  try {
    const kiln::ExportedProgram p = kiln::ExportedProgram::load(file);
    if (describe) std::cout << p.describe();
    if (inputs.empty()) return 0;
    const kiln::TensorMap out = p.run_named(kiln::load_safetensors(inputs).tensors);
    if (!outputs.empty()) {
      kiln::save_safetensors(outputs, out);
      return 0;
    }
    for (const auto& [name, t] : out) {
      std::cout << name << ": " << kiln::scalar_type_name(t.dtype()) << "[";
      for (int64_t d = 0; d < t.dim(); ++d) std::cout << (d ? ", " : "") << t.size(d);
      std::cout << "]\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "kiln-run-program: " << e.what() << "\n";
    return 1;
  }
}
