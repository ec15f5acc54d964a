// client/export/src/file_format.h: the container of an exported program file, a checksummed
// header before the program and its weights (See Note [Exported program file] in
// kiln/exported_program.h).
//
//   std::string file = kiln::exporting::pack(program_bytes, safetensors_bytes);
//   kiln::exporting::Parts p = kiln::exporting::unpack(file, "model.kprog");  // or ValueError
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/meta.h"
#include "kiln/tensor.h"

namespace kiln::exporting {

constexpr std::string_view kMagic = "KILNPROG";
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 64;

std::string pack(std::string_view program, std::string_view weights);

struct Parts {
  std::string_view program;  // ExportedProgram message bytes
  std::string_view weights;  // safetensors bytes
};
// The two parts of `file`, views into it. ValueError naming `what` for a file that is not one,
// of another version, truncated or with bytes after the end, or whose checksum does not match.
Parts unpack(std::string_view file, const std::string& what);

// Weight `name` as a graph input of geometry `spec` reads it: `stored`, or a view into it where
// it was stored as its whole storage (Note [Exported programs]); ValueError naming `what`.
Tensor weight_for(const std::string& what, const std::string& name, const Tensor& stored,
                  const TensorSpec& spec);

}  // namespace kiln::exporting
