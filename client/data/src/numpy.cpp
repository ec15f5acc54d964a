// kiln::data .npy/.npz readers. Formats: NumPy's NEP 1 (.npy) and the ZIP application note
// (.npz is a stored ZIP of .npy members; np.savez writes them with ZIP64 extra fields).
#include "kiln/data/numpy.h"

#include <cstring>
#include <string_view>

#include "mapped_file.h"

namespace kiln::data {
namespace {

using detail::MappedFile;

uint64_t le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

ScalarType npy_dtype(const std::string& where, const std::string& descr) {
  static const std::pair<const char*, ScalarType> kTypes[] = {
      {"b1", kBool},  {"u1", kUInt8},   {"i1", kInt8},    {"i2", kInt16},  {"i4", kInt32},
      {"i8", kInt64}, {"f2", kFloat16}, {"f4", kFloat32}, {"f8", kFloat64}};
  if (descr.size() == 3 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=' ||
                            (descr[0] == '>' && descr[2] == '1')))
    for (const auto& [code, type] : kTypes)
      if (descr.compare(1, 2, code) == 0) return type;
  KILN_FAIL(Value, where, ": unsupported dtype '", descr,
            "' (Kiln reads b1, u1, i1, i2, i4, i8, f2, f4, f8, little-endian)");
}

// The header dict, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }.
struct Header {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
};

Header parse_header(const std::string& where, std::string_view h) {
  auto bad = [&](const char* what) {
    KILN_FAIL(Value, where, ": malformed .npy header (", what, "): ", h);
  };
  auto value_of = [&](const char* key) {
    size_t k = h.find(std::string("'") + key + "'");
    if (k == std::string_view::npos) bad(key);
    size_t colon = h.find(':', k);
    if (colon == std::string_view::npos) bad(key);
    size_t v = h.find_first_not_of(' ', colon + 1);
    if (v == std::string_view::npos) bad(key);
    return v;
  };
  Header out;
  size_t d = value_of("descr");
  if (h[d] != '\'') KILN_FAIL(Value, where, ": unsupported dtype (structured or object): ", h);
  size_t d_end = h.find('\'', d + 1);
  if (d_end == std::string_view::npos) bad("descr");
  out.descr = std::string(h.substr(d + 1, d_end - d - 1));
  size_t f = value_of("fortran_order");
  if (h.substr(f, 4) == "True")
    out.fortran = true;
  else if (h.substr(f, 5) != "False")
    bad("fortran_order");
  size_t s = value_of("shape");
  if (h[s] != '(') bad("shape");
  size_t s_end = h.find(')', s);
  if (s_end == std::string_view::npos) bad("shape");
  std::string_view dims = h.substr(s + 1, s_end - s - 1);
  size_t i = 0;
  while (true) {
    i = dims.find_first_not_of(' ', i);
    if (i == std::string_view::npos) break;
    int64_t v = 0;
    size_t start = i;
    for (; i < dims.size() && dims[i] >= '0' && dims[i] <= '9'; ++i) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, dims[i] - '0', &v))
        bad("shape overflows int64");
    }
    if (i == start) bad("shape");
    out.shape.push_back(v);
    i = dims.find_first_not_of(' ', i);
    if (i == std::string_view::npos) break;
    if (dims[i] != ',') bad("shape");
    ++i;
  }
  return out;
}

// The array stored in bytes [begin, begin + size) of `file` (all of a .npy, one .npz member).
Tensor read_npy(const std::shared_ptr<const MappedFile>& file, uint64_t begin, uint64_t size,
                const std::string& where) {
  const uint8_t* p = file->data() + begin;
  KILN_CHECK(size >= 10 && std::memcmp(p, "\x93NUMPY", 6) == 0, Value, where,
             ": not a .npy file (the magic string \\x93NUMPY is missing)");
  const int major = p[6];
  KILN_CHECK(major >= 1 && major <= 3, Value, where, ": unsupported .npy format version ", major,
             ".", int(p[7]), " (Kiln reads 1.0, 2.0 and 3.0)");
  const uint64_t len_bytes = major == 1 ? 2 : 4;
  KILN_CHECK(size >= 8 + len_bytes, Value, where, ": truncated .npy header");
  const uint64_t header_len = le(p + 8, static_cast<int>(len_bytes));
  const uint64_t data_begin = 8 + len_bytes + header_len;
  KILN_CHECK(data_begin <= size, Value, where, ": truncated .npy header (it says ", header_len,
             " bytes, the file has ", size - 8 - len_bytes, ")");
  Header h = parse_header(
      where, std::string_view(reinterpret_cast<const char*>(p + 8 + len_bytes), header_len));
  const ScalarType dtype = npy_dtype(where, h.descr);
  KILN_CHECK(!h.fortran || h.shape.size() <= 1, Value, where,
             ": fortran_order arrays are not supported (save with np.ascontiguousarray)");
  uint64_t nbytes = element_size(dtype);
  for (int64_t d : h.shape)
    KILN_CHECK(!__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes), Value, where,
               ": shape ", IntArrayRef(h.shape), " overflows the addressable size");
  KILN_CHECK(nbytes == size - data_begin, Value, where, ": ",
             nbytes > size - data_begin ? "truncated" : "size mismatch", ": shape ",
             IntArrayRef(h.shape), " of ", h.descr, " needs ", nbytes,
             " bytes of data, the file has ", size - data_begin);
  return detail::tensor_over(file, begin + data_begin, dtype, h.shape);
}

}  // namespace

