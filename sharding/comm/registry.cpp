// The registry of process groups: init_process_group, new_group, find_group and
// destroy_process_group (kiln/dist/process_group.h), and the launch environment.
#include <algorithm>
#include <map>
#include <numeric>

#include "group.h"

namespace kiln::dist {

namespace {

// Note [Launch environment]: PyTorch's launch contract. RANK and WORLD_SIZE name this process;
// MASTER_ADDR:MASTER_PORT is the store, hosted by rank 0 unless KILN_AGENT_STORE=1 says the
// launcher (`kiln run`, or a test harness) hosts it (torchrun's TORCHELASTIC_USE_AGENT_STORE).
struct Registry {
  std::mutex mu;
  std::map<std::string, ProcessGroupPtr, std::less<>> groups;
  ProcessGroupPtr world;
  std::shared_ptr<UcxTransport> transport;
  std::shared_ptr<TCPStore> store;
  std::shared_ptr<NcclComm> world_nccl;  // the world's, parent of the subgroups' (backend "nccl")
  int next_group_id = 1;
  int generation = 0;
  bool fake = false;  // backend "fake" (Note [Fake process group] in process_group.cpp)
  // Last, so it is destroyed first: at exit it finishes the queued collectives before the groups
  // and the transport go away.
  CommThread thread;

  // With `mu` held.
  void clear() {
    thread.drain();  // every queued collective ends within its timeout
    groups.clear();
    world.reset();
    transport.reset();
    world_nccl.reset();
    store.reset();
    next_group_id = 1;
    fake = false;
  }

  void add(const ProcessGroupPtr& pg) {
    KILN_CHECK(!groups.count(pg->name()), Value, "a process group named '", pg->name(),
               "' exists already");
    groups[pg->name()] = pg;
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

ProcessGroupPtr make_group(Registry& reg, std::string name, std::vector<int> ranks, int rank,
                           int id, Milliseconds timeout, std::shared_ptr<NcclComm> nccl = nullptr) {
  watch_for_fork();
  auto impl = std::make_shared<ProcessGroupImpl>();
  impl->name = std::move(name);
  impl->ranks = std::move(ranks);
  impl->rank = rank;
  impl->id = id;
  impl->generation = reg.generation;
  impl->timeout = timeout;
  impl->transport = impl->ranks.size() > 1 ? reg.transport : nullptr;
  impl->store = reg.store;
  impl->thread = &reg.thread;
  impl->nccl = std::move(nccl);
  impl->fake = reg.fake;
  return std::make_shared<ProcessGroup>(std::move(impl));
}

}  // namespace

ProcessGroupPtr init_process_group(const InitOptions& o) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  KILN_CHECK(!reg.world, Value,
             "init_process_group: the default group exists already (call "
             "destroy_process_group first)");
#ifdef KILN_HAVE_NCCL
  KILN_CHECK(o.backend == "ucx" || o.backend == "nccl" || o.backend == "fake", Value,
             "init_process_group: unknown backend '", o.backend,
             "' (this build has: ucx, nccl, fake)");
#else
  KILN_CHECK(o.backend == "ucx" || o.backend == "fake", Value,
             "init_process_group: unknown backend '", o.backend,
             "' (this build has: ucx, fake; nccl needs a build with CUDA and NCCL)");
#endif
  if (o.backend == "fake") {
    KILN_CHECK(o.init_method.empty() && o.rank >= 0 && o.world_size >= 1 && o.rank < o.world_size,
               Value,
               "init_process_group(\"fake\"): pass init_method \"\", rank and world_size with "
               "0 <= rank < world_size, got rank ",
               o.rank, ", world_size ", o.world_size);
    reg.fake = true;
    reg.generation += 1;
    std::vector<int> ranks(o.world_size);
    std::iota(ranks.begin(), ranks.end(), 0);
    reg.world = make_group(reg, o.group_name, std::move(ranks), o.rank, 0,
                           o.timeout.value_or(env_timeout()));
    reg.add(reg.world);
    return reg.world;
  }
  const Milliseconds timeout = o.timeout.value_or(env_timeout());
  int rank = o.rank, world = o.world_size;
  std::shared_ptr<TCPStore> store = o.store;
  if (o.init_method == "env://") {
    rank = env_int("RANK", -1);
    world = env_int("WORLD_SIZE", -1);
    KILN_CHECK(rank >= 0 && world >= 1 && rank < world, Value,
               "init_process_group(env://): RANK and WORLD_SIZE must be set with 0 <= RANK < "
               "WORLD_SIZE, got RANK=",
               rank, " WORLD_SIZE=", world);
    if (world > 1) {
      const char* addr = std::getenv("MASTER_ADDR");
      const int port = env_int("MASTER_PORT", -1);
      KILN_CHECK(port > 0, Value, "init_process_group(env://): MASTER_PORT must be set");
      const bool host = rank == 0 && env_int("KILN_AGENT_STORE", 0) == 0;
      store = std::make_shared<TCPStore>(addr && *addr ? addr : "127.0.0.1", port, host, timeout);
    }
  } else {
    KILN_CHECK(o.init_method.empty(), Value, "init_process_group: unsupported init_method '",
               o.init_method, "' (use \"env://\", or \"\" with rank, world_size and store)");
    KILN_CHECK(rank >= 0 && world >= 1 && rank < world, Value,
               "init_process_group: need 0 <= "
               "rank < world_size, got rank ",
               rank, ", world_size ", world);
    KILN_CHECK(world == 1 || store, Value, "init_process_group: a store is needed for world_size ",
               world);
  }
  // The key prefix of this initialisation: counted per rank in the store itself, so ranks
  // agree however many groups their processes joined before (a worker joins one per gang).
  reg.generation = store ? static_cast<int>(store->add("kiln/inits/" + std::to_string(rank), 1))
                         : reg.generation + 1;
  std::shared_ptr<NcclComm> nccl;
#ifdef KILN_HAVE_NCCL
  if (o.backend == "nccl")
    nccl = nccl_init(store.get(), "kiln/" + std::to_string(reg.generation) + "/nccl", rank, world,
                     o.group_name, timeout);
#endif
  reg.store = store;
  reg.world_nccl = nccl;
  if (world > 1 && !nccl) {
    reg.transport = std::make_shared<UcxTransport>(
        *store, "kiln/" + std::to_string(reg.generation) + "/ucx/", rank, world);
  }
  std::vector<int> ranks(world);
  std::iota(ranks.begin(), ranks.end(), 0);
  reg.world = make_group(reg, o.group_name, std::move(ranks), rank, 0, timeout, std::move(nccl));
  reg.add(reg.world);
  return reg.world;
}

bool is_initialized() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  return static_cast<bool>(reg.world);
}

ProcessGroupPtr default_group() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  KILN_CHECK(reg.world, Value, "no default process group: call init_process_group first");
  return reg.world;
}

