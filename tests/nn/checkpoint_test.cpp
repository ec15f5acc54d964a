// Training checkpoints: round trips, damaged directories, and a child process SIGKILLed while it
// saves in a loop (Note [Atomic checkpoints] in kiln/nn/checkpoint.h).
#include "kiln/nn/checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "test_util.h"

extern char** environ;

namespace kiln::nn {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "kiln_ckpt_XXXXXX").string();
    KILN_ASSERT(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

template <typename T>
Tensor filled(IntArrayRef sizes, T value) {
  Tensor t = empty_on(sizes, CppTypeToScalarType<T>::value, kCPU);
  std::fill_n(static_cast<T*>(t.data_ptr()), t.numel(), value);
  return t;
}

// The checkpoint of training step `step`: every tensor and the metadata carry the step, so a
// mix of two saves is detectable.
Checkpoint checkpoint_of_step(int64_t step) {
  Checkpoint c;
  c.groups["model"] = {{"fc.weight", filled<float>({256, 1024}, static_cast<float>(step))},
                       {"fc.bias", filled<int64_t>({17}, step)}};
  c.groups["optimizer"] = {{"0.exp_avg", filled<double>({64, 1024}, -static_cast<double>(step))}};
  c.metadata =
      json{{"step", step}, {"rng", {step, 2 * step}}, {"loader", {{"index", step % 7}}}}.dump();
  return c;
}

// The step of a loaded checkpoint, checking that every part belongs to it.
int64_t verified_step(const Checkpoint& c) {
  const int64_t step = json::parse(c.metadata).at("step").get<int64_t>();
  Checkpoint want = checkpoint_of_step(step);
  EXPECT_EQ(json::parse(c.metadata), json::parse(want.metadata));
  EXPECT_EQ(c.groups.size(), want.groups.size());
  for (const auto& [group, tensors] : want.groups) {
    EXPECT_EQ(c.groups.count(group), 1u) << group;
    if (!c.groups.count(group)) continue;
    for (const auto& [name, t] : tensors) {
      const Tensor& got = c.groups.at(group).at(name);
      EXPECT_EQ(got.sizes(), t.sizes()) << name;
      EXPECT_EQ(got.dtype(), t.dtype()) << name;
      EXPECT_EQ(std::memcmp(got.data_ptr(), t.data_ptr(), t.nbytes()), 0) << group << "/" << name;
    }
  }
  return step;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, RoundTripAndGenerations) {
  TempDir dir;
  EXPECT_FALSE(has_checkpoint(dir.str()));
  Checkpoint c;
  c.groups["model"] = {{"w", testing::random({3, 4}, kBFloat16)},
                       {"b", testing::non_contiguous(testing::random({2, 3}, kFloat64))}};
  c.groups["optimizer"] = {};
  c.metadata = R"({"scheduler": {"last_epoch": 3, "lr": 0.1}, "rng": [1, 2, 3]})";
  save_checkpoint(dir.str(), c);
  EXPECT_TRUE(has_checkpoint(dir.str()));
  Checkpoint back = load_checkpoint(dir.str());
  EXPECT_EQ(json::parse(back.metadata), json::parse(c.metadata));
  ASSERT_EQ(back.groups.size(), 2u);
  EXPECT_TRUE(back.groups.at("optimizer").empty());
  for (const auto& [name, t] : c.groups.at("model"))
    testing::expect_close(back.groups.at("model").at(name), t, 0, 0);
  EXPECT_EQ(files_in(dir.path),
            (std::vector<std::string>{"manifest.json", "model.00000001.safetensors",
                                      "optimizer.00000001.safetensors"}));

  // The next save is generation 2 and removes generation 1's files, here the dropped group too.
  Checkpoint c2 = checkpoint_of_step(5);
  c2.groups.erase("optimizer");
  save_checkpoint(dir.str(), c2);
  EXPECT_EQ(files_in(dir.path),
            (std::vector<std::string>{"manifest.json", "model.00000002.safetensors"}));
  EXPECT_EQ(load_checkpoint(dir.str()).groups.size(), 1u);
}

TEST(Checkpoint, RejectsBadInput) {
  TempDir dir;
  testing::expect_error(ErrorKind::Value, "no checkpoint in", [&] { load_checkpoint(dir.str()); });
  Checkpoint c;
  c.metadata = "{not json";
  testing::expect_error(ErrorKind::Value, "metadata is not valid JSON",
                        [&] { save_checkpoint(dir.str(), c); });
  c.metadata = "{}";
  c.groups["../evil"] = {};
  testing::expect_error(ErrorKind::Value, "group name '../evil' must be",
                        [&] { save_checkpoint(dir.str(), c); });
  EXPECT_FALSE(has_checkpoint(dir.str()));
}

TEST(Checkpoint, RejectsDamagedDirectories) {
  TempDir dir;
  save_checkpoint(dir.str(), checkpoint_of_step(3));
  const fs::path model = dir.path / "model.00000001.safetensors";
  const fs::path manifest = dir.path / "manifest.json";
  const std::string manifest_text = [&] {
    std::ifstream f(manifest);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }();
  auto write = [](const fs::path& p, const std::string& s) { std::ofstream(p) << s; };

  fs::resize_file(model, fs::file_size(model) - 1);
  testing::expect_error(ErrorKind::Value, "bytes, the manifest says",
                        [&] { load_checkpoint(dir.str()); });
  fs::remove(model);
  testing::expect_error(ErrorKind::Value, "(group 'model') is missing",
                        [&] { load_checkpoint(dir.str()); });

  // A group file of another generation, renamed into place, is refused.
  save_checkpoint(dir.str(), checkpoint_of_step(4));  // generation 2
  fs::copy_file(dir.path / "model.00000002.safetensors", dir.path / "model.00000003.safetensors");
  json m = json::parse(std::ifstream(manifest));
  m["generation"] = 3;
  m["groups"]["model"]["file"] = "model.00000003.safetensors";
  m["groups"].erase("optimizer");
  write(manifest, m.dump());
  testing::expect_error(ErrorKind::Value, "does not belong to group 'model' of generation 3",
                        [&] { load_checkpoint(dir.str()); });
  m["groups"]["model"]["file"] = "../model.00000003.safetensors";
  write(manifest, m.dump());
  testing::expect_error(ErrorKind::Value, "should name file 'model.00000003.safetensors'",
                        [&] { load_checkpoint(dir.str()); });

  write(manifest, manifest_text.substr(0, manifest_text.size() / 2));
  testing::expect_error(ErrorKind::Value, "is not valid JSON", [&] { load_checkpoint(dir.str()); });
  write(manifest, R"({"format": "other"})");
  testing::expect_error(ErrorKind::Value, "is not a Kiln checkpoint manifest",
                        [&] { load_checkpoint(dir.str()); });
  write(manifest, R"({"format": "kiln.checkpoint", "version": 99})");
  testing::expect_error(ErrorKind::Value, "has version 99", [&] { load_checkpoint(dir.str()); });
}

// What a crash leaves (temporary files, an uncommitted newer generation) is ignored by the loader
// and cleaned up by the next save.
TEST(Checkpoint, IgnoresAndCleansLeftovers) {
  TempDir dir;
  save_checkpoint(dir.str(), checkpoint_of_step(1));
  std::ofstream(dir.path / "model.00000002.safetensors") << "half";
  std::ofstream(dir.path / "optimizer.00000002.safetensors.tmp") << "half";
  std::ofstream(dir.path / "manifest.json.tmp") << "{";
  std::ofstream(dir.path / "notes.txt") << "the user's";
  EXPECT_EQ(verified_step(load_checkpoint(dir.str())), 1);
  save_checkpoint(dir.str(), checkpoint_of_step(2));
  EXPECT_EQ(verified_step(load_checkpoint(dir.str())), 2);
  EXPECT_EQ(files_in(dir.path),
            (std::vector<std::string>{"manifest.json", "model.00000003.safetensors", "notes.txt",
                                      "optimizer.00000003.safetensors"}));
}

// The child of KillDuringSave: resumes from the checkpoint in $KILN_CKPT_CHILD_DIR, reports
// readiness on fd 3, then saves step after step until it is killed.
TEST(CheckpointKillChild, DISABLED_SaveLoop) {
  const char* dir = std::getenv("KILN_CKPT_CHILD_DIR");
  if (dir == nullptr) GTEST_SKIP() << "run by Checkpoint.KillDuringSave";
  int64_t step = verified_step(load_checkpoint(dir));
  ASSERT_EQ(::write(3, "r", 1), 1);
  while (true) save_checkpoint(dir, checkpoint_of_step(++step));
}

TEST(Checkpoint, KillDuringSave) {
  TempDir dir;
  save_checkpoint(dir.str(), checkpoint_of_step(0));
  std::vector<std::string> env_strings = {"KILN_CKPT_CHILD_DIR=" + dir.str()};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "KILN_CKPT_CHILD_DIR=", 20) != 0) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=CheckpointKillChild.DISABLED_SaveLoop";
  std::string disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {exe.data(), filter.data(), disabled.data(), nullptr};

  std::mt19937 gen(20261202);
  int64_t last_step = 0;
  int mid_save = 0;
  for (int round = 0; round < 50; ++round) {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);  // the child keeps only the dup2 onto fd 3
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 3);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data()), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    char ready = 0;
    const bool started = ::read(fds[0], &ready, 1) == 1;
    ::close(fds[0]);
    if (started) ::usleep(std::uniform_int_distribution<int>(0, 30000)(gen));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(started) << "the child failed before it was ready (status " << status << ")";
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;

    // Anything beyond the manifest and the committed generation's two files: killed mid-save.
    if (files_in(dir.path).size() > 3) ++mid_save;
    const int64_t step = verified_step(load_checkpoint(dir.str()));
    ASSERT_FALSE(::testing::Test::HasFailure()) << "round " << round;
    EXPECT_GE(step, last_step) << "round " << round;
    last_step = step;
  }
  RecordProperty("killed_mid_save", mid_save);
  RecordProperty("last_step", static_cast<int>(last_step));
  EXPECT_GT(last_step, 0);  // the children made progress (how much depends on the machine's load)
  EXPECT_GE(mid_save, 10);   // and the kills landed inside saves
}

}  // namespace
}  // namespace kiln::nn
