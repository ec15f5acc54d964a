// kiln/safetensors.h: reading and writing the safetensors format (Hugging Face's), the file format
// of Kiln's weights and checkpoints.
//
//   kiln::TensorMap w = {{"fc.weight", kiln::randn({4, 3})}, {"fc.bias", kiln::zeros({4})}};
//   kiln::save_safetensors("model.safetensors", w, {{"step", "100"}});
//   kiln::SafetensorsData d = kiln::load_safetensors("model.safetensors");
//   kiln::Tensor b = d.tensors.at("fc.bias");          // CPU, contiguous
//   std::string step = d.metadata.at("step");
//
// Note [safetensors format]: a file is an 8-byte little-endian header length N, N bytes of JSON
// (padded with spaces), then the raw little-endian data. The JSON maps each tensor name to
// {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} (offsets into the data) and may
// hold "__metadata__", a map of strings to strings.
//
// Note [safetensors validation]: a file may come from anyone, so the reader trusts nothing
// before it allocates: the header length is at most 100 MB and within the file; the JSON is an
// object of well-formed entries with known dtype names; every shape's element count times the
// item size (overflow-checked) equals its byte span; the spans, sorted by offset, tile the data
// exactly (no overlap, no gap) and end where the file ends. Every violation throws a ValueError
// naming the tensor and the numbers involved; tensors are allocated only after all checks pass,
// so their total never exceeds the file's size.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "kiln/tensor.h"

namespace kiln {

using TensorMap = std::map<std::string, Tensor>;
using StringMap = std::map<std::string, std::string>;

struct SafetensorsData {
  TensorMap tensors;   // CPU, contiguous
  StringMap metadata;  // the header's "__metadata__" (empty if absent)
};

// The largest header the reader accepts (as the reference implementation).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Writes `tensors` (any device and layout; copied to CPU as needed) with `metadata`. Names must
// be non-empty and not "__metadata__". The header is padded to a multiple of 8 bytes, as the
// Python package does. Not atomic: kiln/nn/checkpoint.h builds atomic saves on top.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const StringMap& metadata = {});
SafetensorsData load_safetensors(const std::string& path);

// The same, in memory.
std::string safetensors_to_bytes(const TensorMap& tensors, const StringMap& metadata = {});
SafetensorsData safetensors_from_bytes(std::string_view bytes);

// The safetensors dtype name ("F32", "BF16", ...) of `t`, and back (ValueError for a name that is
// not a safetensors dtype, or one that Kiln has no type for, such as "U16" or "F8_E4M3").
const char* safetensors_dtype_name(ScalarType t);
ScalarType safetensors_dtype_from_name(std::string_view name);

}  // namespace kiln