ProcessGroupPtr new_group(const std::vector<int>& ranks, std::optional<Milliseconds> timeout,
                          std::string name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  KILN_CHECK(reg.world, Value, "new_group: call init_process_group first");
  const int world = reg.world->size();
  std::vector<bool> seen(world, false);
  for (int r : ranks) {
    KILN_CHECK(r >= 0 && r < world && !seen[r], Value,
               "new_group: ranks must be distinct world "
               "ranks in [0, ",
               world, "), got ", IntArrayRef(std::vector<int64_t>(ranks.begin(), ranks.end())));
    seen[r] = true;
  }
  // A group id has 6 bits (See Note [Collective tags] in comm/collectives.h).
  KILN_CHECK(reg.fake || reg.next_group_id < 64, Value,
             "new_group: at most 63 subgroups per "
             "init_process_group (destroy_process_group starts the count afresh)");
  const int id = reg.next_group_id++;
  if (name.empty()) name = "group" + std::to_string(id);
  auto me = std::find(ranks.begin(), ranks.end(), reg.world->rank());
  const int rank = static_cast<int>(me - ranks.begin());
  std::shared_ptr<NcclComm> nccl;
#ifdef KILN_HAVE_NCCL
  if (NcclComm* parent = reg.world_nccl.get())
    nccl =
        nccl_split(*parent, me != ranks.end(), rank, name, timeout.value_or(reg.world->timeout()));
#endif
  if (me == ranks.end()) return nullptr;
  auto pg = make_group(reg, std::move(name), ranks, rank, id,
                       timeout.value_or(reg.world->timeout()), std::move(nccl));
  reg.add(pg);
  return pg;
}

ProcessGroupPtr new_local_group(std::string name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto pg = make_group(reg, std::move(name), {0}, 0, 0, env_timeout());
  reg.add(pg);
  return pg;
}

ProcessGroupPtr find_group(std::string_view name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.groups.find(name);
  if (it != reg.groups.end()) return it->second;
  std::string known;
  for (auto& [n, g] : reg.groups) known += (known.empty() ? "'" : ", '") + n + "'";
  KILN_FAIL(Value, "no process group named '", name, "' (known: ", known.empty() ? "none" : known,
            "; call init_process_group or new_group first)");
}

std::string dump_all_groups() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  std::string out;
  for (const auto& [name, g] : reg.groups) {
    std::string recent = g->dump_recent();
    out += "group '" + name + "' (rank " + std::to_string(g->rank()) + " of " +
           std::to_string(g->size()) + ")" +
           (recent.empty() ? ": no collectives yet\n" : ":\n" + recent);
  }
  return out;
}

void abort_process_groups(const std::string& why) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  for (const auto& [name, g] : reg.groups) g->abort(why);
}

void destroy_process_group() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.clear();
}

int local_rank() { return env_int("LOCAL_RANK", 0); }
int local_world_size() { return env_int("LOCAL_WORLD_SIZE", 1); }

}  // namespace kiln::dist
