// The collective algorithms (comm/collectives.h).
//
// Note [All-reduce algorithms]: messages up to kSmallBytes use recursive doubling (log2(n)
// rounds of pairwise exchange; with n not a power of two, the first 2 * (n - p2) ranks pair up
// first, as in MPICH). Each pairwise step computes a (op) b on one side and b (op) a on the other,
// and the reductions are commutative in IEEE arithmetic, so every rank ends with the same bits.
// Larger messages use the ring: reduce-scatter (n - 1 steps, rank r ends owning block r) and
// all-gather (n - 1 steps). Each block is cut into pieces of about kChunkBytes, and a piece is
// forwarded as soon as it has arrived (and been reduced), so the transfer of one piece overlaps the
// reduction of the previous one. Each block is reduced on one rank and then copied, so all ranks
// agree bit for bit here too. When every rank's mailbox is mapped (one host), the ring runs
// through shared memory instead of messages (Note [Shared-memory ring]).
//
// Note [Ring slots]: the reduce-scatter receives its pieces into kSlots buffers of kChunkBytes in
// turn, not into a copy of the whole block, so what it reduces from is still in cache (2-rank
// 64 MiB all_reduce over messages: 2.5 -> 3.3-4 GB/s here; 256 KiB pieces did best of 64 KiB to
// 4 MiB).
#include "collectives.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <climits>
#include <cstring>
#include <memory>

#include "kiln/error.h"
#include "kiln/half.h"

namespace kiln::dist {
namespace {

constexpr size_t kSmallBytes = 64 << 10;
constexpr int64_t kChunkBytes = 256 << 10;
constexpr int kSlots = 4;
constexpr uint32_t kAllGatherMsgBase = 1u << 22;

int mod(int a, int n) { return ((a % n) + n) % n; }

// Elements per pipelined piece of a ring step (bounded so the piece index fits its tag field).
int64_t piece_elems(const std::vector<int64_t>& off, size_t elem) {
  int64_t max_len = 0;
  for (size_t i = 0; i + 1 < off.size(); ++i) max_len = std::max(max_len, off[i + 1] - off[i]);
  return std::max<int64_t>({kChunkBytes / static_cast<int64_t>(elem), (max_len + 1023) / 1024, 1});
}

template <typename T>
void reduce_typed(T* out, const T* a, const T* b, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] + b[i]);
      return;
    case ReduceOp::Product:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] * b[i]);
      return;
    case ReduceOp::Max:
      for (int64_t i = 0; i < n; ++i) out[i] = a[i] < b[i] ? b[i] : a[i];
      return;
    case ReduceOp::Min:
      for (int64_t i = 0; i < n; ++i) out[i] = b[i] < a[i] ? b[i] : a[i];
      return;
  }
}

}  // namespace

// ---- Exchange
// ------------------------------------------------------------------------------------

// The fields' places (See Note [Collective tags] in collectives.h).
constexpr int kGroupShift = 58, kOpShift = 55, kSeqShift = 36;
constexpr uint64_t kSeqMask = 0x7ffff;

uint64_t Exchange::tag_base(int group_id, OpKind op, uint64_t seq) {
  return (static_cast<uint64_t>(group_id & 0x3f) << kGroupShift) |
         (static_cast<uint64_t>(op) << kOpShift) | ((seq & kSeqMask) << kSeqShift);
}

Exchange::~Exchange() {
  for (auto& r : reqs_) t_->cancel(r);
}

size_t Exchange::send(int peer, uint32_t msg, const void* buf, size_t bytes) {
  uint64_t tag = tag_base_ | (static_cast<uint64_t>(rank_) << 24) | msg;
  reqs_.push_back(t_->send(world_ranks_[peer], tag, buf, bytes));
  group_peer_.push_back(peer);
  return reqs_.size() - 1;
}

size_t Exchange::recv(int peer, uint32_t msg, void* buf, size_t bytes) {
  uint64_t tag = tag_base_ | (static_cast<uint64_t>(peer) << 24) | msg;
  reqs_.push_back(t_->recv(world_ranks_[peer], tag, buf, bytes));
  group_peer_.push_back(peer);
  return reqs_.size() - 1;
}

