// Work and the collectives of a ProcessGroup (kiln/dist/process_group.h); the comm thread and the
// group state are in group.h, the registry of groups in registry.cpp.
//
// Note [Comm thread]: one thread per process runs every collective of every group, in the order
// the process issued them (PyTorch's contract: every rank issues the same collectives in the same
// order). It alone drives the UCX worker while collectives run, so UCX needs no locking, and a
// caller's Work completes when the thread has finished its collective.
//
// Note [Collective timeouts]: a collective gets the group's timeout from the moment the comm
// thread starts it. When a message misses that deadline, the group is aborted (every later
// collective on it fails at once), its flight recorder (the last kRecorderSize collectives: op,
// sequence number, sizes, state) goes to stderr, and the rank writes "<seq> <op>" under
// kiln/<generation>/<group>/timeout/<rank> in the store. It then waits a tenth of the timeout
// (0.2 to 2 s) for the other members' entries, which time out at about the same moment: a member at
// a different collective, or with no entry at all (dead, stuck outside collectives, or it skipped
// this one), is named in the error. A ring stalls behind the one rank that is missing, so the
// ranks' own "waiting for rank k" differs; the report names the culprit consistently.
#include "kiln/dist/process_group.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include "group.h"
#include "kiln/half.h"

namespace kiln::dist {

ReduceOp parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "avg") return ReduceOp::Avg;
  if (name == "max") return ReduceOp::Max;
  if (name == "min") return ReduceOp::Min;
  if (name == "product") return ReduceOp::Product;
  KILN_FAIL(Value, "unknown reduce op '", name, "': expected sum, avg, max, min or product");
}

const char* reduce_op_name(ReduceOp op) {
  static const char* names[] = {"sum", "avg", "max", "min", "product"};
  return names[static_cast<int>(op)];
}

// ---- Work
// ----------------------------------------------------------------------------------------

bool Work::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::chrono::steady_clock::time_point Work::finish_time() {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_at_;
}

namespace {
std::atomic<int64_t> g_wait_ns{0};  // collective_wait_seconds()
}  // namespace

double collective_wait_seconds() { return static_cast<double>(g_wait_ns.load()) * 1e-9; }

void Work::wait(std::optional<Milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {  // the time a caller spends waiting for a collective (Note [Step telemetry])
    const auto start = std::chrono::steady_clock::now();
    struct Count {
      std::chrono::steady_clock::time_point start;
      ~Count() { g_wait_ns += (std::chrono::steady_clock::now() - start).count(); }
    } count{start};
    if (!timeout)
      cv_.wait(lock, [&] { return done_; });
    else if (!cv_.wait_for(lock, *timeout, [&] { return done_; }))
      KILN_FAIL(Runtime, what_, ": Work::wait timed out after ", timeout->count(), " ms");
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    finished_at_ = std::chrono::steady_clock::now();
    error_ = std::move(error);
  }
  cv_.notify_all();
}

// ---- The comm thread
// -----------------------------------------------------------------------------

namespace {

// float16/bfloat16 travel and reduce as float32 (the reduction arithmetic is float32).
bool is_half(ScalarType t) { return t == kBFloat16 || t == kFloat16; }

void widen(const Tensor& t, float* out) {
  const int64_t n = t.numel();
  if (t.dtype() == kBFloat16) {
    auto* s = static_cast<const BFloat16*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(s[i]);
  } else {
    auto* s = static_cast<const Half*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(s[i]);
  }
}

void narrow(const float* in, int64_t n, const Tensor& t) {
  if (t.dtype() == kBFloat16) {
    auto* d = static_cast<BFloat16*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) d[i] = BFloat16(in[i]);
  } else {
    auto* d = static_cast<Half*>(t.data_ptr());
    for (int64_t i = 0; i < n; ++i) d[i] = Half(in[i]);
  }
}

}  // namespace

CommThread::CommThread() : wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  KILN_CHECK(wake_fd_ >= 0, Runtime, "eventfd for the comm thread failed: ", std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  thread_.join();
  close(wake_fd_);
}

