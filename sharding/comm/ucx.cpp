// The UCX transport (comm/ucx.h).
#include "ucx.h"

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kiln/error.h"

namespace kiln::dist {
namespace {

void check(ucs_status_t s, const char* what) {
  KILN_CHECK(s == UCS_OK, Runtime, "UCX: ", what, " failed: ", ucs_status_string(s));
}

}  // namespace

// Note [Peer failures]: by default endpoints have no peer error handling, so UCX may use shared
// memory (posix/sysv), which cannot report a dead peer; a dead or stuck peer then shows as a
// collective timeout (Note [Collective timeouts]). UCX would abort this process when it was
// reading a large message from a peer's memory (CMA, its rendezvous protocol) the moment that
// peer died, so rendezvous is off (RNDV_THRESH=inf, unless UCX_RNDV_THRESH is set): large
// messages go as pipelined eager fragments through the shared-memory FIFOs, within noise of CMA's
// bandwidth here (2-rank 64 MiB all_reduce, A/B in one session). KILN_UCX_PEER_ERRORS=1 asks for
// peer error handling instead: every peer failure becomes an error on the requests at once, but
// UCX then leaves shared memory out and carries small messages over TCP (slower), and the
// mailboxes are not mapped. A peer that dies while a rank waits on its mailbox leaves the memory
// mapped (UCX's shared segments live until the last process detaches), so that is a timeout too.
UcxTransport::UcxTransport(TCPStore& store, const std::string& key_prefix, int rank, int world)
    : eps_(world, nullptr), rank_(rank) {
  const char* pe = std::getenv("KILN_UCX_PEER_ERRORS");
  const bool peer_errors = pe && std::string(pe) == "1";
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  if (!peer_errors && !std::getenv("UCX_RNDV_THRESH"))  // Note [Peer failures]
    check(ucp_config_modify(config, "RNDV_THRESH", "inf"), "ucp_config_modify(RNDV_THRESH)");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA;
  ucs_status_t s = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(s, "ucp_init");

  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  check(ucp_worker_create(context_, &wp, &worker_), "ucp_worker_create");
  check(ucp_worker_get_efd(worker_, &efd_), "ucp_worker_get_efd");

  ucp_address_t* addr = nullptr;
  size_t len = 0;
  check(ucp_worker_get_address(worker_, &addr, &len), "ucp_worker_get_address");
  store.set(key_prefix + std::to_string(rank), std::string(reinterpret_cast<char*>(addr), len));
  ucp_worker_release_address(worker_, addr);

  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    std::string remote = store.get(key_prefix + std::to_string(peer));
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(remote.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    if (peer_errors) {
      ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};  // the requests fail instead
    }
    check(ucp_ep_create(worker_, &ep, &eps_[peer]), "ucp_ep_create");
  }
  const char* shm = std::getenv("KILN_UCX_SHM");
  map_mailboxes(store, key_prefix, !peer_errors && !(shm && std::string(shm) == "0"));
}