void Exchange::wait(size_t i) {
  // Spin briefly while messages flow, then sleep on the worker's events (Note [Blocking
  // progress]), waking at least every 10 ms to check the deadline.
  for (int idle = 0; !t_->test(reqs_[i]); ++idle) {
    t_->check_aborted();
    const auto now = Clock::now();
    if (now >= deadline_) throw PeerTimeout{group_peer_[i], reqs_[i].is_recv};
    if (idle > 100)
      t_->wait_event(std::min<std::chrono::microseconds>(
          std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - now),
          std::chrono::milliseconds(10)));
  }
}

bool Exchange::test_all() {
  for (size_t i = 0; i < reqs_.size(); ++i) {
    if (t_->test(reqs_[i])) continue;
    t_->check_aborted();
    if (Clock::now() >= deadline_) throw PeerTimeout{group_peer_[i], reqs_[i].is_recv};
    return false;
  }
  return true;
}

void Exchange::wait_all() {
  for (size_t i = 0; i < reqs_.size(); ++i) wait(i);
}

// ---- Shared-memory channels (Note [Shared-memory ring])
// -------------------------------------------------------------------------------------------

namespace {

constexpr size_t kLine = 64;

// A message's header: the first line of its slot.
struct SlotHeader {
  uint64_t tag_base, column, msg, bytes;
};

std::atomic<uint64_t>& counter(char* mailbox, int peer, int which) {
  return *reinterpret_cast<std::atomic<uint64_t>*>(mailbox + (2 * peer + which) * kLine);
}
// Counters in rank q's mailbox, per peer p: how many messages q has published to p, and how many
// q has consumed from p. Each is written by q alone; the 32 bits after it count the ranks sleeping
// on it (Note [Mailbox waits]).
constexpr int kPublished = 0, kConsumed = 1;

char* slot(char* mailbox, int world, int peer, uint64_t index, size_t slot_bytes) {
  const int slots = UcxTransport::kMailboxSlots;
  return mailbox + world * 2 * kLine +
         (peer * slots + index % slots) * (kLine + slot_bytes);
}

}  // namespace

bool Exchange::shared_memory() const { return t_->shared_memory(world_ranks_); }

// Note [Mailbox waits]: a rank waits for a counter in a peer's mailbox to pass `target`. It spins
// for the first 100 us (in a ring both sides move in step, and a piece takes microseconds), then
// sleeps on the counter as a futex (shared, not private: the mailbox is mapped by two
// processes), waking every 10 ms to progress UCX (sends in flight go on) and check the deadline;
// ranks often share cores with their own and the peer's computation (DDP overlaps the backward).
// The writer counts on the sleepers count next to the counter to know whether to wake anyone: it
// stores the counter, then reads the count; a sleeper adds itself, then reads the counter (both
// sequentially consistent), so one of them sees the other.
void Exchange::await(int peer, bool is_recv, std::atomic<uint64_t>& counter, uint64_t target) {
  static_assert(std::endian::native == std::endian::little, "the futex is the counter's low half");
  auto& sleepers = *reinterpret_cast<std::atomic<uint32_t>*>(&counter + 1);
  const auto start = Clock::now();
  for (uint32_t i = 1; counter.load(std::memory_order_acquire) < target; ++i) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
    if (i % 64) continue;
    t_->check_aborted();
    const auto now = Clock::now();
    if (now >= deadline_) throw PeerTimeout{peer, is_recv};
    if (now - start < std::chrono::microseconds(100)) continue;
    t_->progress();
    sleepers.fetch_add(1);
    const uint64_t seen = counter.load();
    if (seen < target) {
      timespec ten_ms{0, 10'000'000};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&counter), FUTEX_WAIT,
              static_cast<uint32_t>(seen), &ten_ms, nullptr, 0);
    }
    sleepers.fetch_sub(1);
  }
}

namespace {

// Publishes `value` and wakes the peer if it sleeps on it (Note [Mailbox waits]).
void advance(std::atomic<uint64_t>& counter, uint64_t value) {
  counter.store(value);
  if (reinterpret_cast<std::atomic<uint32_t>*>(&counter + 1)->load())
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&counter), FUTEX_WAKE, INT32_MAX, nullptr,
            nullptr, 0);
}

}  // namespace

