// UcxTransport: the process's UCX context, worker and endpoints to every world rank (UCP tag
// API; UCX picks shared memory or TCP). Private to sharding/comm.
//
//   UcxTransport t(store, "kiln/ucx/0/", rank, world);  // exchanges worker addresses
//   auto r = t.recv(peer, tag, buf, bytes);
//   while (!t.test(r)) t.wait_event(timeout);          // progresses the worker, then sleeps
//
// Only one thread at a time calls into it (the communication thread, or the caller of init/destroy
// while that thread is idle); the worker is created SERIALIZED
// (See Note [Comm thread] in process_group.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/dist/store.h"
#include "kiln/error.h"

typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_mem* ucp_mem_h;
typedef struct ucp_rkey* ucp_rkey_h;

namespace kiln::dist {

class UcxTransport {
 public:
  UcxTransport(TCPStore& store, const std::string& key_prefix, int rank, int world);
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // An outstanding send or receive (`handle` is null once it has completed).
  struct Request {
    void* handle = nullptr;
    int peer = -1;  // world rank
    bool is_recv = false;
    size_t bytes = 0;
  };

  Request send(int peer, uint64_t tag, const void* buf, size_t bytes);
  Request recv(int peer, uint64_t tag, void* buf, size_t bytes);
  // Progresses the worker once; true when `r` has completed. kiln::Error (Runtime) on a transport
  // error or a received size that differs from the expected one.
  bool test(Request& r);
  void cancel(Request& r);
  // Note [Blocking progress]: sleeps until the worker has something to progress (a message or a
  // transport event arrived) or `max` has passed, instead of spinning: ranks often share cores,
  // and a spinning comm thread takes them from the peer's and its own computation.
  void wait_event(std::chrono::microseconds max);
  // Arms the worker's events and returns its event fd to poll(), or -1 when events are already
  // pending (progress again instead of sleeping).
  int arm();
  // Progresses the worker once (sends and receives in flight go on while a caller waits on
  // something else).
  void progress();
  // Marks the transport unusable after a failed collective: endpoints are then force-closed, and
  // the mailboxes are no longer used.
  void mark_broken() { broken_ = true; }
  // Makes every wait on this transport, now and later, raise a RuntimeError naming `why` (a
  // group aborted from outside: See Note [Aborting process groups] in process_group.h).
  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (!aborted_) abort_reason_ = why;
    }
    aborted_.store(true, std::memory_order_release);
    broken_ = true;  // its endpoints are force-closed: peers may be gone
  }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Raises that RuntimeError once abort() was called.
  void check_aborted() const {
    if (!aborted_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(abort_mu_);
    throw Error(ErrorKind::Runtime, "the process group was aborted: " + abort_reason_);
  }

  // Note [Shared-memory mailboxes]: each process maps a mailbox that UCX allocates in shared
  // memory, and every peer on the same host maps it too (ucp_rkey_ptr). Collectives then move
  // pieces through it with plain loads and stores (comm/collectives.h, Note [Shared-memory
  // ring]). Null for a peer whose mailbox could not be mapped (another host, KILN_UCX_SHM=0, or
  // KILN_UCX_PEER_ERRORS=1, whose dead-peer errors shared memory cannot give).
  char* mailbox(int world_rank) const { return mailboxes_[static_cast<size_t>(world_rank)]; }
  // True when every one of `ranks` (world ranks) mapped every other's mailbox, as every one of them
  // sees it (they exchange what they mapped), and no collective has failed here.
  bool shared_memory(const std::vector<int>& ranks) const;
  int world_size() const { return static_cast<int>(eps_.size()); }
  static constexpr int kMailboxSlots = 4;
  size_t mailbox_slot_bytes() const { return slot_bytes_; }

 private:
  void map_mailboxes(TCPStore& store, const std::string& key_prefix, bool enabled);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;
  int efd_ = -1;  // the worker's event fd (UCP_FEATURE_WAKEUP)
  ucp_mem_h mailbox_mem_ = nullptr;
  std::vector<ucp_rkey_h> rkeys_;
  std::vector<char*> mailboxes_;    // by world rank; this rank's own included
  std::vector<std::string> mapped_;  // by world rank: '1' for each mailbox that rank mapped
  size_t slot_bytes_ = 0;
  int rank_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mu_;
  std::string abort_reason_;
};

}  // namespace kiln::dist