Tensor load_npy(const std::string& path) {
  auto file = MappedFile::open(path);
  return read_npy(file, 0, file->size(), path);
}

namespace {
constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                   kEnd64Sig = 0x06064b50, kEnd64LocatorSig = 0x07064b50;

// Bounds-checked little-endian reads from a mapped ZIP.
struct Zip {
  const MappedFile& f;
  const std::string& where;
  uint64_t at(uint64_t off, int bytes) const {
    KILN_CHECK(off <= f.size() && static_cast<uint64_t>(bytes) <= f.size() - off, Value, where,
               ": truncated or corrupt .npz (a ZIP record at byte ", off,
               " runs past the end of the file, ", f.size(), " bytes)");
    return le(f.data() + off, bytes);
  }
};
}  // namespace

std::map<std::string, Tensor> load_npz(const std::string& path) {
  auto file = MappedFile::open(path);
  Zip z{*file, path};
  const uint64_t n = file->size();
  KILN_CHECK(n >= 22, Value, path, ": not a .npz file (too short for a ZIP archive)");
  // The end-of-central-directory record: 22 bytes plus a comment of up to 65535.
  uint64_t end = n - 22;
  while (z.at(end, 4) != kEndSig) {
    KILN_CHECK(end > 0 && n - end < 22 + 65535, Value, path,
               ": not a .npz file (no ZIP end-of-central-directory record)");
    --end;
  }
  uint64_t count = z.at(end + 10, 2), cd_offset = z.at(end + 16, 4);
  if (count == 0xFFFF || cd_offset == 0xFFFFFFFF) {  // ZIP64
    KILN_CHECK(end >= 20 && z.at(end - 20, 4) == kEnd64LocatorSig, Value, path,
               ": corrupt .npz (ZIP64 end-of-central-directory locator missing)");
    const uint64_t end64 = z.at(end - 20 + 8, 8);
    KILN_CHECK(z.at(end64, 4) == kEnd64Sig, Value, path,
               ": corrupt .npz (ZIP64 end-of-central-directory record missing)");
    count = z.at(end64 + 32, 8);
    cd_offset = z.at(end64 + 48, 8);
  }
  std::map<std::string, Tensor> out;
  uint64_t e = cd_offset;
  for (uint64_t i = 0; i < count; ++i) {
    KILN_CHECK(z.at(e, 4) == kCentralSig, Value, path, ": corrupt .npz (central directory entry ",
               i, " at byte ", e, " has a bad signature)");
    const uint64_t flags = z.at(e + 8, 2), method = z.at(e + 10, 2);
    uint64_t csize = z.at(e + 20, 4), usize = z.at(e + 24, 4);
    const uint64_t name_len = z.at(e + 28, 2), extra_len = z.at(e + 30, 2),
                   comment_len = z.at(e + 32, 2);
    uint64_t local = z.at(e + 42, 4);
    KILN_CHECK(e + 46 + name_len + extra_len <= n, Value, path, ": truncated .npz");
    std::string name(reinterpret_cast<const char*>(file->data() + e + 46), name_len);
    // ZIP64 extra field (id 1): the 64-bit values of the fields saturated at 0xFFFFFFFF, in order.
    for (uint64_t x = e + 46 + name_len; x + 4 <= e + 46 + name_len + extra_len;) {
      const uint64_t id = z.at(x, 2), len = z.at(x + 2, 2);
      uint64_t v = x + 4;
      if (id == 1) {
        for (uint64_t* field : {&usize, &csize, &local})
          if (*field == 0xFFFFFFFF) {
            *field = z.at(v, 8);
            v += 8;
          }
      }
      x += 4 + len;
    }
    KILN_CHECK(!(flags & 1), Value, path, ": member '", name, "' is encrypted");
    KILN_CHECK(method == 0, Value, path, ": member '", name, "' is compressed (ZIP method ", method,
               "); Kiln memory-maps only uncompressed archives: save with np.savez, "
               "not np.savez_compressed");
    KILN_CHECK(csize == usize, Value, path, ": corrupt .npz (member '", name,
               "' is stored with different compressed and uncompressed sizes)");
    KILN_CHECK(z.at(local, 4) == kLocalSig, Value, path, ": corrupt .npz (member '", name,
               "' has no local header at byte ", local, ")");
    const uint64_t data = local + 30 + z.at(local + 26, 2) + z.at(local + 28, 2);
    KILN_CHECK(data <= n && csize <= n - data, Value, path, ": truncated .npz (member '", name,
               "' needs ", csize, " bytes at byte ", data, ", the file has ", n, ")");
    std::string key = name;
    if (key.size() >= 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
    KILN_CHECK(!out.count(key), Value, path, ": two members are named '", key, "'");
    out.emplace(key, read_npy(file, data, csize, path + ":" + name));
    e += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

}  // namespace kiln::data
