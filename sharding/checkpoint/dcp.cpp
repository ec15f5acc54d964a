// Distributed checkpoints, save and load (kiln/dist/checkpoint.h); convert.cpp converts to and
// from one safetensors file. See Note [Distributed checkpoint format].
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "internal.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/dist/checkpoint.h"
#include "kiln/dist/remote.h"
#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"
#include "kiln/nn/checkpoint.h"

namespace kiln::dist::checkpoint {
using namespace internal;

namespace {

int rank() { return is_initialized() ? default_group()->rank() : 0; }
int world_size() { return is_initialized() ? default_group()->size() : 1; }

}  // namespace

namespace internal {

Box whole(IntArrayRef shape) {
  return {std::vector<int64_t>(shape.size(), 0), std::vector<int64_t>(shape.begin(), shape.end())};
}

uint32_t crc_of(const Tensor& contiguous_cpu) {
  return static_cast<uint32_t>(crc32_z(0,
                                       static_cast<const Bytef*>(contiguous_cpu.impl()->raw_data()),
                                       static_cast<size_t>(contiguous_cpu.nbytes())));
}

std::string rank_file(int r, uint64_t generation, const char* ext) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "__%d.%08llu%s", r, static_cast<unsigned long long>(generation),
                ext);
  return buf;
}

json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  KILN_CHECK(in.good(), Value, "checkpoint: cannot read '", p.string(), "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "checkpoint: '", p.string(), "' is not valid JSON: ", e.what());
  }
}

void write_json(const fs::path& p, const json& j) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump();
    out.flush();
    if (!out.good()) nn::sys_fail("writing", tmp);
  }
  nn::commit_file(tmp, p);
}

uint64_t committed_generation(const fs::path& dir) {
  const fs::path m = dir / kMetadata;
  if (!fs::exists(m)) return 0;
  try {
    return read_json(m).at("generation").get<uint64_t>();
  } catch (const std::exception&) {
    return 0;  // unreadable: next_generation() still goes past its files
  }
}

}  // namespace internal

namespace {

// The region of this rank's shard of a DTensor placed by `p` (no Partial) on spec's mesh: each
// Shard mesh dim, in order, splits the piece the earlier ones left (See Note [Placements]).
Box shard_box(const DTensorSpec& s, const Placements& p) {
  const std::vector<int64_t> coord = s.mesh.coordinate();
  KILN_CHECK(!coord.empty(), Value, "checkpoint: this rank is not in ", s.mesh.str());
  Box b = whole(IntArrayRef(s.shape));
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_shard()) continue;
    const int64_t d = p[i].dim;
    auto [off, len] = chunk_of(b.size[d], s.mesh.size(static_cast<int64_t>(i)), coord[i]);
    b.off[d] += off;
    b.size[d] = len;
  }
  return b;
}

// A shard file's name, "__<rank>.<generation>.<safetensors|json>[.tmp]": its generation, or
// nullopt for any other name (the user's files are never touched).
std::optional<uint64_t> generation_of(const std::string& name) {
  if (name.rfind("__", 0) != 0) return std::nullopt;
  size_t i = 2, j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j >= name.size() || name[j] != '.') return std::nullopt;
  size_t k = ++j;
  while (k < name.size() && std::isdigit(static_cast<unsigned char>(name[k]))) ++k;
  if (k - j < 8 || k - j > 19) return std::nullopt;
  const std::string rest = name.substr(k);
  if (rest != ".safetensors" && rest != ".json" && rest != ".safetensors.tmp" &&
      rest != ".json.tmp" && rest != ".error")
    return std::nullopt;
  return std::stoull(name.substr(j, k - j));
}

// Past the committed generation and past every shard file's (a dead save's leftovers included),
// so that a save never writes over a name an earlier one used.
uint64_t next_generation(const fs::path& dir) {
  uint64_t g = committed_generation(dir);
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (auto eg = generation_of(e.path().filename().string())) g = std::max(g, *eg);
  return g + 1;
}

// A DTensor's local shard as saved: Partial mesh dims reduced (every rank takes part), and
// whether this rank writes it (index 0 of every mesh dim the shard is the same along).
struct SavedShard {
  Tensor local;
  Box box;
  bool writes = false;
};