// Note [Shared-memory mailboxes]. Layout (comm/collectives.cpp reads and writes it): per world
// rank p, two cache lines of counters, then per p kMailboxSlots slots of a 64-byte header and
// slot_bytes_ of data. Slots shrink with the world size (a mailbox is 16 MiB up to 256 ranks).
// A rank with mailboxes off still publishes (an empty mailbox), so its peers do not wait for it.
void UcxTransport::map_mailboxes(TCPStore& store, const std::string& key_prefix, bool enabled) {
  const size_t world = eps_.size();
  slot_bytes_ = std::clamp<size_t>((size_t{16} << 20) / (world * kMailboxSlots), 16 << 10, 256 << 10);
  slot_bytes_ &= ~size_t{63};
  const size_t bytes = world * 128 + world * kMailboxSlots * (64 + slot_bytes_);
  mailboxes_.assign(world, nullptr);
  rkeys_.assign(world, nullptr);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  std::string published;  // empty: no mailbox here, peers fall back to messages
  void* packed = nullptr;
  size_t packed_len = 0;
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
  if (enabled && ucp_mem_map(context_, &mp, &mailbox_mem_) == UCS_OK &&
      ucp_mem_query(mailbox_mem_, &attr) == UCS_OK &&
      ucp_rkey_pack(context_, mailbox_mem_, &packed, &packed_len) == UCS_OK) {
    std::memset(attr.address, 0, bytes);
    mailboxes_[rank_] = static_cast<char*>(attr.address);
    const auto addr = reinterpret_cast<uint64_t>(attr.address);
    published.assign(reinterpret_cast<const char*>(&addr), sizeof addr);
    published.append(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
  }
  store.set(key_prefix + "mailbox/" + std::to_string(rank_), published);
  for (size_t peer = 0; peer < world; ++peer) {
    if (static_cast<int>(peer) == rank_) continue;
    const std::string got = store.get(key_prefix + "mailbox/" + std::to_string(peer));
    if (!enabled || got.size() <= sizeof(uint64_t)) continue;
    uint64_t addr = 0;
    std::memcpy(&addr, got.data(), sizeof addr);
    void* ptr = nullptr;
    if (ucp_ep_rkey_unpack(eps_[peer], got.data() + sizeof addr, &rkeys_[peer]) == UCS_OK &&
        ucp_rkey_ptr(rkeys_[peer], addr, &ptr) == UCS_OK)
      mailboxes_[peer] = static_cast<char*>(ptr);
  }
  // Which mailboxes each rank mapped, so that every member of a group makes the same choice.
  std::string mapped(world, '0');
  for (size_t peer = 0; peer < world; ++peer)
    if (mailboxes_[peer]) mapped[peer] = '1';
  store.set(key_prefix + "mapped/" + std::to_string(rank_), mapped);
  mapped_.resize(world);
  for (size_t peer = 0; peer < world; ++peer)
    mapped_[peer] = static_cast<int>(peer) == rank_
                        ? mapped
                        : store.get(key_prefix + "mapped/" + std::to_string(peer));
}

bool UcxTransport::shared_memory(const std::vector<int>& ranks) const {
  if (broken_ || mapped_.empty()) return false;
  for (int q : ranks)
    for (int p : ranks)
      if (mapped_[q].size() != mapped_.size() || mapped_[q][p] != '1') return false;
  return true;
}

UcxTransport::~UcxTransport() {
  for (ucp_rkey_h& k : rkeys_)
    if (k) ucp_rkey_destroy(k);
  // A flushing close waits for the peer; bound it, then force (a dead peer never answers).
  for (ucp_ep_h& ep : eps_) {
    if (!ep) continue;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = broken_ ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep, &p);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < deadline)
      ucp_worker_progress(worker_);
    if (UCS_PTR_IS_PTR(req)) {
      if (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_request_cancel(worker_, req);
      ucp_request_free(req);
    }
    ep = nullptr;
  }
  if (mailbox_mem_) ucp_mem_unmap(context_, mailbox_mem_);
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

UcxTransport::Request UcxTransport::send(int peer, uint64_t tag, const void* buf, size_t bytes) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t r = ucp_tag_send_nbx(eps_.at(peer), buf, bytes, tag, &p);
  KILN_CHECK(!UCS_PTR_IS_ERR(r), Runtime, "UCX: send of ", bytes, " bytes to rank ", peer,
             " failed: ", ucs_status_string(UCS_PTR_STATUS(r)));
  return Request{r, peer, false, bytes};
}

UcxTransport::Request UcxTransport::recv(int peer, uint64_t tag, void* buf, size_t bytes) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
  p.datatype = ucp_dt_make_contig(1);
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buf, bytes, tag, ~uint64_t{0}, &p);
  KILN_CHECK(!UCS_PTR_IS_ERR(r), Runtime, "UCX: receive of ", bytes, " bytes from rank ", peer,
             " failed: ", ucs_status_string(UCS_PTR_STATUS(r)));
  return Request{r, peer, true, bytes};
}

bool UcxTransport::test(Request& r) {
  if (!r.handle) return true;
  ucp_worker_progress(worker_);
  ucs_status_t s;
  size_t got = r.bytes;
  if (r.is_recv) {
    ucp_tag_recv_info_t info{};
    s = ucp_tag_recv_request_test(r.handle, &info);
    got = info.length;
  } else {
    s = ucp_request_check_status(r.handle);
  }
  if (s == UCS_INPROGRESS) return false;
  ucp_request_free(r.handle);
  r.handle = nullptr;
  KILN_CHECK(s == UCS_OK, Runtime, "UCX: ", r.is_recv ? "receive from" : "send to", " rank ",
             r.peer, " failed: ", ucs_status_string(s),
             s == UCS_ERR_MESSAGE_TRUNCATED ? " (the ranks passed different sizes)" : "");
  KILN_CHECK(got == r.bytes, Runtime, "UCX: expected ", r.bytes, " bytes from rank ", r.peer,
             ", received ", got, " (the ranks passed different sizes)");
  return true;
}

void UcxTransport::progress() { ucp_worker_progress(worker_); }

int UcxTransport::arm() { return ucp_worker_arm(worker_) == UCS_OK ? efd_ : -1; }

void UcxTransport::wait_event(std::chrono::microseconds max) {
  // Arming fails with BUSY while events are still unprocessed: the caller progresses again.
  if (arm() < 0) return;
  pollfd p{efd_, POLLIN, 0};
  poll(&p, 1, static_cast<int>((max.count() + 999) / 1000));
}

void UcxTransport::cancel(Request& r) {
  if (!r.handle) return;
  ucp_request_cancel(worker_, r.handle);
  ucp_request_free(r.handle);
  r.handle = nullptr;
}

}  // namespace kiln::dist