void CommThread::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  // The counter keeps the wake-up until the thread reads it, so none is lost between the thread's
  // look at the queue and its poll().
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
}

void CommThread::drain() {
  Work done("comm thread");
  post([&] {
    while (!in_flight_.empty())
      if (!poll_in_flight()) sleep();
    done.finish();
  });
  done.wait();
}

bool CommThread::poll_in_flight() {
  const size_t before = in_flight_.size();
  std::erase_if(in_flight_, [](InFlight& f) { return f.test(); });
  return in_flight_.size() < before;
}

// See Note [Blocking progress] (ucx.h). Arming fails while a worker has unprocessed events; the
// thread then progresses again instead of sleeping. An operation with no transport is retested
// every 20 µs. Pollers check their deadlines, so the thread wakes at least every 10 ms.
void CommThread::sleep() {
  std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
  int timeout_ms = 10;
  for (const InFlight& f : in_flight_) {
    if (!f.transport) {
      timeout_ms = 0;
      continue;
    }
    const int fd = f.transport->arm();
    if (fd < 0) return;
    if (std::none_of(fds.begin(), fds.end(), [&](const pollfd& p) { return p.fd == fd; }))
      fds.push_back({fd, POLLIN, 0});
  }
  if (timeout_ms == 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    return;
  }
  poll(fds.data(), fds.size(), timeout_ms);
}

void CommThread::run() {
  for (int idle = 0;;) {
    std::function<void()> task;
    bool stop = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop = stop_ && queue_.empty() && in_flight_.empty();
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (stop) return;
    if (task) task();
    idle = poll_in_flight() || task ? 0 : idle + 1;
    if (task) continue;
    // Nothing queued: spin briefly while messages flow, then sleep.
    if (in_flight_.empty()) {
      uint64_t n;
      pollfd p{wake_fd_, POLLIN, 0};
      while (read(wake_fd_, &n, sizeof n) < 0 && errno == EAGAIN) poll(&p, 1, -1);
    } else if (idle > 100) {
      sleep();
      uint64_t n;
      (void)!read(wake_fd_, &n, sizeof n);
    }
  }
}

Milliseconds env_timeout() {
  const char* s = std::getenv("KILN_COMM_TIMEOUT_S");
  if (!s || !*s) return std::chrono::seconds(60);
  char* end = nullptr;
  double v = std::strtod(s, &end);
  KILN_CHECK(end && *end == '\0' && v > 0, Value,
             "KILN_COMM_TIMEOUT_S must be a positive number of seconds, got '", s, "'");
  return Milliseconds(static_cast<int64_t>(v * 1000));
}

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  if (!s || !*s) return fallback;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  KILN_CHECK(end && *end == '\0', Value, name, " must be an integer, got '", s, "'");
  return static_cast<int>(v);
}

// Note [No fork after init]: a child forked after init_process_group inherits neither the comm
// thread nor a usable UCX worker, so its collectives would wait forever. The child handler marks
// it, and every collective then raises instead (ranks must be started with exec). Only the
// comm thread drives UCX, and it is not copied into the child, so the parent is unaffected.
std::atomic<bool> forked_after_init{false};

void watch_for_fork() {
  static const int once = pthread_atfork(nullptr, nullptr, [] { forked_after_init = true; });
  (void)once;
}

// ---- ProcessGroup
// --------------------------------------------------------------------------------

