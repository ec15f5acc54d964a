// safetensors reading and writing (kiln/safetensors.h). Note [safetensors format] and
// Note [safetensors validation] there say what a file holds and what the reader checks.
#include "kiln/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "kiln/error.h"

namespace kiln {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

namespace {

using json = nlohmann::json;

struct DtypeName {
  const char* name;
  ScalarType type;
};
constexpr DtypeName kDtypeNames[] = {
    {"BOOL", kBool}, {"U8", kUInt8},    {"I8", kInt8},       {"I16", kInt16},   {"I32", kInt32},
    {"I64", kInt64}, {"F16", kFloat16}, {"BF16", kBFloat16}, {"F32", kFloat32}, {"F64", kFloat64}};
// Names the format defines but Kiln has no element type for.
constexpr const char* kUnsupportedDtypeNames[] = {
    "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};

// One tensor of a validated header: its bytes are data[begin, end).
struct Entry {
  std::string name;
  ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

struct Header {
  std::vector<Entry> entries;  // sorted by begin
  StringMap metadata;
};

uint64_t read_u64_le(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// A short description of a header value for an error message. Never the dump of a container:
// a hostile header may nest arrays deeply enough to exhaust the stack of a recursive dump.
std::string brief(const json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " keys";
  std::string s = v.dump();
  return s.size() <= 40 ? s : s.substr(0, 40) + "...";
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t json_u64(const json& v, const std::string& what) {
  KILN_CHECK(v.is_number_unsigned(), Value, "safetensors: ", what,
             " must be a non-negative integer, got ", brief(v));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const json& v, uint64_t data_bytes) {
  const std::string where = "tensor '" + name + "'";
  KILN_CHECK(v.is_object(), Value, "safetensors: ", where, ": expected an object, got ", brief(v));
  for (const auto& [key, _] : v.items())
    KILN_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", Value,
               "safetensors: ", where, ": unexpected key '", key,
               "' (expected dtype, shape, data_offsets)");
  KILN_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"), Value,
             "safetensors: ", where, ": needs dtype, shape and data_offsets");
  const json& dtype = v["dtype"];
  KILN_CHECK(dtype.is_string(), Value, "safetensors: ", where, ": dtype must be a string, got ",
             brief(dtype));
  Entry e{name, kFloat32, {}, 0, 0};
  try {
    e.dtype = safetensors_dtype_from_name(dtype.get<std::string>());
  } catch (const Error& err) {
    KILN_FAIL(Value, err.what(), " (", where, ")");
  }

  const json& shape = v["shape"];
  KILN_CHECK(shape.is_array(), Value, "safetensors: ", where, ": shape must be an array, got ",
             brief(shape));
  check_dims(static_cast<int64_t>(shape.size()), ("safetensors: " + where).c_str());
  uint64_t numel = 1;
  for (const json& d : shape) {
    uint64_t n = json_u64(d, where + " shape entry");
    KILN_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), Value,
               "safetensors: ", where, ": dimension ", n, " is too large");
    e.shape.push_back(static_cast<int64_t>(n));
    KILN_CHECK(!__builtin_mul_overflow(numel, n, &numel), Value, "safetensors: ", where,
               ": the element count of shape ", shape_str(e.shape), "... overflows 64 bits");
  }
  uint64_t nbytes;
  KILN_CHECK(!__builtin_mul_overflow(numel, element_size(e.dtype), &nbytes), Value,
             "safetensors: ", where, ": the byte size of shape ", shape_str(e.shape),
             " overflows 64 bits");

  const json& offsets = v["data_offsets"];
  KILN_CHECK(offsets.is_array() && offsets.size() == 2, Value, "safetensors: ", where,
             ": data_offsets must be [begin, end], got ", brief(offsets));
  e.begin = json_u64(offsets[0], where + " data_offsets[0]");
  e.end = json_u64(offsets[1], where + " data_offsets[1]");
  KILN_CHECK(e.begin <= e.end, Value, "safetensors: ", where, ": data_offsets [", e.begin, ", ",
             e.end, "] end before they begin");
  KILN_CHECK(e.end <= data_bytes, Value, "safetensors: ", where, ": data_offsets [", e.begin, ", ",
             e.end, "] reach past the data section, which holds ", data_bytes,
             " bytes (truncated file?)");
  KILN_CHECK(e.end - e.begin == nbytes, Value, "safetensors: ", where, ": shape ",
             shape_str(e.shape), " of ", dtype.get<std::string>(), " needs ", nbytes,
             " bytes, but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
  return e;
}

// Parses and checks the JSON header of a file whose data section holds `data_bytes` bytes.
Header parse_header(std::string_view text, uint64_t data_bytes) {
  KILN_CHECK(!text.empty() && text[0] == '{', Value,
             "safetensors: the header must be a JSON object starting with '{'");
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& err) {
    KILN_FAIL(Value, "safetensors: the header is not valid JSON: ", err.what());
  }
  KILN_CHECK(doc.is_object(), Value, "safetensors: the header must be a JSON object");

  Header h;
  for (const auto& [name, v] : doc.items()) {
    if (name == "__metadata__") {
      KILN_CHECK(v.is_object(), Value,
                 "safetensors: __metadata__ must be an object of strings, got ", brief(v));
      for (const auto& [key, value] : v.items()) {
        KILN_CHECK(value.is_string(), Value, "safetensors: __metadata__ value of '", key,
                   "' must be a string, got ", brief(value));
        h.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    h.entries.push_back(parse_entry(name, v, data_bytes));
  }

  // The spans, in offset order, must tile the data section: no overlap, no gap, no trailing bytes.
  std::sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Entry& e : h.entries) {
    KILN_CHECK(e.begin >= covered, Value, "safetensors: tensor '", e.name, "' (bytes [", e.begin,
               ", ", e.end, ")) overlaps tensor '", *previous, "' (which ends at ", covered, ")");
    KILN_CHECK(e.begin == covered, Value, "safetensors: a gap of unclaimed bytes [", covered, ", ",
               e.begin, ") lies before tensor '", e.name, "'");
    covered = e.end;
    previous = &e.name;
  }
  KILN_CHECK(covered == data_bytes, Value, "safetensors: the data section holds ", data_bytes,
             " bytes but the tensors cover ", covered, " (trailing bytes)");
  return h;
}

// Allocates the tensors of `h` and fills each through read(offset, dst, n).
template <typename ReadAt>
SafetensorsData materialize(Header h, ReadAt read) {
  SafetensorsData out;
  out.metadata = std::move(h.metadata);
  for (const Entry& e : h.entries) {
    Tensor t = empty_on(e.shape, e.dtype, kCPU);
    if (e.end > e.begin) read(e.begin, static_cast<char*>(t.data_ptr()), e.end - e.begin);
    if (e.dtype == kBool) {
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      KILN_CHECK(std::all_of(p, p + (e.end - e.begin), [](uint8_t b) { return b <= 1; }), Value,
                 "safetensors: BOOL tensor '", e.name, "' holds a byte other than 0 or 1");
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

// A tensor to write: its CPU contiguous data and its span in the data section.
struct Planned {
  Tensor data;
  uint64_t begin, end;
};

// The length prefix and padded header of `tensors`, and what to write after it, in order.
std::string plan(const TensorMap& tensors, const StringMap& metadata, std::vector<Planned>& order) {
  json doc = json::object();
  if (!metadata.empty()) doc["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(!name.empty() && name != "__metadata__", Value,
               "save_safetensors: invalid tensor name '", name, "'");
    KILN_CHECK(t.defined(), Value, "save_safetensors: tensor '", name, "' is undefined");
    KILN_CHECK(!t.is_meta(), Value, "save_safetensors: tensor '", name,
               "' is on the meta device and has no data");
    Tensor c = t.device().type() == DeviceType::CPU ? t : t.to(std::nullopt, Device(kCPU));
    c = c.contiguous();
    uint64_t nbytes = c.nbytes();
    json shape = json::array();
    for (int64_t d : c.sizes()) shape.push_back(d);
    doc[name] = {{"dtype", safetensors_dtype_name(c.dtype())},
                 {"shape", std::move(shape)},
                 {"data_offsets", {offset, offset + nbytes}}};
    order.push_back({std::move(c), offset, offset + nbytes});
    offset += nbytes;
  }
  std::string header;
  try {
    header = doc.dump();
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "save_safetensors: tensor names and metadata must be UTF-8: ", e.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  uint64_t n = header.size();
  char prefix[8];
  std::memcpy(prefix, &n, 8);
  return std::string(prefix, 8) + header;
}

}  // namespace

const char* safetensors_dtype_name(ScalarType t) {
  for (const DtypeName& d : kDtypeNames)
    if (d.type == t) return d.name;
  KILN_FAIL(Value, "safetensors: no dtype name for ", t);
}

ScalarType safetensors_dtype_from_name(std::string_view name) {
  for (const DtypeName& d : kDtypeNames)
    if (name == d.name) return d.type;
  for (const char* n : kUnsupportedDtypeNames)
    KILN_CHECK(name != n, Value, "safetensors: dtype ", name, " is not supported by Kiln");
  KILN_FAIL(Value, "safetensors: unknown dtype '", name, "'");
}

std::string safetensors_to_bytes(const TensorMap& tensors, const StringMap& metadata) {
  std::vector<Planned> order;
  std::string out = plan(tensors, metadata, order);
  for (const Planned& p : order)
    out.append(static_cast<const char*>(p.data.data_ptr()), p.end - p.begin);
  return out;
}

SafetensorsData safetensors_from_bytes(std::string_view bytes) {
  KILN_CHECK(bytes.size() >= 8, Value, "safetensors: ", bytes.size(),
             " bytes are too few for the 8-byte header length");
  uint64_t n = read_u64_le(bytes.data());
  KILN_CHECK(n <= kSafetensorsMaxHeaderBytes && n <= bytes.size() - 8, Value,
             "safetensors: header length ", n, " exceeds the ", bytes.size() - 8,
             " bytes that follow it (limit ", kSafetensorsMaxHeaderBytes, ")");
  std::string_view data = bytes.substr(8 + n);
  return materialize(
      parse_header(bytes.substr(8, n), data.size()),
      [&](uint64_t off, char* dst, uint64_t len) { std::memcpy(dst, data.data() + off, len); });
}

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const StringMap& metadata) {
  std::vector<Planned> order;
  std::string header = plan(tensors, metadata, order);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KILN_CHECK(f.is_open(), Runtime, "save_safetensors: cannot open '", path,
             "' for writing: ", std::strerror(errno));
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const Planned& p : order)
    f.write(static_cast<const char*>(p.data.data_ptr()),
            static_cast<std::streamsize>(p.end - p.begin));
  f.close();
  KILN_CHECK(!f.fail(), Runtime, "save_safetensors: writing '", path,
             "' failed: ", std::strerror(errno));
}

SafetensorsData load_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  KILN_CHECK(f.is_open(), Runtime, "load_safetensors: cannot open '", path,
             "': ", std::strerror(errno));
  const uint64_t size = static_cast<uint64_t>(f.tellg());
  auto read_at = [&](uint64_t off, char* dst, uint64_t len) {
    f.seekg(static_cast<std::streamoff>(off));
    f.read(dst, static_cast<std::streamsize>(len));
    KILN_CHECK(f.good(), Runtime, "load_safetensors: reading ", len, " bytes at offset ", off,
               " of '", path, "' failed");
  };
  try {
    KILN_CHECK(size >= 8, Value, "safetensors: the file is ", size,
               " bytes, too few for the 8-byte header length");
    char prefix[8];
    read_at(0, prefix, 8);
    uint64_t n = read_u64_le(prefix);
    KILN_CHECK(n <= kSafetensorsMaxHeaderBytes && n <= size - 8, Value,
               "safetensors: header length ", n, " exceeds the ", size - 8,
               " bytes that follow it (limit ", kSafetensorsMaxHeaderBytes, ")");
    std::string text(n, '\0');
    read_at(8, text.data(), n);
    return materialize(
        parse_header(text, size - 8 - n),
        [&](uint64_t off, char* dst, uint64_t len) { read_at(8 + n + off, dst, len); });
  } catch (const Error& e) {
    detail::throw_error(e.kind(), detail::str_cat(e.what(), " (in '", path, "')"));
  }
}

}  // namespace kiln
