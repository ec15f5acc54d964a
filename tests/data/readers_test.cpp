// kiln::data file readers: .npy, .npz (fixtures from tests/data/make_npz_fixtures.py and
// archives built here), and flat token files; malformed files fail with clear errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/data/numpy.h"
#include "kiln/data/tokens.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::data {
namespace {

namespace fs = std::filesystem;
using kiln::testing::to_doubles;
using Bytes = std::string;

fs::path fixture(const std::string& name) {
  std::vector<fs::path> starts = {fs::path(__FILE__).parent_path(), fs::current_path()};
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe));
  if (n > 0) starts.push_back(fs::path(std::string(exe, n)).parent_path());
  for (fs::path p : starts)
    for (int up = 0; up < 6 && !p.empty(); ++up, p = p.parent_path())
      for (const fs::path& c : {p / "fixtures" / name, p / "tests/data/fixtures" / name})
        if (fs::exists(c)) return c;
  ADD_FAILURE() << "tests/data/fixtures/" << name << " not found";
  return {};
}

// A scratch directory for files written by one test.
class Scratch {
 public:
  Scratch() : dir_(fs::temp_directory_path() / ("kiln_data_" + std::to_string(getpid()))) {
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  std::string write(const std::string& name, const Bytes& bytes) const {
    fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), bytes.size());
    return p.string();
  }

 private:
  fs::path dir_;
};

Bytes le(uint64_t v, int bytes) {
  Bytes out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  return out;
}

// A .npy file as NumPy writes it (version 1.0 unless told, header padded to 64 bytes).
Bytes npy(const std::string& descr, const std::string& shape, const Bytes& data,
          const std::string& fortran = "False", int major = 1) {
  std::string h =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  const int len_bytes = major == 1 ? 2 : 4;
  h += std::string(64 - (8 + len_bytes + h.size() + 1) % 64, ' ') + "\n";
  return Bytes("\x93NUMPY", 6) + char(major) + char(0) + le(h.size(), len_bytes) + h + data;
}

template <typename T>
Bytes raw(std::vector<T> v) {
  return Bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}
#define EXPECT_ERROR(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

TEST(DataNpy, ReadsDtypesShapesAndVersions) {
  Scratch s;
  Tensor f = load_npy(s.write("f.npy", npy("<f4", "(2, 3)", raw<float>({0, 1, 2, 3, 4, 5}))));
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(f.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_doubles(f), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data_ptr()) % 64, 0u);  // the mapping, no copy
  Tensor d = load_npy(s.write("d.npy", npy("<f8", "(3,)", raw<double>({1.5, -2, 3}), "False", 2)));
  EXPECT_EQ(d.dtype(), kFloat64);
  EXPECT_EQ(to_doubles(d), (std::vector<double>{1.5, -2, 3}));
  Tensor i = load_npy(s.write("i.npy", npy("<i8", "(2,)", raw<int64_t>({7, -9}), "False", 3)));
  EXPECT_EQ(to_doubles(i), (std::vector<double>{7, -9}));
  Tensor u = load_npy(s.write("u.npy", npy("|u1", "()", Bytes("\x2a", 1))));
  EXPECT_EQ(u.dim(), 0);
  EXPECT_EQ(u.dtype(), kUInt8);
  EXPECT_EQ(u.item<int64_t>(), 42);
  Tensor b = load_npy(s.write("b.npy", npy("|b1", "(2,)", Bytes("\x01\x00", 2))));
  EXPECT_EQ(b.dtype(), kBool);
  Tensor h = load_npy(s.write("h.npy", npy("<i2", "(1, 1)", raw<int16_t>({-3}))));
  EXPECT_EQ(h.dtype(), kInt16);
  EXPECT_EQ(load_npy(s.write("e.npy", npy("<f4", "(0, 5)", ""))).sizes(),
            (std::vector<int64_t>{0, 5}));
  // 1-D fortran order is C order.
  EXPECT_EQ(load_npy(s.write("fo.npy", npy("<i4", "(2,)", raw<int32_t>({1, 2}), "True"))).numel(),
            2);
}