namespace {

std::string shape_str(const Tensor& t) {
  std::ostringstream os;
  os << t.dtype() << t.sizes();
  return os.str();
}

void check_tensor(const char* op, const Tensor& t, bool fake = false) {
  KILN_CHECK(t.defined(), Value, op, ": expected a tensor, got an undefined one");
  KILN_CHECK(t.device().is_cpu() || (fake && t.is_meta()), Value, op,
             fake ? ": the fake backend takes CPU or meta tensors, got "
                  : ": the UCX backend takes CPU tensors, got ",
             t.device());
  KILN_CHECK(t.is_contiguous(), Value, op, ": expected a contiguous tensor, got shape ", t.sizes(),
             " strides ", t.strides());
  // The transport touches the memory on its own thread: ops deferred into it run first, here
  // (Note [Storage access hook]).
  (void)t.impl()->storage()->data();
}

void check_reducible(const char* op, const Tensor& t) {
  KILN_CHECK(t.dtype() != kBool, Type, op, ": cannot reduce bool tensors");
}

// Note [Fake process group]: backend "fake" (init_process_group with rank and world_size, no
// store) makes groups of any size in one process with no transport: every collective checks its
// arguments as the real one does, counts the bytes this rank would send by the ring algorithms
// of comm/collectives.cpp (all_reduce 2(n-1)/n of the tensor, all_gather (n-1) inputs,
// reduce_scatter (n-1)/n of the input, all_to_all what goes to the others, broadcast and send
// the tensor), and completes at once, leaving its outputs as they were. With meta tensors this
// plans a run of any size without running it (kiln/dist/plan.h).
std::mutex g_fake_mu;
std::map<std::string, CommStats, std::less<>>& fake_stats() {
  static std::map<std::string, CommStats, std::less<>> s;
  return s;
}

WorkPtr fake_done(const char* op, const ProcessGroup& pg, double bytes) {
  {
    std::lock_guard<std::mutex> lock(g_fake_mu);
    CommStats& c = fake_stats()[op];
    ++c.calls;
    c.bytes += static_cast<int64_t>(bytes);
  }
  auto w = std::make_shared<Work>(std::string(op) + " on fake group '" + pg.name() + "'");
  w->finish();
  return w;
}

}  // namespace

std::map<std::string, CommStats, std::less<>> fake_comm_stats() {
  std::lock_guard<std::mutex> lock(g_fake_mu);
  return fake_stats();
}

void reset_fake_comm_stats() {
  std::lock_guard<std::mutex> lock(g_fake_mu);
  fake_stats().clear();
}

namespace {
std::atomic<CollectiveObserver> g_observer{nullptr};
}  // namespace

void set_collective_observer(CollectiveObserver observer) { g_observer.store(observer); }

void detail::observe_collective(const CollectiveEvent& e) {
  if (CollectiveObserver f = g_observer.load(std::memory_order_relaxed)) f(e);
}

ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size(); }
const std::string& ProcessGroup::name() const { return impl_->name; }
bool ProcessGroup::fake() const { return impl_->fake; }
Milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
const std::vector<int>& ProcessGroup::ranks() const { return impl_->ranks; }
std::string ProcessGroup::dump_recent() const { return impl_->dump(); }
void ProcessGroup::abort(const std::string& why) {
  if (impl_->transport) impl_->transport->abort(why);
}

WorkPtr ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  if (impl_->nccl) return impl_->nccl->all_reduce(tensor, op);
  check_tensor("all_reduce", tensor, impl_->fake);
  check_reducible("all_reduce", tensor);
  const int n = size();
  if (impl_->fake)
    return fake_done("all_reduce", *this, 2.0 * (n - 1) / n * static_cast<double>(tensor.nbytes()));
  return impl_->issue(
      "all_reduce", shape_str(tensor),
      [tensor, op, n](Exchange& x) {
        const int64_t numel = tensor.numel();
        if (!is_half(tensor.dtype())) {
          dist::all_reduce(x, tensor.data_ptr(), numel, tensor.dtype(), op);
          if (op == ReduceOp::Avg) divide_by(tensor.data_ptr(), numel, tensor.dtype(), n);
          return;
        }
        auto* wide = static_cast<float*>(scratch(1, numel * sizeof(float)));
        widen(tensor, wide);
        dist::all_reduce(x, wide, numel, kFloat32, op);
        if (op == ReduceOp::Avg) divide_by(wide, numel, kFloat32, n);
        narrow(wide, numel, tensor);
      },
      OpKind::AllReduce);
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, int src) {
  if (impl_->nccl) return impl_->nccl->broadcast(tensor, src);
  check_tensor("broadcast", tensor, impl_->fake);
  KILN_CHECK(src >= 0 && src < size(), Value, "broadcast: src ", src, " is not a rank of group '",
             name(), "' of size ", size());
  if (impl_->fake)
    return fake_done("broadcast", *this, rank() == src ? static_cast<double>(tensor.nbytes()) : 0);
  return impl_->issue(
      "broadcast", shape_str(tensor),
      [tensor, src](Exchange& x) { dist::broadcast(x, tensor.data_ptr(), tensor.nbytes(), src); },
      OpKind::Broadcast);
}