char* Exchange::slot_to(int peer) {
  const int me = world_ranks_[rank_], to = world_ranks_[peer];
  char* mine = t_->mailbox(me);
  const uint64_t next = counter(mine, to, kPublished).load(std::memory_order_relaxed);
  // Slot `next` is free once the peer has consumed message next - kMailboxSlots.
  if (next >= UcxTransport::kMailboxSlots)
    await(peer, false, counter(t_->mailbox(to), me, kConsumed),
          next - UcxTransport::kMailboxSlots + 1);
  return slot(mine, t_->world_size(), to, next, slot_bytes()) + kLine;
}

void Exchange::publish(int peer, uint64_t column, uint32_t msg, size_t bytes) {
  const int me = world_ranks_[rank_], to = world_ranks_[peer];
  char* mine = t_->mailbox(me);
  std::atomic<uint64_t>& published = counter(mine, to, kPublished);
  const uint64_t next = published.load(std::memory_order_relaxed);
  SlotHeader h{tag_base_, column, msg, bytes};
  std::memcpy(slot(mine, t_->world_size(), to, next, slot_bytes()), &h, sizeof h);
  advance(published, next + 1);
}

const char* Exchange::slot_from(int peer, uint64_t column, uint32_t msg, size_t bytes) {
  const int me = world_ranks_[rank_], from = world_ranks_[peer];
  char* theirs = t_->mailbox(from);
  const uint64_t next = counter(t_->mailbox(me), from, kConsumed).load(std::memory_order_relaxed);
  await(peer, true, counter(theirs, me, kPublished), next + 1);
  const char* s = slot(theirs, t_->world_size(), me, next, slot_bytes());
  SlotHeader h;
  std::memcpy(&h, s, sizeof h);
  auto seq = [](uint64_t tag) { return (tag >> kSeqShift) & kSeqMask; };
  auto group = [](uint64_t tag) { return tag >> kGroupShift; };
  KILN_CHECK(h.tag_base == tag_base_ && h.column == column && h.msg == msg, Runtime, "rank ", peer,
             " sent a piece of collective #", seq(h.tag_base), " of group id ", group(h.tag_base),
             " where this rank waits for #", seq(tag_base_), " of group id ", group(tag_base_),
             " (the ranks' collectives are out of step)");
  KILN_CHECK(h.bytes == bytes, Runtime, "expected ", bytes, " bytes from rank ", peer,
             ", received ", h.bytes, " (the ranks passed different sizes)");
  return s + kLine;
}

void Exchange::release(int peer) {
  std::atomic<uint64_t>& consumed =
      counter(t_->mailbox(world_ranks_[rank_]), world_ranks_[peer], kConsumed);
  advance(consumed, consumed.load(std::memory_order_relaxed) + 1);
}

// ---- Arithmetic
// ----------------------------------------------------------------------------------

void reduce_into(void* dst, const void* src, int64_t n, ScalarType dtype, ReduceOp op) {
  reduce_to(dst, dst, src, n, dtype, op);
}

void reduce_to(void* out, const void* a, const void* b, int64_t n, ScalarType dtype, ReduceOp op) {
  switch (dtype) {
#define KILN_REDUCE_CASE(st, T)                                                               \
  case st:                                                                                    \
    return reduce_typed(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), \
                        n, op);
    KILN_REDUCE_CASE(kFloat32, float)
    KILN_REDUCE_CASE(kFloat64, double)
    KILN_REDUCE_CASE(kUInt8, uint8_t)
    KILN_REDUCE_CASE(kInt8, int8_t)
    KILN_REDUCE_CASE(kInt16, int16_t)
    KILN_REDUCE_CASE(kInt32, int32_t)
    KILN_REDUCE_CASE(kInt64, int64_t)
#undef KILN_REDUCE_CASE
    default:
      KILN_FAIL(Type, "collective reduction: unsupported dtype ", dtype);
  }
}