TEST(DataNpy, WritesStayInMemoryAndOutliveTheLoader) {
  Scratch s;
  std::string path = s.write("w.npy", npy("<f4", "(4,)", raw<float>({1, 2, 3, 4})));
  Tensor t = load_npy(path);
  Tensor view = t.narrow(0, 1, 2);
  t = Tensor();  // the view keeps the mapping alive
  view.add_(full({2}, 10, kFloat32));
  EXPECT_EQ(to_doubles(view), (std::vector<double>{12, 13}));
  EXPECT_EQ(to_doubles(load_npy(path)), (std::vector<double>{1, 2, 3, 4}));  // file unchanged
  EXPECT_EQ(to_doubles(view * 2), (std::vector<double>{24, 26}));
}

TEST(DataNpy, MalformedFilesFailClearly) {
  Scratch s;
  Bytes good = npy("<f4", "(2, 3)", raw<float>({0, 1, 2, 3, 4, 5}));
  EXPECT_ERROR(load_npy(s.write("missing.npy", good) + "x"), "cannot open");
  EXPECT_ERROR(load_npy(s.write("magic.npy", "PK" + good)), "magic string");
  EXPECT_ERROR(load_npy(s.write("empty.npy", "")), "not a .npy file");
  EXPECT_ERROR(load_npy(s.write("trunc.npy", good.substr(0, good.size() - 1))),
               "truncated: shape [2, 3] of <f4 needs 24 bytes of data, the file has 23");
  EXPECT_ERROR(load_npy(s.write("long.npy", good + "xx")), "size mismatch");
  EXPECT_ERROR(load_npy(s.write("hdr.npy", good.substr(0, 40))), "truncated .npy header");
  Bytes v9 = good;
  v9[6] = 9;
  EXPECT_ERROR(load_npy(s.write("v9.npy", v9)), "format version 9.0");
  EXPECT_ERROR(load_npy(s.write("be.npy", npy(">f4", "(1,)", "abcd"))), "unsupported dtype '>f4'");
  EXPECT_ERROR(load_npy(s.write("u2.npy", npy("<u2", "(1,)", "ab"))), "unsupported dtype '<u2'");
  EXPECT_ERROR(load_npy(s.write("c8.npy", npy("<c8", "(1,)", "abcdefgh"))), "'<c8'");
  EXPECT_ERROR(load_npy(s.write("obj.npy", npy("|O", "(1,)", "abcdefgh"))), "'|O'");
  EXPECT_ERROR(
      load_npy(s.write("fo.npy", npy("<f4", "(2, 3)", raw<float>({0, 1, 2, 3, 4, 5}), "True"))),
      "fortran_order");
  EXPECT_ERROR(load_npy(s.write("shape.npy", npy("<f4", "(2, x)", ""))), "malformed .npy header");
  EXPECT_ERROR(load_npy(s.write("huge.npy", npy("<f4", "(4294967296, 4294967296)", ""))),
               "overflows");
  EXPECT_ERROR(load_npy(s.write("huge2.npy", npy("<f4", "(99999999999999999999,)", ""))),
               "overflows int64");
  Bytes structured = good;
  structured.replace(structured.find("'<f4'"), 5, "[('a', '<f4')]");
  EXPECT_ERROR(load_npy(s.write("struct.npy", structured)), "structured");
}