WorkPtr ProcessGroup::all_gather_into_tensor(Tensor& output, const Tensor& input) {
  if (impl_->nccl) return impl_->nccl->all_gather_into_tensor(output, input);
  check_tensor("all_gather_into_tensor", output, impl_->fake);
  check_tensor("all_gather_into_tensor", input, impl_->fake);
  KILN_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * size(), Value,
             "all_gather_into_tensor: output ", shape_str(output), " must hold ", size(),
             " copies of input ", shape_str(input));
  if (impl_->fake)
    return fake_done("all_gather_into_tensor", *this,
                     static_cast<double>(size() - 1) * static_cast<double>(input.nbytes()));
  return impl_->issue(
      "all_gather_into_tensor", shape_str(input),
      [output, input](Exchange& x) {
        const size_t elem = element_size(input.dtype());
        const int64_t block = input.numel();
        std::vector<int64_t> off(x.size() + 1);
        for (int i = 0; i <= x.size(); ++i) off[i] = i * block;
        if (block)
          std::memcpy(static_cast<char*>(output.data_ptr()) + off[x.rank()] * elem,
                      input.data_ptr(), block * elem);
        ring_all_gather(x, output.data_ptr(), off, elem, 0);
      },
      OpKind::AllGather);
}

WorkPtr ProcessGroup::reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op) {
  if (impl_->nccl) return impl_->nccl->reduce_scatter_tensor(output, input, op);
  check_tensor("reduce_scatter_tensor", output, impl_->fake);
  check_tensor("reduce_scatter_tensor", input, impl_->fake);
  check_reducible("reduce_scatter_tensor", input);
  KILN_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size(), Value,
             "reduce_scatter_tensor: input ", shape_str(input), " must hold ", size(),
             " blocks of output ", shape_str(output));
  const int n = size();
  if (impl_->fake)
    return fake_done("reduce_scatter_tensor", *this,
                     static_cast<double>(n - 1) / n * static_cast<double>(input.nbytes()));
  return impl_->issue(
      "reduce_scatter_tensor", shape_str(input),
      [output, input, op, n](Exchange& x) {
        const int64_t block = output.numel();
        const ScalarType wt = is_half(input.dtype()) ? kFloat32 : input.dtype();
        const size_t elem = element_size(wt);
        // The ring reduces in place: work on a copy (float32 for float16/bfloat16).
        char* buf = static_cast<char*>(scratch(1, input.numel() * elem));
        if (is_half(input.dtype()))
          widen(input, reinterpret_cast<float*>(buf));
        else if (input.numel())
          std::memcpy(buf, input.data_ptr(), input.nbytes());
        std::vector<int64_t> off(n + 1);
        for (int i = 0; i <= n; ++i) off[i] = i * block;
        ring_reduce_scatter(x, buf, off, wt, op, 0);
        char* mine = buf + off[x.rank()] * elem;
        if (op == ReduceOp::Avg) divide_by(mine, block, wt, n);
        if (is_half(input.dtype()))
          narrow(reinterpret_cast<float*>(mine), block, output);
        else if (block)
          std::memcpy(output.data_ptr(), mine, block * elem);
      },
      OpKind::ReduceScatter);
}

