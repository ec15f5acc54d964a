// Process groups, the communication thread and the group registry (kiln/dist/process_group.h).
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

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

#include "collectives.h"
#include "kiln/error.h"
#include "kiln/half.h"
#include "nccl.h"

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

void Work::wait(std::optional<Milliseconds> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!timeout)
    cv_.wait(lock, [&] { return done_; });
  else if (!cv_.wait_for(lock, *timeout, [&] { return done_; }))
    KILN_FAIL(Runtime, what_, ": Work::wait timed out after ", timeout->count(), " ms");
  if (error_) std::rethrow_exception(error_);
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

// ---- The comm thread
// -----------------------------------------------------------------------------

namespace {

class CommThread {
 public:
  // Returns true once its operation has finished (Work completed).
  using Poller = std::function<bool()>;

  CommThread() : thread_([this] { run(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // From a task: keep testing an operation that is in flight (point-to-point) while the thread
  // goes on with the queue.
  void add_in_flight(Poller p) { in_flight_.push_back(std::move(p)); }
  // Waits until everything queued so far, and every operation in flight, has finished.
  void drain() {
    Work done("comm thread");
    post([&] {
      while (!in_flight_.empty()) poll_in_flight();
      done.finish();
    });
    done.wait();
  }

 private:
  // True when some operation finished.
  bool poll_in_flight() {
    const size_t before = in_flight_.size();
    std::erase_if(in_flight_, [](Poller& p) { return p(); });
    return in_flight_.size() < before;
  }

  void run() {
    for (int idle = 0;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        auto ready = [&] { return stop_ || !queue_.empty(); };
        if (in_flight_.empty())
          cv_.wait(lock, ready);
        else if (idle > 2000)
          cv_.wait_for(lock, std::chrono::microseconds(20), ready);
        if (stop_ && queue_.empty() && in_flight_.empty()) return;
        if (!queue_.empty()) {
          task = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      if (task) task();
      idle = poll_in_flight() || task ? 0 : idle + 1;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<Poller> in_flight_;  // the thread's own
  std::thread thread_;
};

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

constexpr size_t kRecorderSize = 64;

// Note [No fork after init]: a child forked after init_process_group inherits neither the comm
// thread nor a usable UCX worker, so its collectives would wait forever. The child handler marks
// it, and every collective then raises instead (ranks must be started with exec). Only the
// comm thread drives UCX, and it is not copied into the child, so the parent is unaffected.
std::atomic<bool> forked_after_init{false};

void watch_for_fork() {
  static const int once = pthread_atfork(nullptr, nullptr, [] { forked_after_init = true; });
  (void)once;
}

}  // namespace

// ---- ProcessGroupImpl
// ----------------------------------------------------------------------------

class ProcessGroupImpl : public std::enable_shared_from_this<ProcessGroupImpl> {
 public:
  struct Record {
    uint64_t id;
    uint64_t seq;
    bool p2p;
    std::string op;
    std::string sizes;
    const char* state;
  };

  std::string name;
  int rank = 0;
  std::vector<int> ranks;  // world ranks of the members
  int id = 0;              // for tags (Note [Collective tags])
  int generation = 0;
  Milliseconds timeout{60000};
  std::shared_ptr<UcxTransport> transport;  // null for a one-rank group
  std::shared_ptr<TCPStore> store;
  CommThread* thread = nullptr;  // the registry's
  std::shared_ptr<NcclComm> nccl;  // backend "nccl": every collective goes there instead

  int size() const { return static_cast<int>(ranks.size()); }

  // Issues a collective: `body` runs on the comm thread with the collective's messages and
  // returns when they have completed. A point-to-point op (`p2p_tag` set) has its own sequence
  // (collectives' sequence numbers must agree across ranks; sends and receives differ by rank):
  // `body` only posts its message, and the thread tests it while it goes on with the queue, so a
  // recv issued before the matching send of the same process does not block it.
  WorkPtr issue(const char* op, std::string sizes, std::function<void(Exchange&)> body, OpKind kind,
                std::optional<uint64_t> p2p_tag = std::nullopt) {
    KILN_CHECK(!forked_after_init, Runtime, op, " on group '", name,
               "': this process was forked "
               "after init_process_group; collectives are unavailable in a forked child (start "
               "ranks with exec, never fork after init)");
    uint64_t seq, record;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = p2p_tag ? ++p2p_seq_ : ++seq_;
      record = ++records_issued_;
      records_.push_back({record, seq, p2p_tag.has_value(), op, std::move(sizes), "queued"});
      if (records_.size() > kRecorderSize) records_.pop_front();
    }
    std::string what = describe(op, seq, p2p_tag.has_value());
    auto work = std::make_shared<Work>(what);
    thread->post([this, self = shared_from_this(), op, seq, record, kind, p2p_tag, what, work,
                  body = std::move(body)] {
      if (aborted_) {
        set_state(record, "skipped");
        return work->finish(std::make_exception_ptr(
            Error(ErrorKind::Runtime,
                  what + ": the group was aborted by an earlier failure: " + abort_reason_)));
      }
      set_state(record, "started");
      auto x = std::make_shared<Exchange>(transport.get(), ranks, rank,
                                          Exchange::tag_base(id, kind, p2p_tag.value_or(seq)),
                                          Clock::now() + timeout);
      auto finished = [this, op, seq, record, work, p2p_tag](const std::exception_ptr& error) {
        if (!error) {
          set_state(record, "completed");
          return work->finish();
        }
        try {
          std::rethrow_exception(error);
        } catch (const PeerTimeout& t) {
          set_state(record, "timed out");
          std::ostringstream why;
          why << "timed out after " << timeout.count() << " ms waiting to "
              << (t.is_recv ? "receive from" : "send to") << " rank " << t.peer;
          work->finish(std::make_exception_ptr(failed(op, seq, why.str(), p2p_tag.has_value())));
        } catch (const std::exception& e) {
          set_state(record, "failed");
          if (size() == 1) return work->finish(error);  // no peers to abort
          work->finish(std::make_exception_ptr(
              failed(op, seq, std::string("failed: ") + e.what(), p2p_tag.has_value())));
        }
      };
      try {
        body(*x);
        if (!p2p_tag) return finished(nullptr);
      } catch (...) {
        return finished(std::current_exception());
      }
      thread->add_in_flight([x, finished, self] {
        try {
          if (!x->test_all()) return false;
          finished(nullptr);
        } catch (...) {
          finished(std::current_exception());
        }
        return true;
      });
    });
    return work;
  }

  std::string dump() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream os;
    for (const Record& r : records_)
      os << "  " << (r.p2p ? "p2p #" : "#") << r.seq << " " << r.op << " " << r.sizes << ": "
         << r.state << "\n";
    return os.str();
  }

  uint32_t next_p2p(std::map<std::pair<int, int>, uint32_t>& counters, int peer, int tag) {
    std::lock_guard<std::mutex> lock(mu_);
    return counters[{peer, tag}]++;
  }
  std::map<std::pair<int, int>, uint32_t> sends_, recvs_;

 private:
  std::string describe(const char* op, uint64_t seq, bool p2p = false) const {
    return std::string(op) + (p2p ? " p2p #" : " #") + std::to_string(seq) + " on group '" + name +
           "' (rank " + std::to_string(rank) + " of " + std::to_string(size()) + ")";
  }

  void set_state(uint64_t record, const char* state) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Record& r : records_)
      if (r.id == record) r.state = state;
  }

  void abort(const std::string& reason) {
    if (aborted_) return;
    abort_reason_ = reason;
    aborted_ = true;
    if (transport) transport->mark_broken();
  }

  // Note [Collective timeouts]: a collective that timed out or failed in its transport.
  // Point-to-point ops get no desync report: their sequence numbers differ across ranks.
  Error failed(const char* op, uint64_t seq, const std::string& why, bool p2p) {
    std::ostringstream msg;
    msg << describe(op, seq, p2p) << " " << why;
    abort(msg.str());
    if (!p2p) msg << desync_report(op, seq);
    std::cerr << "kiln.dist: " << msg.str() << "\nkiln.dist: last collectives of group '" << name
              << "' on rank " << rank << ":\n"
              << dump() << std::flush;
    return Error(ErrorKind::Runtime, msg.str());
  }

  std::string desync_report(const char* op, uint64_t seq) {
    if (!store) return "";
    const std::string prefix = "kiln/" + std::to_string(generation) + "/" + name + "/timeout/";
    const std::string mine = std::to_string(seq) + " " + op;
    std::ostringstream out;
    try {
      store->set(prefix + std::to_string(rank), mine);
      const auto window = std::clamp(timeout / 10, Milliseconds(200), Milliseconds(2000));
      const auto deadline = Clock::now() + window;
      std::vector<int> missing;
      for (int r = 0; r < size(); ++r)
        if (r != rank) missing.push_back(r);
      std::map<int, std::string> seen;
      while (!missing.empty() && Clock::now() < deadline) {
        std::vector<int> still;
        for (int r : missing) {
          if (store->check({prefix + std::to_string(r)}))
            seen[r] = store->get(prefix + std::to_string(r));
          else
            still.push_back(r);
        }
        missing = std::move(still);
        if (!missing.empty()) std::this_thread::sleep_for(Milliseconds(50));
      }
      std::string culprits;
      for (int r : missing)
        culprits += "; rank " + std::to_string(r) + " never reached " + op + " #" +
                    std::to_string(seq) +
                    " (it died, is stuck outside a collective, or skipped it)";
      for (auto& [r, s] : seen)
        if (s != mine)
          culprits += "; rank " + std::to_string(r) + " is at " + s.substr(s.find(' ') + 1) + " #" +
                      s.substr(0, s.find(' ')) + " instead (a skipped or reordered collective)";
      if (culprits.empty())
        out << "; every rank reports the same collective (a slow or stuck transport)";
      else
        out << culprits;
    } catch (const Error& e) {
      out << "; no desync report (store unreachable: " << e.what() << ")";
    }
    return out.str();
  }

  mutable std::mutex mu_;
  uint64_t seq_ = 0, p2p_seq_ = 0, records_issued_ = 0;
  std::deque<Record> records_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
};

// ---- ProcessGroup
// --------------------------------------------------------------------------------

namespace {

std::string shape_str(const Tensor& t) {
  std::ostringstream os;
  os << t.dtype() << t.sizes();
  return os.str();
}

void check_tensor(const char* op, const Tensor& t) {
  KILN_CHECK(t.defined(), Value, op, ": expected a tensor, got an undefined one");
  KILN_CHECK(t.device().is_cpu(), Value, op, ": the UCX backend takes CPU tensors, got ",
             t.device());
  KILN_CHECK(t.is_contiguous(), Value, op, ": expected a contiguous tensor, got shape ", t.sizes(),
             " strides ", t.strides());
}

void check_reducible(const char* op, const Tensor& t) {
  KILN_CHECK(t.dtype() != kBool, Type, op, ": cannot reduce bool tensors");
}

}  // namespace

ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size(); }
const std::string& ProcessGroup::name() const { return impl_->name; }
Milliseconds ProcessGroup::timeout() const { return impl_->timeout; }
const std::vector<int>& ProcessGroup::ranks() const { return impl_->ranks; }
std::string ProcessGroup::dump_recent() const { return impl_->dump(); }

WorkPtr ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  if (impl_->nccl) return impl_->nccl->all_reduce(tensor, op);
  check_tensor("all_reduce", tensor);
  check_reducible("all_reduce", tensor);
  const int n = size();
  return impl_->issue(
      "all_reduce", shape_str(tensor),
      [tensor, op, n](Exchange& x) {
        const int64_t numel = tensor.numel();
        if (!is_half(tensor.dtype())) {
          dist::all_reduce(x, tensor.data_ptr(), numel, tensor.dtype(), op);
          if (op == ReduceOp::Avg) divide_by(tensor.data_ptr(), numel, tensor.dtype(), n);
          return;
        }
        auto* wide = static_cast<float*>(scratch(2, numel * sizeof(float)));
        widen(tensor, wide);
        dist::all_reduce(x, wide, numel, kFloat32, op);
        if (op == ReduceOp::Avg) divide_by(wide, numel, kFloat32, n);
        narrow(wide, numel, tensor);
      },
      OpKind::AllReduce);
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, int src) {
  if (impl_->nccl) return impl_->nccl->broadcast(tensor, src);
  check_tensor("broadcast", tensor);
  KILN_CHECK(src >= 0 && src < size(), Value, "broadcast: src ", src, " is not a rank of group '",
             name(), "' of size ", size());
  return impl_->issue(
      "broadcast", shape_str(tensor),
      [tensor, src](Exchange& x) { dist::broadcast(x, tensor.data_ptr(), tensor.nbytes(), src); },
      OpKind::Broadcast);
}