void divide_by(void* data, int64_t n, ScalarType dtype, int64_t divisor) {
  switch (dtype) {
#define KILN_DIVIDE_CASE(st, T)                                                            \
  case st: {                                                                               \
    T* d = static_cast<T*>(data);                                                          \
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] / static_cast<T>(divisor)); \
    return;                                                                                \
  }
    KILN_DIVIDE_CASE(kFloat32, float)
    KILN_DIVIDE_CASE(kFloat64, double)
    KILN_DIVIDE_CASE(kUInt8, uint8_t)
    KILN_DIVIDE_CASE(kInt8, int8_t)
    KILN_DIVIDE_CASE(kInt16, int16_t)
    KILN_DIVIDE_CASE(kInt32, int32_t)
    KILN_DIVIDE_CASE(kInt64, int64_t)
#undef KILN_DIVIDE_CASE
    default:
      KILN_FAIL(Type, "collective avg: unsupported dtype ", dtype);
  }
}

void* scratch(int slot, size_t bytes) {
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[slot];
  if (b.size < bytes) {
    b.data.reset(new char[bytes]);
    b.size = bytes;
  }
  return b.data.get();
}

std::vector<int64_t> split_offsets(int64_t n, int parts) {
  std::vector<int64_t> off(parts + 1, 0);
  for (int i = 0; i < parts; ++i) off[i + 1] = off[i] + n / parts + (i < n % parts ? 1 : 0);
  return off;
}

// ---- Algorithms
// ----------------------------------------------------------------------------------

namespace {

// The small-message path (See Note [All-reduce algorithms]).
void recursive_doubling(Exchange& x, char* d, int64_t numel, ScalarType dtype, ReduceOp op) {
  const int n = x.size(), r = x.rank();
  const size_t bytes = numel * element_size(dtype);
  std::unique_ptr<char[]> tmp(new char[std::max<size_t>(bytes, 1)]);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int rem = n - p2;
  int vrank = r - rem;  // the rank among the p2 that exchange; -1 for ranks sitting out
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      x.wait(x.send(r + 1, 0, d, bytes));
      vrank = -1;
    } else {
      x.wait(x.recv(r - 1, 0, tmp.get(), bytes));
      reduce_into(d, tmp.get(), numel, dtype, op);
      vrank = r / 2;
    }
  }
  if (vrank >= 0) {
    uint32_t step = 1;
    for (int mask = 1; mask < p2; mask <<= 1, ++step) {
      const int vpeer = vrank ^ mask;
      const int peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
      size_t rq = x.recv(peer, step, tmp.get(), bytes);
      size_t sq = x.send(peer, step, d, bytes);
      x.wait(rq);
      x.wait(sq);
      reduce_into(d, tmp.get(), numel, dtype, op);
    }
  }
  if (r < 2 * rem) {
    if (r % 2 == 1)
      x.wait(x.send(r - 1, 1000, d, bytes));
    else
      x.wait(x.recv(r + 1, 1000, d, bytes));
  }
}

}  // namespace

// Step s sends block r-s-1 to the right and receives block r-s-2 from the left, reducing it into
// its own copy: after n-1 steps block r is complete on rank r. The pieces of all steps form one
// sequence, received through kSlots piece-sized buffers in turn (Note [Ring slots]).
void ring_reduce_scatter(Exchange& x, void* data, const std::vector<int64_t>& off, ScalarType dtype,
                         ReduceOp op, uint32_t msg_base) {
  const int n = x.size(), r = x.rank();
  if (n == 1) return;
  const size_t elem = element_size(dtype);
  char* d = static_cast<char*>(data);
  const int64_t chunk = piece_elems(off, elem);
  int64_t max_len = 0;
  for (int i = 0; i < n; ++i) max_len = std::max(max_len, off[i + 1] - off[i]);
  const int64_t pmax = (max_len + chunk - 1) / chunk;
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  auto pieces = [&](int b) { return (off[b + 1] - off[b] + chunk - 1) / chunk; };
  auto piece_len = [&](int b, int64_t k) {
    return std::min(chunk, off[b + 1] - off[b] - k * chunk);
  };
  auto msg = [&](int s, int64_t k) { return msg_base + static_cast<uint32_t>(s * pmax + k); };
  struct Piece {
    int step;
    int64_t k;
  };
  std::vector<Piece> seq;
  for (int s = 0; s <= n - 2; ++s)
    for (int64_t k = 0; k < pieces(mod(r - s - 2, n)); ++k) seq.push_back({s, k});
  char* slots = static_cast<char*>(scratch(0, kSlots * chunk * elem));
  std::vector<size_t> recvs(seq.size());
  auto post_recv = [&](size_t g) {
    if (g >= seq.size()) return;
    const auto [s, k] = seq[g];
    recvs[g] = x.recv(left, msg(s, k), slots + (g % kSlots) * chunk * elem,
                      piece_len(mod(r - s - 2, n), k) * elem);
  };
  const int first = mod(r - 1, n);
  auto send_first = [&](int64_t k) {
    if (k < pieces(first))
      x.send(right, msg(0, k), d + (off[first] + k * chunk) * elem, piece_len(first, k) * elem);
  };
  for (int64_t g = 0; g < kSlots; ++g) {
    post_recv(g);
    send_first(g);
  }
  for (size_t g = 0; g < seq.size(); ++g) {
    const auto [s, k] = seq[g];
    const int b = mod(r - s - 2, n);
    x.wait(recvs[g]);
    char* own = d + (off[b] + k * chunk) * elem;
    reduce_into(own, slots + (g % kSlots) * chunk * elem, piece_len(b, k), dtype, op);
    post_recv(g + kSlots);
    send_first(static_cast<int64_t>(g) + kSlots);
    if (s + 1 <= n - 2) x.send(right, msg(s + 1, k), own, piece_len(b, k) * elem);
  }
  for (int64_t k = static_cast<int64_t>(seq.size()) + kSlots; k < pieces(first); ++k) send_first(k);
  x.wait_all();
}