TEST(DataNpz, ReadsWhatZipfileWrites) {
  auto a = load_npz(fixture("savez.npz").string());
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a.at("x").sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(to_doubles(a.at("x")), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(a.at("labels").dtype(), kInt64);
  EXPECT_EQ(to_doubles(a.at("labels")), (std::vector<double>{7, -1, 9}));
  EXPECT_EQ(a.at("empty").sizes(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(a.at("scalar").item<int64_t>(), 42);
  EXPECT_ERROR(load_npz(fixture("savez_compressed.npz").string()),
               "is compressed (ZIP method 8); Kiln memory-maps only uncompressed archives");
}

// A stored ZIP of `members`; with zip64, the central directory saturates its 32-bit fields and
// carries them in ZIP64 extra fields and a ZIP64 end record, as archives over 4 GiB do.
Bytes zip(const std::vector<std::pair<std::string, Bytes>>& members, bool zip64,
          uint16_t method = 0) {
  Bytes out, cd;
  for (const auto& [name, data] : members) {
    const uint64_t local = out.size();
    out += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(method, 2) + le(0, 4) + le(0, 4) +
           le(data.size(), 4) + le(data.size(), 4) + le(name.size(), 2) + le(0, 2) + name;
    out += data;
    Bytes extra =
        zip64 ? le(1, 2) + le(24, 2) + le(data.size(), 8) + le(data.size(), 8) + le(local, 8) : "";
    const uint64_t sat = 0xFFFFFFFF;
    cd += le(0x02014b50, 4) + le(45, 2) + le(45, 2) + le(0, 2) + le(method, 2) + le(0, 4) +
          le(0, 4) + le(zip64 ? sat : data.size(), 4) + le(zip64 ? sat : data.size(), 4) +
          le(name.size(), 2) + le(extra.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) +
          le(zip64 ? sat : local, 4) + name + extra;
  }
  const uint64_t cd_offset = out.size();
  out += cd;
  if (zip64) {
    const uint64_t end64 = out.size();
    out += le(0x06064b50, 4) + le(44, 8) + le(45, 2) + le(45, 2) + le(0, 4) + le(0, 4) +
           le(members.size(), 8) + le(members.size(), 8) + le(cd.size(), 8) + le(cd_offset, 8);
    out += le(0x07064b50, 4) + le(0, 4) + le(end64, 8) + le(1, 4);
  }
  out += le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(zip64 ? 0xFFFF : members.size(), 2) +
         le(zip64 ? 0xFFFF : members.size(), 2) + le(cd.size(), 4) +
         le(zip64 ? 0xFFFFFFFF : cd_offset, 4) + le(0, 2);
  return out;
}

TEST(DataNpz, Zip64UnalignedAndMalformedArchives) {
  Scratch s;
  // "abc.npy" puts the float data at an odd offset: it is copied. "c.npy"'s data is mapped.
  std::vector<std::pair<std::string, Bytes>> members = {
      {"abc.npy", npy("<f4", "(3,)", raw<float>({1, 2, 3}))},
      {"c.npy", npy("<i4", "(2, 1)", raw<int32_t>({5, 6}))}};
  for (bool zip64 : {false, true}) {
    auto a = load_npz(s.write("z.npz", zip(members, zip64)));
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(to_doubles(a.at("abc")), (std::vector<double>{1, 2, 3}));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.at("abc").data_ptr()) % 4, 0u);
    EXPECT_EQ(to_doubles(a.at("c")), (std::vector<double>{5, 6}));
  }
  Bytes good = zip(members, true);
  EXPECT_ERROR(load_npz(s.write("short.npz", "PK")), "too short");
  EXPECT_ERROR(load_npz(s.write("npy.npz", members[0].second)), "no ZIP end-of-central-directory");
  EXPECT_ERROR(load_npz(s.write("t.npz", good.substr(40))), "corrupt .npz");
  Bytes bad_member = zip({{"x.npy", "not numpy at all"}}, false);
  EXPECT_ERROR(load_npz(s.write("m.npz", bad_member)), "x.npy: not a .npy file");
  Bytes truncated = zip({{"x.npy", npy("<f4", "(3,)", raw<float>({1, 2}))}}, false);
  EXPECT_ERROR(load_npz(s.write("tr.npz", truncated)), "tr.npz:x.npy: truncated");
  EXPECT_ERROR(load_npz(s.write("def.npz", zip(members, false, 8))), "np.savez_compressed");
  EXPECT_ERROR(load_npz(s.write("dup.npz", zip({members[1], members[1]}, false))),
               "two members are named 'c'");
  // A hostile central directory offset: no crash, a clear error.
  Bytes hostile = good;
  hostile.replace(hostile.size() - 22 - 20 - 56 + 48, 8, le(uint64_t{1} << 62, 8));
  EXPECT_ERROR(load_npz(s.write("h.npz", hostile)), "runs past the end of the file");
}

Bytes tokens16(const std::vector<uint16_t>& v) { return raw<uint16_t>(v); }

TEST(DataTokens, FileAndDataset) {
  Scratch s;
  std::vector<uint16_t> ids;
  for (int i = 0; i < 11; ++i) ids.push_back(static_cast<uint16_t>(i * 6000));  // up to 60000
  auto f = std::make_shared<TokenFile>(s.write("t16.bin", tokens16(ids)), TokenWidth::k16, 65536);
  EXPECT_EQ(f->size(), 11);
  EXPECT_EQ(f->at(10), 60000);
  Tensor sl = f->slice(2, 3);
  EXPECT_EQ(sl.dtype(), kInt64);
  EXPECT_EQ(to_doubles(sl), (std::vector<double>{12000, 18000, 24000}));
  TokenFile f32(s.write("t32.bin", raw<uint32_t>({70000, 4000000000u})), TokenWidth::k32);
  EXPECT_EQ(f32.at(1), 4000000000);
  TokenDataset ds(f, 4);  // windows at 0, 4 (8 needs tokens 8..12, the file has 11)
  EXPECT_EQ(ds.size(), 2);
  Example e = ds.get(1);
  EXPECT_EQ(to_doubles(e[0]), (std::vector<double>{24000, 30000, 36000, 42000}));
  EXPECT_EQ(to_doubles(e[1]), (std::vector<double>{30000, 36000, 42000, 48000}));
  EXPECT_EQ(TokenDataset(f, 4, 1).size(), 7);
  EXPECT_EQ(TokenDataset(f, 10).size(), 1);
  Example b = ds.get_batch({1, 0});
  EXPECT_EQ(b[0].sizes(), (std::vector<int64_t>{2, 4}));
}

TEST(DataTokens, MismatchedFilesFailClearly) {
  Scratch s;
  EXPECT_ERROR(TokenFile(s.write("odd.bin", "abc"), TokenWidth::k16),
               "3 bytes is not a whole number of uint16 tokens");
  EXPECT_ERROR(TokenFile(s.write("six.bin", "abcdef"), TokenWidth::k32), "uint32");
  // uint32 ids read as uint16: 70000 = 0x11170 gives tokens 0x1170 and 1, in range; big ones not.
  EXPECT_ERROR(TokenFile(s.write("w.bin", raw<uint32_t>({5, 0x00FFFF00})), TokenWidth::k16, 50257),
               "token 65280 at position 2 is >= vocab_size 50257 (is the file uint32 rather than "
               "uint16?)");
  EXPECT_ERROR(TokenFile(s.write("none.bin", "") + "x", TokenWidth::k16), "cannot open");
  auto f = std::make_shared<TokenFile>(s.write("t.bin", tokens16({1, 2, 3})), TokenWidth::k16);
  EXPECT_EQ(f->size(), 3);
  EXPECT_ERROR(f->slice(2, 2), "outside the file's 3 tokens");
  EXPECT_ERROR(f->at(-1), "position -1");
  EXPECT_ERROR(TokenDataset(f, 3), "too short for one block of 3");
  EXPECT_ERROR(TokenDataset(f, 0), "must be >= 1");
  EXPECT_ERROR(TokenDataset(f, 2).get(1), "index 1 is out of range");
  EXPECT_EQ(TokenFile(s.write("empty.bin", ""), TokenWidth::k32).size(), 0);
}

}  // namespace
}  // namespace kiln::data
