// The collective algorithms over UcxTransport (private to sharding/comm). Buffers are raw bytes;
// reductions run on float32, float64 and the integer types (the process group upcasts float16 and
// bfloat16 to float32 first).
//
//   Exchange x{transport, ranks, rank, tag_base, deadline};
//   ring_all_reduce(x, data, numel, kFloat32, ReduceOp::Sum);
//
// Note [Collective tags]: a message's 64-bit tag is group id (6 bits) | op kind (3) | sequence
// number (19) | sender's group rank (12) | message index within the collective (24), so messages
// of different collectives, groups or senders never match each other, and a rank that skipped a
// collective leaves the others waiting rather than mixing up data.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kiln/dist/process_group.h"
#include "ucx.h"

namespace kiln::dist {

using Clock = std::chrono::steady_clock;

enum class OpKind : uint64_t {
  AllReduce,
  Broadcast,
  AllGather,
  ReduceScatter,
  AllToAll,
  Barrier,
  P2P
};

// Thrown when a message did not complete by the deadline.
struct PeerTimeout {
  int peer;  // group rank
  bool is_recv;
};

// The messages of one collective: tags, the deadline, and outstanding requests (cancelled when
// the collective fails).
class Exchange {
 public:
  Exchange(UcxTransport* t, const std::vector<int>& world_ranks, int rank, uint64_t tag_base,
           Clock::time_point deadline)
      : t_(t), world_ranks_(world_ranks), rank_(rank), tag_base_(tag_base), deadline_(deadline) {}
  ~Exchange();

  static uint64_t tag_base(int group_id, OpKind op, uint64_t seq);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  // Returns the index of the request (for wait).
  size_t send(int peer, uint32_t msg, const void* buf, size_t bytes);
  size_t recv(int peer, uint32_t msg, void* buf, size_t bytes);
  void wait(size_t request);
  void wait_all();
  // Tests every request once without blocking; PeerTimeout past the deadline.
  bool test_all();

  // The ring's channels through the mailboxes (See Note [Shared-memory ring] in collectives.cpp,
  // Note [Shared-memory mailboxes]), one per ordered pair of ranks, kMailboxSlots slots deep. True
  // when every member mapped every other member's mailbox.
  bool shared_memory() const;
  size_t slot_bytes() const { return t_->mailbox_slot_bytes(); }
  // The next slot of the channel to `peer`, once the peer has released it; publish() sends it as
  // message (column, msg) of `bytes`.
  char* slot_to(int peer);
  void publish(int peer, uint64_t column, uint32_t msg, size_t bytes);
  // The next message from `peer`, which must be (column, msg) of `bytes`: a message of another
  // collective or size is an error. release() hands the slot back to the peer.
  const char* slot_from(int peer, uint64_t column, uint32_t msg, size_t bytes);
  void release(int peer);

 private:
  UcxTransport* t_;
  const std::vector<int>& world_ranks_;
  int rank_;
  uint64_t tag_base_;
  Clock::time_point deadline_;
  std::vector<UcxTransport::Request> reqs_;
  std::vector<int> group_peer_;

  // Waits until `counter` (in a mailbox) reaches `target`; PeerTimeout past the deadline.
  void await(int peer, bool is_recv, std::atomic<uint64_t>& counter, uint64_t target);
};

// dst[i] = dst[i] (op) src[i]; avg reduces as sum (divide_by finishes it).
void reduce_into(void* dst, const void* src, int64_t n, ScalarType dtype, ReduceOp op);
// out[i] = a[i] (op) b[i]; out may be a.
void reduce_to(void* out, const void* a, const void* b, int64_t n, ScalarType dtype, ReduceOp op);
void divide_by(void* data, int64_t n, ScalarType dtype, int64_t divisor);

// In place over `data` (numel elements). Picks recursive doubling or the ring by size.
void all_reduce(Exchange& x, void* data, int64_t numel, ScalarType dtype, ReduceOp op);
// data: size * block elements; afterwards block `rank` holds the reduction (not divided for avg).
void ring_reduce_scatter(Exchange& x, void* data, const std::vector<int64_t>& offsets,
                         ScalarType dtype, ReduceOp op, uint32_t msg_base);
// data holds block `rank`; afterwards every block.
void ring_all_gather(Exchange& x, void* data, const std::vector<int64_t>& offsets, size_t elem,
                     uint32_t msg_base);
void broadcast(Exchange& x, void* data, size_t bytes, int root);
// Byte offsets/sizes per peer, into in and out.
void all_to_all(Exchange& x, const void* in, const std::vector<size_t>& in_off,
                const std::vector<size_t>& in_bytes, void* out, const std::vector<size_t>& out_off,
                const std::vector<size_t>& out_bytes);
void barrier(Exchange& x);

// Note [Scratch buffers]: the comm thread keeps its temporary buffers between collectives (slot
// 0: the ring's receive slots; slot 1: a collective's working copy), so a large
// collective does not pay for fresh pages (page faults and zeroing) every time. They only grow.
void* scratch(int slot, size_t bytes);

// Element offsets of `parts` near-equal blocks of n (parts + 1 entries).
std::vector<int64_t> split_offsets(int64_t n, int parts);

}  // namespace kiln::dist
