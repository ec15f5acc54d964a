// Private to sharding/comm: the communication thread and the state behind a ProcessGroup, shared
// by process_group.cpp (Work and the collectives) and registry.cpp (init_process_group,
// new_group and the registry of groups).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives.h"
#include "kiln/dist/process_group.h"
#include "kiln/error.h"
#include "nccl.h"

namespace kiln::dist {

// Note [Comm thread] (process_group.cpp). Point-to-point operations stay "in flight" while the
// thread goes on with its queue; when nothing moves it sleeps in poll() on its own eventfd (which
// post() writes) and the UCX workers' event fds, rather than spinning (Note [Blocking progress]).
class CommThread {
 public:
  // Returns true once its operation has finished (Work completed).
  using Poller = std::function<bool()>;

  CommThread();
  ~CommThread();
  void post(std::function<void()> task);
  // From a task: keep testing an operation that is in flight (point-to-point) on `transport`
  // (null for none) while the thread goes on with the queue.
  void add_in_flight(Poller p, UcxTransport* transport) {
    in_flight_.push_back({std::move(p), transport});
  }
  // Waits until everything queued so far, and every operation in flight, has finished.
  void drain();

 private:
  struct InFlight {
    Poller test;
    UcxTransport* transport;
  };
  bool poll_in_flight();  // true when some operation finished
  void sleep();           // until a post() or a transport event; at most 10 ms
  void run();

  std::mutex mu_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  int wake_fd_ = -1;                 // eventfd: post() and the destructor write it
  std::vector<InFlight> in_flight_;  // the thread's own
  std::thread thread_;
};

// Milliseconds from KILN_COMM_TIMEOUT_S, else 60 s (ValueError when it is not a positive number).
Milliseconds env_timeout();
// The integer in environment variable `name`, else `fallback` (ValueError when not an integer).
int env_int(const char* name, int fallback);

constexpr size_t kRecorderSize = 64;  // collectives a group's flight recorder keeps

// Note [No fork after init] (process_group.cpp).
extern std::atomic<bool> forked_after_init;
void watch_for_fork();

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
  bool fake = false;               // backend "fake" (Note [Fake process group])

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
      if (!p2p_tag)
        detail::observe_collective(
            {name, rank, size(), seq, op, sizes, ranks});  // Note [Collective observer]
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
      thread->add_in_flight(
          [x, finished, self] {
            try {
              if (!x->test_all()) return false;
              finished(nullptr);
            } catch (...) {
              finished(std::current_exception());
            }
            return true;
          },
          transport.get());
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

  // A collective that timed out or failed in its transport. Point-to-point ops get no desync
  // report: their sequence numbers differ across ranks
  // (See Note [Collective timeouts] in process_group.cpp).
  Error failed(const char* op, uint64_t seq, const std::string& why, bool p2p) {
    std::ostringstream msg;
    msg << describe(op, seq, p2p) << " " << why;
    abort(msg.str());
    // No desync report for a group aborted from outside: the session is over, and its store may
    // be on a host that is gone (a read would wait out the store's timeout).
    if (!p2p && !(transport && transport->aborted())) msg << desync_report(op, seq);
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

}  // namespace kiln::dist