SavedShard saved_shard(const std::string& name, const Tensor& t) {
  const DTensorSpec& spec = detail::spec_of(t);
  Tensor local = detail::local_of(t);
  Placements p = spec.placements;
  bool partial = false;
  for (Placement& pl : p)
    if (pl.is_partial()) {
      pl = Replicate();
      partial = true;
    }
  if (partial) local = detail::redistribute_local(local, spec, p);
  const std::vector<int64_t> coord = spec.mesh.coordinate();
  bool writes = !coord.empty();
  for (size_t i = 0; i < p.size() && writes; ++i) writes = p[i].is_shard() || coord[i] == 0;
  return {local, shard_box(spec, p), writes};
}

}  // namespace

namespace {

// Whether `state` lives on a gang (See Note [Gang checkpoints] in kiln/dist/remote.h): all of its
// tensors, which the gang's workers then save or load; a mix is a ValueError. Otherwise, a
// checkpoint moves real bytes between real ranks, which a fake group cannot.
bool on_gang(const TensorMap& state, const char* what) {
  const std::string* local_name = nullptr;
  const std::string* remote_name = nullptr;
  for (const auto& [name, t] : state) {
    if (!t.defined()) continue;
    const Tensor& local = is_dtensor(t) ? detail::local_of(t) : t;
    (local.device().type() == DeviceType::Remote ? remote_name : local_name) = &name;
  }
  if (remote_name) {
    KILN_CHECK(!local_name, Value, what, ": '", *remote_name,
               "' lives on a gang's workers but '", *local_name,
               "' in this process; a checkpoint's tensors must all be in one place (move them "
               "with .to(session.device) or fetch them with .cpu())");
    return true;
  }
  KILN_CHECK(!is_initialized() || !default_group()->fake(), NotImplemented, what,
             ": the default process group is the fake backend's, which moves no data");
  return false;
}

// Of the pieces this rank could write (a plain tensor's name, or a DTensor shard's name and
// box), those no lower rank holds. Ranks may hold different plain tensors (pipeline stages each
// hold their own), and a DTensor on a sub-mesh has a copy in each block of the other dims; each
// rank's keys travel as 64-bit hashes in two all-gathers.
std::set<std::string> first_holders(const std::vector<std::string>& keys, int rank, int world) {
  std::vector<std::pair<int64_t, std::string>> mine;
  for (const std::string& key : keys)
    mine.push_back({static_cast<int64_t>(std::hash<std::string>()(key)), key});
  std::set<std::string> out;
  if (world == 1) {
    for (auto& [h, n] : mine) out.insert(n);
    return out;
  }
  auto group = default_group();
  Tensor count = full({1}, static_cast<int64_t>(mine.size()), kInt64);
  Tensor counts = empty({world}, kInt64);
  group->all_gather_into_tensor(counts, count)->wait();
  const int64_t* listed = counts.data_ptr<int64_t>();  // each rank's number of names
  const int64_t width = std::max<int64_t>(1, *std::max_element(listed, listed + world));
  Tensor hashes = zeros({width}, kInt64);
  for (size_t i = 0; i < mine.size(); ++i) hashes.data_ptr<int64_t>()[i] = mine[i].first;
  Tensor every = empty({world * width}, kInt64);
  group->all_gather_into_tensor(every, hashes)->wait();
  std::set<int64_t> lower;
  for (int q = 0; q < rank; ++q)
    lower.insert(every.data_ptr<int64_t>() + q * width,
                 every.data_ptr<int64_t>() + q * width + listed[q]);
  for (auto& [h, n] : mine)
    if (!lower.count(h)) out.insert(n);
  return out;
}

// What a save writes, taken from the state at the call (See Note [Distributed checkpoint format]).
struct Snapshot {
  fs::path root;
  int rank = 0, world = 1;
  uint64_t gen = 0;
  int64_t nonce = 0;
  json extra, tensors = json::object(), chunks = json::object();
  TensorMap mine;  // this rank's chunks: CPU, contiguous
};

// An async save's host buffers, by tensor name (the next async save waits for the last one, so
// they are free again when it copies into them).
TensorMap& staging() {
  static TensorMap buffers;
  return buffers;
}

// `copy`: the chunks never share memory with `state` (an async save writes them later).
// Runs `stage` on this rank and lets every rank know whether all of them succeeded (one
// all-reduce): the rank that failed raises its own error, the others a RuntimeError naming the
// stage, rather than waiting in the next collective for a rank that will not come.
void agreed(const char* what, const std::function<void()>& stage) {
  std::exception_ptr err;
  try {
    stage();
  } catch (...) {
    err = std::current_exception();
  }
  bool all_ok = !err;
  if (world_size() > 1) {
    Tensor ok = empty({1}, kInt64);
    ok.data_ptr<int64_t>()[0] = err ? 0 : 1;
    default_group()->all_reduce(ok, ReduceOp::Min)->wait();
    all_ok = ok.data_ptr<int64_t>()[0] == 1;
  }
  if (err) std::rethrow_exception(err);
  KILN_CHECK(all_ok, Runtime, "checkpoint.save: another rank failed while ", what,
             " (its own error says why); nothing was committed");
}

Snapshot snapshot(const TensorMap& state, const std::string& dir, const std::string& extra,
                  bool copy) {
  Snapshot s;
  int64_t pick[2] = {0, 0};
  // What can fail on one rank alone is checked before any collective (See agreed()).
  agreed("preparing the save", [&] {
    try {
      s.extra = json::parse(extra);
    } catch (const json::exception& e) {
      KILN_FAIL(Value, "checkpoint.save: extra is not valid JSON: ", e.what());
    }
    for (const auto& [name, t] : state)
      t.check_defined(("checkpoint.save: '" + name + "'").c_str());
    s.rank = rank();
    s.world = world_size();
    s.root = fs::path(dir);
    std::error_code ec;
    fs::create_directories(s.root, ec);
    KILN_CHECK(!ec && fs::is_directory(s.root), Value, "checkpoint.save: cannot create directory '",
               dir, "': ", ec.message());
    // Rank 0 picks the generation, and a nonce that marks this save's chunk lists (an async save
    // waits for files with it, never a dead save's).
    if (s.rank == 0) {
      pick[0] = static_cast<int64_t>(next_generation(s.root));
      std::random_device rd;
      pick[1] = static_cast<int64_t>((static_cast<uint64_t>(rd()) << 32) ^ rd());
    }
  });
  if (s.world > 1) {
    Tensor t = empty({2}, kInt64);
    t.data_ptr<int64_t>()[0] = pick[0];
    t.data_ptr<int64_t>()[1] = pick[1];
    default_group()->broadcast(t, 0)->wait();
    pick[0] = t.data_ptr<int64_t>()[0];
    pick[1] = t.data_ptr<int64_t>()[1];
  }
  s.gen = static_cast<uint64_t>(pick[0]);
  s.nonce = pick[1];
  autograd::NoGradGuard no_grad;
  std::map<std::string, SavedShard> shards;
  std::vector<std::string> keys;
  auto shard_key = [](const std::string& name, const Box& b) {
    std::string key = name + '\0';
    for (int64_t o : b.off) key += std::to_string(o) + ",";
    return key;
  };
  for (const auto& [name, t] : state) {
    if (!is_dtensor(t)) {
      keys.push_back(name);
      continue;
    }
    SavedShard sh = saved_shard(name, t);
    if (sh.writes) keys.push_back(shard_key(name, sh.box));
    shards.emplace(name, std::move(sh));
  }
  const std::set<std::string> writes = first_holders(keys, s.rank, s.world);
  for (const auto& [name, t] : state) {
    json entry{{"shape", std::vector<int64_t>(t.sizes().begin(), t.sizes().end())},
               {"dtype", safetensors_dtype_name(t.dtype())}};
    Tensor piece;
    Box box = whole(t.sizes());
    if (is_dtensor(t)) {
      SavedShard& sh = shards.at(name);
      entry["placements"] = placements_str(detail::spec_of(t).placements);
      if (sh.writes && writes.count(shard_key(name, sh.box))) piece = sh.local;
      box = std::move(sh.box);
    } else if (writes.count(name)) {
      piece = t;
    }
    s.tensors[name] = std::move(entry);
    if (!piece.defined()) continue;
    s.chunks[name] = {{"offsets", box.off}, {"sizes", box.size}};
    if (!copy) {
      s.mine[name] = piece.to(std::nullopt, kCPU).contiguous();
      continue;
    }
    // Host buffers kept from the last async save: copying into memory already mapped costs a
    // fraction of allocating it again (the page faults), which is most of the call's time.
    Tensor& buf = staging()[name];
    if (!buf.defined() || buf.sizes() != piece.sizes() || buf.dtype() != piece.dtype())
      buf = empty(piece.sizes(), piece.dtype(), kCPU);
    buf.copy_(piece);
    s.mine[name] = buf;
  }
  return s;
}

// This rank's shard file and its chunk list (with each chunk's CRC-32).
void write_shards(Snapshot& s) {
  // The CRC-32s on another thread while this one writes: a save then takes about the write.
  auto crcs = std::async(std::launch::async, [&s] {
    std::map<std::string, uint32_t> m;
    for (const auto& [name, t] : s.mine) m[name] = crc_of(t);
    return m;
  });
  const std::string file = rank_file(s.rank, s.gen, ".safetensors");
  const fs::path tmp = s.root / (file + ".tmp");
  try {
    save_safetensors(tmp.string(), s.mine);
  } catch (...) {
    crcs.wait();  // it reads s.mine
    std::error_code ec;
    fs::remove(tmp, ec);  // a full disk keeps no half file
    throw;
  }
  for (const auto& [name, crc] : crcs.get()) s.chunks[name]["crc32"] = crc;
  nn::commit_file(tmp, s.root / file);
  nn::fsync_path(s.root, true);  // the shard's name is durable before any list names it
  write_json(s.root / rank_file(s.rank, s.gen, ".json"), {{"rank", s.rank},
                                                          {"generation", s.gen},
                                                          {"nonce", s.nonce},
                                                          {"file", file},
                                                          {"tensors", s.tensors},
                                                          {"chunks", s.chunks},
                                                          {"extra", s.extra}});
}

}  // namespace

