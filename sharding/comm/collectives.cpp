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
// agree bit for bit here too.
#include "collectives.h"

#include <cstring>
#include <memory>

#include "kiln/error.h"
#include "kiln/half.h"

namespace kiln::dist {
namespace {

constexpr size_t kSmallBytes = 64 << 10;
constexpr int64_t kChunkBytes = 4 << 20;
constexpr uint32_t kAllGatherMsgBase = 1u << 22;

int mod(int a, int n) { return ((a % n) + n) % n; }

// Elements per pipelined piece of a ring step (bounded so the piece index fits its tag field).
int64_t piece_elems(const std::vector<int64_t>& off, size_t elem) {
  int64_t max_len = 0;
  for (size_t i = 0; i + 1 < off.size(); ++i) max_len = std::max(max_len, off[i + 1] - off[i]);
  return std::max<int64_t>({kChunkBytes / static_cast<int64_t>(elem), (max_len + 1023) / 1024, 1});
}

template <typename T>
void reduce_typed(T* __restrict d, const T* __restrict s, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
      return;
    case ReduceOp::Product:
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] * s[i]);
      return;
    case ReduceOp::Max:
      for (int64_t i = 0; i < n; ++i) d[i] = d[i] < s[i] ? s[i] : d[i];
      return;
    case ReduceOp::Min:
      for (int64_t i = 0; i < n; ++i) d[i] = s[i] < d[i] ? s[i] : d[i];
      return;
  }
}

}  // namespace

// ---- Exchange
// ------------------------------------------------------------------------------------

uint64_t Exchange::tag_base(int group_id, OpKind op, uint64_t seq) {
  return (static_cast<uint64_t>(group_id & 0x3f) << 58) | (static_cast<uint64_t>(op) << 55) |
         ((seq & 0x7ffff) << 36);
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
    if (Clock::now() >= deadline_) throw PeerTimeout{group_peer_[i], reqs_[i].is_recv};
    return false;
  }
  return true;
}

void Exchange::wait_all() {
  for (size_t i = 0; i < reqs_.size(); ++i) wait(i);
}

// ---- Arithmetic
// ----------------------------------------------------------------------------------

void reduce_into(void* dst, const void* src, int64_t n, ScalarType dtype, ReduceOp op) {
  switch (dtype) {
#define KILN_REDUCE_CASE(st, T) \
  case st:                      \
    return reduce_typed(static_cast<T*>(dst), static_cast<const T*>(src), n, op);
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
  thread_local Buffer buffers[3];
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

// Note [All-reduce algorithms]: the small-message path.
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
// its own copy: after n-1 steps block r is complete on rank r.
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
  char* tmp[2] = {static_cast<char*>(scratch(0, max_len * elem)),
                  static_cast<char*>(scratch(1, max_len * elem))};
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  auto pieces = [&](int b) { return (off[b + 1] - off[b] + chunk - 1) / chunk; };
  auto piece_len = [&](int b, int64_t k) {
    return std::min(chunk, off[b + 1] - off[b] - k * chunk);
  };
  auto msg = [&](int s, int64_t k) { return msg_base + static_cast<uint32_t>(s * pmax + k); };
  auto post_recvs = [&](int s) {
    std::vector<size_t> ids;
    const int b = mod(r - s - 2, n);
    for (int64_t k = 0; k < pieces(b); ++k)
      ids.push_back(x.recv(left, msg(s, k), tmp[s % 2] + k * chunk * elem, piece_len(b, k) * elem));
    return ids;
  };
  const int first = mod(r - 1, n);
  for (int64_t k = 0; k < pieces(first); ++k)
    x.send(right, msg(0, k), d + (off[first] + k * chunk) * elem, piece_len(first, k) * elem);
  std::vector<size_t> recvs = post_recvs(0);
  for (int s = 0; s <= n - 2; ++s) {
    std::vector<size_t> next;
    if (s + 1 <= n - 2) next = post_recvs(s + 1);
    const int b = mod(r - s - 2, n);
    for (int64_t k = 0; k < pieces(b); ++k) {
      x.wait(recvs[k]);
      char* own = d + (off[b] + k * chunk) * elem;
      reduce_into(own, tmp[s % 2] + k * chunk * elem, piece_len(b, k), dtype, op);
      if (s + 1 <= n - 2) x.send(right, msg(s + 1, k), own, piece_len(b, k) * elem);
    }
    recvs = std::move(next);
  }
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

void all_reduce(Exchange& x, void* data, int64_t numel, ScalarType dtype, ReduceOp op) {
  if (x.size() == 1 || numel == 0) return;
  if (numel * element_size(dtype) <= kSmallBytes)
    return recursive_doubling(x, static_cast<char*>(data), numel, dtype, op);
  std::vector<int64_t> off = split_offsets(numel, x.size());
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