WorkPtr ProcessGroup::all_to_all_single(Tensor& output, const Tensor& input,
                                        std::vector<int64_t> output_split_sizes,
                                        std::vector<int64_t> input_split_sizes) {
  if (impl_->nccl)
    return impl_->nccl->all_to_all_single(output, input, output_split_sizes, input_split_sizes);
  const char* op = "all_to_all_single";
  check_tensor(op, output, impl_->fake);
  check_tensor(op, input, impl_->fake);
  const int n = size();
  KILN_CHECK(output.dtype() == input.dtype() && input.dim() >= 1 && output.dim() >= 1, Value, op,
             ": expected input and output of one dtype with at least one dim, got ",
             shape_str(input), " and ", shape_str(output));
  auto splits = [&](std::vector<int64_t>& s, const Tensor& t, const char* which) {
    if (s.empty()) {
      KILN_CHECK(t.size(0) % n == 0, Value, op, ": dim 0 of the ", which, " ", shape_str(t),
                 " must be divisible by the group size ", n, " for equal splits");
      s.assign(n, t.size(0) / n);
    }
    KILN_CHECK(static_cast<int>(s.size()) == n, Value, op, ": expected ", n, " ", which,
               " split sizes, got ", s.size());
    KILN_CHECK(std::accumulate(s.begin(), s.end(), int64_t{0}) == t.size(0), Value, op, ": ", which,
               " split sizes must sum to dim 0 of ", shape_str(t));
  };
  splits(input_split_sizes, input, "input");
  splits(output_split_sizes, output, "output");
  const size_t row_in = input.size(0) ? input.nbytes() / input.size(0) : 0;
  const size_t row_out = output.size(0) ? output.nbytes() / output.size(0) : 0;
  auto bytes_of = [](const std::vector<int64_t>& s, size_t row, std::vector<size_t>& off,
                     std::vector<size_t>& len) {
    size_t at = 0;
    for (int64_t v : s) {
      off.push_back(at);
      len.push_back(v * row);
      at += v * row;
    }
  };
  std::vector<size_t> in_off, in_len, out_off, out_len;
  bytes_of(input_split_sizes, row_in, in_off, in_len);
  bytes_of(output_split_sizes, row_out, out_off, out_len);
  if (impl_->fake)
    return fake_done(op, *this, static_cast<double>(input.nbytes() - in_len[rank()]));
  return impl_->issue(
      op, shape_str(input),
      [=](Exchange& x) {
        dist::all_to_all(x, input.data_ptr(), in_off, in_len, output.data_ptr(), out_off, out_len);
      },
      OpKind::AllToAll);
}

// send/recv's arguments: a contiguous CPU tensor, another rank of the group, a tag that fits.
void ProcessGroup::check_p2p(const char* op, const char* peer_name, const Tensor& tensor, int peer,
                             int tag) const {
  check_tensor(op, tensor, impl_->fake);
  KILN_CHECK(peer >= 0 && peer < size() && peer != rank(), Value, op, ": ", peer_name, " ", peer,
             " must be another rank of group '", name(), "' of size ", size());
  KILN_CHECK(tag >= 0 && tag < (1 << 19), Value, op, ": tag must be in [0, 2^19), got ", tag);
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  if (impl_->nccl) return impl_->nccl->send(tensor, dst);
  check_p2p("send", "dst", tensor, dst, tag);
  if (impl_->fake) return fake_done("send", *this, static_cast<double>(tensor.nbytes()));
  uint32_t msg = impl_->next_p2p(impl_->sends_, dst, tag);
  return impl_->issue(
      "send", shape_str(tensor),
      [tensor, dst, msg](Exchange& x) { x.send(dst, msg, tensor.data_ptr(), tensor.nbytes()); },
      OpKind::P2P, tag);
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, int tag) {
  if (impl_->nccl) return impl_->nccl->recv(tensor, src);
  check_p2p("recv", "src", tensor, src, tag);
  if (impl_->fake) return fake_done("recv", *this, 0);
  uint32_t msg = impl_->next_p2p(impl_->recvs_, src, tag);
  return impl_->issue(
      "recv", shape_str(tensor),
      [tensor, src, msg](Exchange& x) { x.recv(src, msg, tensor.data_ptr(), tensor.nbytes()); },
      OpKind::P2P, tag);
}

WorkPtr ProcessGroup::barrier() {
  if (impl_->nccl) return impl_->nccl->barrier();
  if (impl_->fake) return fake_done("barrier", *this, 0);
  return impl_->issue(
      "barrier", "", [](Exchange& x) { dist::barrier(x); }, OpKind::Barrier);
}

// ---- Registry
// ------------------------------------------------------------------------------------

}  // namespace kiln::dist