// Step s sends block r-s to the right and receives block r-s-1 from the left, in place; a piece
// received is forwarded at once.
void ring_all_gather(Exchange& x, void* data, const std::vector<int64_t>& off, size_t elem,
                     uint32_t msg_base) {
  const int n = x.size(), r = x.rank();
  if (n == 1) return;
  char* d = static_cast<char*>(data);
  const int64_t chunk = piece_elems(off, elem);
  int64_t max_len = 0;
  for (int i = 0; i < n; ++i) max_len = std::max(max_len, off[i + 1] - off[i]);
  const int64_t pmax = (max_len + chunk - 1) / chunk;
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  auto pieces = [&](int b) { return (off[b + 1] - off[b] + chunk - 1) / chunk; };
  auto piece_len = [&](int b, int64_t k) {
    return std::min(chunk, off[b + 1] - off[b] - k * chunk);
  };
  auto piece_ptr = [&](int b, int64_t k) { return d + (off[b] + k * chunk) * elem; };
  auto msg = [&](int s, int64_t k) { return msg_base + static_cast<uint32_t>(s * pmax + k); };
  std::vector<std::vector<size_t>> recvs(n - 1);
  for (int s = 0; s <= n - 2; ++s) {
    const int b = mod(r - s - 1, n);
    for (int64_t k = 0; k < pieces(b); ++k)
      recvs[s].push_back(x.recv(left, msg(s, k), piece_ptr(b, k), piece_len(b, k) * elem));
  }
  for (int64_t k = 0; k < pieces(r); ++k)
    x.send(right, msg(0, k), piece_ptr(r, k), piece_len(r, k) * elem);
  for (int s = 0; s + 1 <= n - 2; ++s) {
    const int b = mod(r - s - 1, n);
    for (int64_t k = 0; k < pieces(b); ++k) {
      x.wait(recvs[s][k]);
      x.send(right, msg(s + 1, k), piece_ptr(b, k), piece_len(b, k) * elem);
    }
  }
  x.wait_all();
}

