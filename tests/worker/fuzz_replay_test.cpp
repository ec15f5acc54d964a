// The fuzzers' seed corpus and every crash they found (tests/worker/fuzz/{corpus,crashes}),
// replayed through the same entries (fuzz_entries.h) on every test run.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/fuzz_entries.h"
#include "fuzz/streams.h"

namespace kiln {
namespace {

std::vector<std::string> inputs(const std::string& sub) {
  std::vector<std::string> out;
  for (const char* kind : {"corpus", "crashes"}) {
    std::filesystem::path dir = std::filesystem::path(KILN_FUZZ_DIR) / kind / sub;
    if (!std::filesystem::exists(dir)) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() != ".txtpb") out.push_back(e.path());
  }
  return out;
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(WorkerFuzzReplay, Codec) {
  auto files = inputs("codec");
  EXPECT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    std::string b = read(f);
    fuzz::codec(reinterpret_cast<const uint8_t*>(b.data()), b.size());
  }
}

TEST(WorkerFuzzReplay, Session) {
  auto files = inputs("session");
  EXPECT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    std::string b = read(f);
    fuzz::session(reinterpret_cast<const uint8_t*>(b.data()), b.size());
  }
}

// The session corpus again, read as multi-tenant, multi-stream sequences (streams.h).
TEST(WorkerFuzzReplay, Streams) {
  auto files = inputs("session");
  EXPECT_FALSE(files.empty());
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    std::string b = read(f);
    fuzz::streams(reinterpret_cast<const uint8_t*>(b.data()), b.size());
  }
}

}  // namespace
}  // namespace kiln