WorkPtr ProcessGroup::all_gather_into_tensor(Tensor& output, const Tensor& input) {
  if (impl_->nccl) return impl_->nccl->all_gather_into_tensor(output, input);
  check_tensor("all_gather_into_tensor", output);
  check_tensor("all_gather_into_tensor", input);
  KILN_CHECK(output.dtype() == input.dtype() && output.numel() == input.numel() * size(), Value,
             "all_gather_into_tensor: output ", shape_str(output), " must hold ", size(),
             " copies of input ", shape_str(input));
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
  check_tensor("reduce_scatter_tensor", output);
  check_tensor("reduce_scatter_tensor", input);
  check_reducible("reduce_scatter_tensor", input);
  KILN_CHECK(output.dtype() == input.dtype() && input.numel() == output.numel() * size(), Value,
             "reduce_scatter_tensor: input ", shape_str(input), " must hold ", size(),
             " blocks of output ", shape_str(output));
  const int n = size();
  return impl_->issue(
      "reduce_scatter_tensor", shape_str(input),
      [output, input, op, n](Exchange& x) {
        const int64_t block = output.numel();
        const ScalarType wt = is_half(input.dtype()) ? kFloat32 : input.dtype();
        const size_t elem = element_size(wt);
        // The ring reduces in place: work on a copy (float32 for float16/bfloat16).
        char* buf = static_cast<char*>(scratch(2, input.numel() * elem));
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
  check_tensor(op, output);
  check_tensor(op, input);
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
  check_tensor(op, tensor);
  KILN_CHECK(peer >= 0 && peer < size() && peer != rank(), Value, op, ": ", peer_name, " ", peer,
             " must be another rank of group '", name(), "' of size ", size());
  KILN_CHECK(tag >= 0 && tag < (1 << 19), Value, op, ": tag must be in [0, 2^19), got ", tag);
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  if (impl_->nccl) return impl_->nccl->send(tensor, dst);
  check_p2p("send", "dst", tensor, dst, tag);
  uint32_t msg = impl_->next_p2p(impl_->sends_, dst, tag);
  return impl_->issue(
      "send", shape_str(tensor),
      [tensor, dst, msg](Exchange& x) { x.send(dst, msg, tensor.data_ptr(), tensor.nbytes()); },
      OpKind::P2P, tag);
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, int tag) {
  if (impl_->nccl) return impl_->nccl->recv(tensor, src);
  check_p2p("recv", "src", tensor, src, tag);
  uint32_t msg = impl_->next_p2p(impl_->recvs_, src, tag);
  return impl_->issue(
      "recv", shape_str(tensor),
      [tensor, src, msg](Exchange& x) { x.recv(src, msg, tensor.data_ptr(), tensor.nbytes()); },
      OpKind::P2P, tag);
}

WorkPtr ProcessGroup::barrier() {
  if (impl_->nccl) return impl_->nccl->barrier();
  return impl_->issue(
      "barrier", "", [](Exchange& x) { dist::barrier(x); }, OpKind::Barrier);
}

// ---- Registry
// ------------------------------------------------------------------------------------

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
  KILN_CHECK(o.backend == "ucx" || o.backend == "nccl", Value,
             "init_process_group: unknown backend '", o.backend, "' (this build has: ucx, nccl)");
#else
  KILN_CHECK(o.backend == "ucx", Value, "init_process_group: unknown backend '", o.backend,
             "' (this build has: ucx; nccl needs a build with CUDA and NCCL)");
#endif
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
  ++reg.generation;
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
  // Note [Collective tags]: a group id has 6 bits.
  KILN_CHECK(reg.next_group_id < 64, Value, "new_group: at most 63 subgroups per "
             "init_process_group (destroy_process_group starts the count afresh)");
  const int id = reg.next_group_id++;
  if (name.empty()) name = "group" + std::to_string(id);
  auto me = std::find(ranks.begin(), ranks.end(), reg.world->rank());
  const int rank = static_cast<int>(me - ranks.begin());
  std::shared_ptr<NcclComm> nccl;
#ifdef KILN_HAVE_NCCL
  if (NcclComm* parent = reg.world_nccl.get())
    nccl = nccl_split(*parent, me != ranks.end(), rank, name,
                      timeout.value_or(reg.world->timeout()));
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

void destroy_process_group() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.clear();
}

int local_rank() { return env_int("LOCAL_RANK", 0); }
int local_world_size() { return env_int("LOCAL_WORLD_SIZE", 1); }

}  // namespace kiln::dist