namespace internal {

void remove_other_generations(const fs::path& root, uint64_t gen) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string fname = e.path().filename().string();
    const std::optional<uint64_t> g = generation_of(fname);
    // Older generations, and this one's merged lists; a later save's files are its own.
    if (g && (*g < gen || (*g == gen && !fname.ends_with(".safetensors"))))
      fs::remove(e.path(), ec);
  }
}

}  // namespace internal

namespace {

// Rank 0, once every rank's files are written: merges the chunk lists into the metadata, commits
// it and removes the other generations' files.
void commit(const Snapshot& s) {
  json meta{{"format", kFormat},     {"version", kVersion}, {"generation", s.gen},
            {"world_size", s.world}, {"extra", s.extra},    {"tensors", json::object()}};
  json& all = meta["tensors"];
  meta["rank_extra"] = json::array();  // each rank's own (its RNG state, say)
  std::map<std::string, int> first_rank;  // the first rank to list each name
  for (int q = 0; q < s.world; ++q) {
    const json part = read_json(s.root / rank_file(q, s.gen, ".json"));
    KILN_CHECK(part.value("nonce", int64_t{0}) == s.nonce, Runtime, "checkpoint.save: rank ", q,
               "'s chunk list of generation ", s.gen, " belongs to another save");
    meta["rank_extra"].push_back(part.value("extra", json::object()));
    // The ranks may hold different tensors (pipeline stages); a name two ranks hold must
    // agree on its shape, dtype and placements.
    for (const auto& [name, entry] : part.at("tensors").items()) {
      auto [first, fresh] = first_rank.emplace(name, q);
      if (fresh) {
        all[name] = entry;
        all[name]["chunks"] = json::array();
        continue;
      }
      json seen = all[name];
      seen.erase("chunks");
      KILN_CHECK(seen == entry, Value, "checkpoint.save: rank ", q, " saved '", name, "' as ",
                 entry.dump(), ", which rank ", first->second, " saved as ", seen.dump());
    }
    for (const auto& [name, c] : part.at("chunks").items()) {
      json chunk = c;
      chunk["file"] = part.at("file");
      all[name]["chunks"].push_back(std::move(chunk));
    }
  }
  for (const auto& [name, entry] : all.items()) {  // each element once
    int64_t covered = 0, numel = 1;
    for (int64_t d : entry["shape"].get<std::vector<int64_t>>()) numel *= d;
    for (const json& c : entry["chunks"]) {
      int64_t k = 1;
      for (int64_t d : c["sizes"].get<std::vector<int64_t>>()) k *= d;
      covered += k;
    }
    KILN_CHECK(covered == numel, Value, "checkpoint.save: the ranks' shards of '", name, "' hold ",
               covered, " of its ", numel, " elements; do the ranks disagree on its placements?");
  }
  write_json(s.root / kMetadata, meta);  // the commit point
  nn::fsync_path(s.root, true);
  remove_other_generations(s.root, s.gen);
}

// Polls until `ready` or the timeout (KILN_CHECKPOINT_TIMEOUT_S, default 600 s): an async save
// synchronizes through the files, so that no collective runs beside the caller's.
void wait_for(const std::function<bool()>& ready, const std::string& what) {
  const char* env = std::getenv("KILN_CHECKPOINT_TIMEOUT_S");
  const auto limit = std::chrono::seconds(env ? std::max(1, std::atoi(env)) : 600);
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    KILN_CHECK(std::chrono::steady_clock::now() < end, Runtime, "checkpoint.async_save: ", what,
               " within ", limit.count(), " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Whether rank q's chunk list of this save (its nonce) is written.
bool has_list(const Snapshot& s, int q) {
  const fs::path p = s.root / rank_file(q, s.gen, ".json");
  if (!fs::exists(p)) return false;
  try {
    return read_json(p).value("nonce", int64_t{0}) == s.nonce;
  } catch (const Error&) {
    return false;
  }
}

// An async save's failure, left where the other ranks look while they wait for it:
// "__<rank>.<gen>.error" holds the message.
fs::path error_marker(const Snapshot& s, int r) { return s.root / rank_file(r, s.gen, ".error"); }

// Raises rank r's failure of this save, if it left one.
void check_marker(const Snapshot& s, int r) {
  const fs::path p = error_marker(s, r);
  if (!fs::exists(p)) return;
  std::ifstream in(p);
  std::string what((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  KILN_FAIL(Runtime, "checkpoint.async_save: rank ", r, " failed: ", what,
            "; nothing was committed");
}

// The background part of an async save (See Note [Distributed checkpoint format]).
void write_async(Snapshot& s) {
  try {
    write_shards(s);
    if (s.rank == 0) {
      for (int q = 0; q < s.world; ++q)
        wait_for(
            [&] {
              check_marker(s, q);
              return has_list(s, q);
            },
            "rank " + std::to_string(q) + " wrote no shards");
      commit(s);
    } else {
      wait_for(
          [&] {
            check_marker(s, 0);
            return committed_generation(s.root) >= s.gen;
          },
          "rank 0 committed no checkpoint");
    }
  } catch (const std::exception& e) {
    if (!fs::exists(error_marker(s, s.rank))) {  // not a failure another rank reported
      std::ofstream out(error_marker(s, s.rank), std::ios::trunc);
      out << e.what();
    }
    throw;
  }
}

std::mutex g_inflight_mu;
std::shared_future<void> g_inflight;  // this process's async save, if any

}  // namespace

void internal::wait_inflight() {
  std::shared_future<void> f;
  {
    std::lock_guard<std::mutex> lock(g_inflight_mu);
    f = g_inflight;
  }
  if (f.valid()) f.wait();  // its error is its caller's to see
}

void save(const TensorMap& state, const std::string& dir, const std::string& extra) {
  if (on_gang(state, "checkpoint.save")) {
    detail::remote_hooks().checkpoint(state, dir, extra, /*load=*/false, /*strict=*/true);
    return;
  }
  wait_inflight();
  Snapshot s = snapshot(state, dir, extra, /*copy=*/false);
  agreed("writing its shards", [&] { write_shards(s); });  // every rank's shards are durable
  agreed("committing", [&] {                               // and no rank returns before the commit
    if (s.rank == 0) commit(s);
  });
}

SaveFuture async_save(const TensorMap& state, const std::string& dir, const std::string& extra) {
  if (on_gang(state, "checkpoint.async_save")) {  // a gang's save is done when this returns
    detail::remote_hooks().checkpoint(state, dir, extra, /*load=*/false, /*strict=*/true);
    std::promise<void> done;
    done.set_value();
    return SaveFuture(done.get_future().share());
  }
  wait_inflight();
  auto s = std::make_shared<Snapshot>(snapshot(state, dir, extra, /*copy=*/true));
  std::shared_future<void> f = std::async(std::launch::async, [s] { write_async(*s); }).share();
  {
    std::lock_guard<std::mutex> lock(g_inflight_mu);
    g_inflight = f;
  }
  return SaveFuture(f);
}

void SaveFuture::wait() const {
  if (f_.valid()) f_.get();
}

bool SaveFuture::done() const {
  return !f_.valid() || f_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void internal::fill_region(const std::string& name, const json& entry,
                           const std::vector<int64_t>& shape, ScalarType dtype, const Tensor& dst,
                           const Box& box, const fs::path& root, const std::string& dir,
                           std::map<std::string, std::unique_ptr<StFile>>& files) {
  int64_t covered = 0;
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> seen;  // [lo, hi) boxes
  for (const json& c : entry.at("chunks")) {
    const auto off = c.at("offsets").get<std::vector<int64_t>>();
    const auto size = c.at("sizes").get<std::vector<int64_t>>();
    const std::string file = c.at("file").get<std::string>();
    KILN_CHECK(off.size() == shape.size() && size.size() == shape.size(), Value,
               "checkpoint.load: a chunk of '", name, "' has ", off.size(), " offsets and ",
               size.size(), " sizes for a tensor of ", shape.size(), " dims");
    for (size_t k = 0; k < shape.size(); ++k)
      KILN_CHECK(off[k] >= 0 && size[k] >= 0 && off[k] <= shape[k] - size[k], Value,
                 "checkpoint.load: a chunk of '", name, "' at ", IntArrayRef(off), " of size ",
                 IntArrayRef(size), " lies outside its shape ", IntArrayRef(shape));
    std::vector<int64_t> lo(shape.size()), hi(shape.size());
    bool overlaps = true;
    for (size_t k = 0; k < shape.size(); ++k) {
      lo[k] = std::max(off[k], box.off[k]);
      hi[k] = std::min(off[k] + size[k], box.off[k] + box.size[k]);
      overlaps = overlaps && hi[k] > lo[k];
    }
    if (!overlaps) continue;
    KILN_CHECK(file.rfind("__", 0) == 0 && file.find('/') == std::string::npos, Value,
               "checkpoint.load: a chunk of '", name, "' names the file '", file,
               "', which is not a shard file of the checkpoint");
    auto it = files.find(file);
    if (it == files.end()) it = files.emplace(file, open_safetensors(root / file)).first;
    const Tensor src = read_entry(*it->second, name);  // this chunk only
    KILN_CHECK(src.sizes() == IntArrayRef(size) && src.dtype() == dtype, Value,
               "checkpoint.load: the chunk of '", name, "' in '", file, "' has shape ", src.sizes(),
               ", the metadata says ", IntArrayRef(size));
    KILN_CHECK(crc_of(src) == c.at("crc32").get<uint32_t>(), Value, "checkpoint.load: '", name,
               "' in '", (root / file).string(),
               "' is corrupt: its CRC-32 does not match the one saved");
    Tensor from = src, into = dst;
    int64_t n = 1;
    for (size_t k = 0; k < shape.size(); ++k) {
      from = from.narrow(static_cast<int64_t>(k), lo[k] - off[k], hi[k] - lo[k]);
      into = into.narrow(static_cast<int64_t>(k), lo[k] - box.off[k], hi[k] - lo[k]);
      n *= hi[k] - lo[k];
    }
    into.copy_(from);
    covered += n;
    for (const auto& [slo, shi] : seen) {  // no element twice: with the count, exactly once
      bool meet = true;
      for (size_t k = 0; k < shape.size(); ++k)
        meet = meet && std::max(lo[k], slo[k]) < std::min(hi[k], shi[k]);
      KILN_CHECK(!meet, Value, "checkpoint.load: two chunks of '", name, "' in '", dir,
                 "' overlap; the checkpoint is inconsistent");
    }
    seen.emplace_back(lo, hi);
  }
  KILN_CHECK(covered == box.numel(), Value, "checkpoint.load: the chunks of '", name, "' in '", dir,
             "' cover ", covered, " of the ", box.numel(),
             " elements this rank needs; the checkpoint is incomplete");
}

LoadResult load(const TensorMap& state, const std::string& dir, const bool strict) {
  if (on_gang(state, "checkpoint.load"))
    return detail::remote_hooks().checkpoint(state, dir, "{}", /*load=*/true, strict);
  const fs::path root(dir), mpath = root / kMetadata;
  KILN_CHECK(fs::exists(mpath), Value, "checkpoint.load: no checkpoint in '", dir, "' (", kMetadata,
             " is missing)");
  const json meta = read_json(mpath);
  wait_inflight();  // this process's async save commits first
  LoadResult res;
  std::map<std::string, std::unique_ptr<StFile>> files;  // headers and handles, not data
  try {
    KILN_CHECK(meta.at("format") == kFormat && meta.at("version") == kVersion, Value,
               "checkpoint.load: '", mpath.string(),
               "' is not a kiln distributed checkpoint of "
               "version ",
               kVersion);
    const json& tensors = meta.at("tensors");
    // This rank's own extra when the checkpoint was saved by as many ranks, else rank 0's.
    const json& per_rank = meta.contains("rank_extra") ? meta["rank_extra"] : json::array();
    res.extra = (per_rank.size() == static_cast<size_t>(world_size()) ? per_rank.at(rank())
                                                                      : meta.at("extra"))
                    .dump();
    for (const auto& [name, t] : state)
      if (!tensors.contains(name)) res.missing_keys.push_back(name);
    for (const auto& [name, entry] : tensors.items())
      if (!state.contains(name)) res.unexpected_keys.push_back(name);
    if (strict && (!res.missing_keys.empty() || !res.unexpected_keys.empty())) {
      std::string missing, unexpected;
      for (const std::string& k : res.missing_keys) missing += (missing.empty() ? "" : ", ") + k;
      for (const std::string& k : res.unexpected_keys)
        unexpected += (unexpected.empty() ? "" : ", ") + k;
      KILN_FAIL(Value, "checkpoint.load: '", dir, "' does not match the state: missing keys [",
                missing, "], unexpected keys [", unexpected, "]");
    }
    autograd::NoGradGuard no_grad;
    for (const auto& [name, t] : state) {
      if (!tensors.contains(name)) continue;
      const json& entry = tensors.at(name);
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      const ScalarType dtype = safetensors_dtype_from_name(entry.at("dtype").get<std::string>());
      t.check_defined(("checkpoint.load: '" + name + "'").c_str());
      KILN_CHECK(t.sizes() == IntArrayRef(shape) && t.dtype() == dtype, Value, "checkpoint.load: '",
                 name, "' is ", scalar_type_name(t.dtype()), " of shape ", t.sizes(), " here but ",
                 scalar_type_name(dtype), " of shape ", IntArrayRef(shape), " in the checkpoint");
      Tensor dst = t;
      Box box = whole(t.sizes());
      if (is_dtensor(t)) {
        const DTensorSpec& spec = detail::spec_of(t);
        for (const Placement& p : spec.placements)
          KILN_CHECK(!p.is_partial(), Value, "checkpoint.load: '", name, "' is ",
                     placements_str(spec.placements),
                     "; load into Shard or Replicate placements (a Partial value is ambiguous)");
        dst = detail::local_of(t);
        box = shard_box(spec, spec.placements);
      }
      fill_region(name, entry, shape, dtype, dst, box, root, dir, files);
      t.impl()->bump_version();
    }
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "checkpoint.load: '", mpath.string(), "' is malformed: ", e.what());
  }
  return res;
}

}  // namespace kiln::dist::checkpoint