// Note [Shared-memory ring]: the ring all-reduce through the mailboxes. Each block is cut into
// columns of one slot; per column, rank r publishes its piece of block r-1, then handles the
// 2(n-1) messages from its left in turn: reduce-scatter steps add its own piece to the incoming
// partial sum straight into the next slot to the right (the last one into its block r, which it
// then publishes), all-gather steps copy the incoming piece into place and forward it. A piece is
// read from the peer's slot where it lies, so each byte is copied once per hop, where messages
// cost a copy into UCX's FIFO and another out of it. Every channel carries its messages in one
// order on both sides, and a rank never waits on a message later than the one it holds, so the
// ring cannot deadlock; a dead or stuck peer shows as PeerTimeout.
void shm_ring_all_reduce(Exchange& x, char* d, const std::vector<int64_t>& off, ScalarType dtype,
                         ReduceOp op) {
  const int n = x.size(), r = x.rank(), right = mod(r + 1, n), left = mod(r - 1, n);
  const size_t elem = element_size(dtype);
  const int64_t chunk = static_cast<int64_t>(x.slot_bytes() / elem);
  int64_t max_len = 0;
  for (int i = 0; i < n; ++i) max_len = std::max(max_len, off[i + 1] - off[i]);
  auto len = [&](int b, int64_t k) {
    return std::clamp<int64_t>(off[b + 1] - off[b] - k * chunk, 0, chunk);
  };
  auto at = [&](int b, int64_t k) { return d + (off[b] + k * chunk) * elem; };
  for (int64_t k = 0; k * chunk < max_len; ++k) {
    if (const int b = mod(r - 1, n); len(b, k)) {
      std::memcpy(x.slot_to(right), at(b, k), len(b, k) * elem);
      x.publish(right, k, 0, len(b, k) * elem);
    }
    for (int i = 0; i < 2 * n - 2; ++i) {  // message i of column k from the left
      const int b = i <= n - 2 ? mod(r - i - 2, n) : mod(r - (i - n + 1) - 1, n);
      const int64_t m = len(b, k);
      if (!m) continue;
      const size_t bytes = m * elem;
      const char* in = x.slot_from(left, k, i, bytes);
      char* mine = at(b, k);
      if (i < n - 2) {
        reduce_to(x.slot_to(right), mine, in, m, dtype, op);
      } else {
        if (i == n - 2)
          reduce_into(mine, in, m, dtype, op);
        else
          std::memcpy(mine, in, bytes);
        if (i < 2 * n - 3) std::memcpy(x.slot_to(right), mine, bytes);
      }
      x.release(left);
      if (i < 2 * n - 3) x.publish(right, k, i + 1, bytes);
    }
  }
}

void all_reduce(Exchange& x, void* data, int64_t numel, ScalarType dtype, ReduceOp op) {
  if (x.size() == 1 || numel == 0) return;
  if (numel * element_size(dtype) <= kSmallBytes)
    return recursive_doubling(x, static_cast<char*>(data), numel, dtype, op);
  std::vector<int64_t> off = split_offsets(numel, x.size());
  if (x.shared_memory()) return shm_ring_all_reduce(x, static_cast<char*>(data), off, dtype, op);
  ring_reduce_scatter(x, data, off, dtype, op, 0);
  ring_all_gather(x, data, off, element_size(dtype), kAllGatherMsgBase);
}

void broadcast(Exchange& x, void* data, size_t bytes, int root) {
  if (x.size() == 1) return;
  if (x.rank() != root) return x.wait(x.recv(root, 0, data, bytes));
  for (int p = 0; p < x.size(); ++p)
    if (p != root) x.send(p, 0, data, bytes);
  x.wait_all();
}

void all_to_all(Exchange& x, const void* in, const std::vector<size_t>& in_off,
                const std::vector<size_t>& in_bytes, void* out, const std::vector<size_t>& out_off,
                const std::vector<size_t>& out_bytes) {
  const int r = x.rank();
  auto* i = static_cast<const char*>(in);
  auto* o = static_cast<char*>(out);
  for (int p = 0; p < x.size(); ++p)
    if (p != r) x.recv(p, 0, o + out_off[p], out_bytes[p]);
  for (int p = 0; p < x.size(); ++p)
    if (p != r) x.send(p, 0, i + in_off[p], in_bytes[p]);
  KILN_CHECK(in_bytes[r] == out_bytes[r], Value, "all_to_all_single: rank ", r, " sends itself ",
             in_bytes[r], " bytes but expects ", out_bytes[r]);
  if (in_bytes[r]) std::memcpy(o + out_off[r], i + in_off[r], in_bytes[r]);
  x.wait_all();
}

void barrier(Exchange& x) {
  static char dummy = 0;
  for (int p = 0; p < x.size(); ++p)
    if (p != x.rank()) x.recv(p, 0, &dummy, 0);
  for (int p = 0; p < x.size(); ++p)
    if (p != x.rank()) x.send(p, 0, &dummy, 0);
  x.wait_all();
}

}  // namespace kiln::dist
