// tests/worker/fuzz/streams.h: the session fuzzer's second reading of its input (session_fuzz.cpp,
// and the replay test): the Batch's commands as a multi-tenant, multi-stream sequence on a worker
// registered with a coordinator, through its StreamGate (Note [One stream per worker]) and one
// Session per admitted stream. Tenant a's stream is open at the start; Sync commands steer the
// sequence (request % 4: 0 opens a stream with claim request / 4 of kClaims, 1 closes one, 2
// switches the current one, 3 is a real Sync); every other command runs on the current stream.
// The coordinator is a table: tenant a's session s-a and tenant b's s-b include this worker, s-x
// does not.
//
// Checked after every step (KILN_ASSERT, so the fuzzer reports a crash):
//  - a stream is admitted exactly when its Hello carries a session of this worker's gang and that
//    session's secret (another tenant's secret, none, or a direct Hello are refused);
//  - at most one stream holds the worker at a time;
//  - the bytes held by every live Session together stay within the worker's memory limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <absl/strings/str_cat.h>
#include <google/protobuf/stubs/logging.h>

#include "kiln/error.h"
#include "kiln/proto/service.h"
#include "kiln/worker/session.h"
#include "kiln/worker/stream_gate.h"

namespace kiln::fuzz {

namespace streams_detail {

constexpr uint64_t kLimit = 64 << 20;

struct Claim {
  const char* session;
  const char* secret;
  bool valid;  // the coordinator table below answers it, with this worker in the gang
};
// Tenant a's own Hello, b with a's session id, no one with it, b's own, a session of another
// gang, a direct Hello, an unknown session.
constexpr Claim kClaims[] = {{"s-a", "sec-a", true},  {"s-a", "sec-b", false},
                             {"s-a", "", false},      {"s-b", "sec-b", true},
                             {"s-x", "sec-x", false}, {"", "", false},
                             {"s-zz", "sec-a", false}};

inline absl::StatusOr<proto::SessionInfo> lookup(const std::string& id, const std::string& secret) {
  struct Row {
    const char *id, *secret;
    std::vector<const char*> gang;
  };
  static const Row rows[] = {{"s-a", "sec-a", {"w0"}},
                             {"s-b", "sec-b", {"w1", "w0"}},
                             {"s-x", "sec-x", {"w1"}}};
  for (const Row& r : rows) {
    if (id != r.id) continue;
    if (secret != r.secret) return absl::PermissionDeniedError("wrong secret");
    proto::SessionInfo info;
    info.set_session_id(id);
    for (size_t k = 0; k < r.gang.size(); ++k) {
      info.add_worker_ids(r.gang[k]);
      if (std::string(r.gang[k]) == "w0") info.set_rank(static_cast<int32_t>(k));
    }
    info.set_world_size(static_cast<int32_t>(r.gang.size()));
    return info;
  }
  return absl::NotFoundError("unknown session");
}

struct Stream {
  std::optional<worker::StreamGate::Lease> lease;
  std::unique_ptr<worker::Session> session;  // destroyed before the lease, as in server.cpp
  std::shared_ptr<bool> cancelled = std::make_shared<bool>(false);
  void close() {
    session.reset();
    lease.reset();
  }
};

}  // namespace streams_detail

inline void streams(const uint8_t* data, size_t size) {
  using namespace streams_detail;
  google::protobuf::LogSilencer quiet;
  proto::Batch batch;
  if (!batch.ParseFromArray(data, static_cast<int>(size))) return;
  worker::StreamGate gate({.token = "wtok", .coordinated = true, .worker_id = "w0"});
  std::vector<Stream> open;  // admitted or not; closed ones stay, without a lease
  size_t current = 0;
  auto check = [&] {
    int holders = 0;
    uint64_t bytes = 0;
    for (const Stream& s : open) {
      holders += s.lease.has_value();
      if (s.session) bytes += s.session->memory_in_use_bytes();
    }
    KILN_ASSERT(holders <= 1, holders, " streams hold the worker at once");
    KILN_ASSERT(bytes <= kLimit, "sessions hold ", bytes, " bytes past the limit ", kLimit);
    KILN_ASSERT(gate.holder().has_value() == (holders == 1), "the gate and the streams disagree");
  };
  auto open_stream = [&](size_t which) {
    const Claim& claim = kClaims[which];
    proto::Hello hello;
    hello.set_protocol_version(proto::kProtocolVersion);
    hello.set_session_id(claim.session);
    hello.set_session_secret(claim.secret);
    absl::StatusOr<proto::SessionInfo> info = gate.admit(hello, lookup);
    KILN_ASSERT(info.ok() == claim.valid, "claim ", which, " (session '", claim.session,
                "') was ", info.ok() ? "admitted" : "refused", ": ", info.status().ToString());
    Stream& s = open.emplace_back();
    current = open.size() - 1;
    if (!info.ok()) return;
    auto lease = gate.enter(claim.session, [flag = s.cancelled] { *flag = true; },
                            std::chrono::milliseconds(0));
    if (!lease.ok()) return;  // another stream holds the worker
    s.lease.emplace(std::move(*lease));
    s.session = std::make_unique<worker::Session>(
        worker::SessionOptions{.worker_id = "w0", .memory_limit_bytes = kLimit,
                               .rank = info->rank(), .world_size = info->world_size()});
  };
  open_stream(0);
  for (const proto::Command& c : batch.commands()) {
    for (Stream& s : open)  // a cancelled stream ends, as its gRPC handler would
      if (*s.cancelled) s.close();
    const uint64_t r = c.has_sync() ? c.sync().request() : 3;
    const uint64_t arg = r / 4;
    if (c.has_sync() && r % 4 == 0 && open.size() < 64) {
      open_stream(arg % std::size(kClaims));
    } else if (c.has_sync() && r % 4 == 1 && !open.empty()) {
      open[arg % open.size()].close();
    } else if (c.has_sync() && r % 4 == 2 && !open.empty()) {
      current = arg % open.size();
    } else if (current < open.size() && open[current].session) {
      proto::Batch one;
      *one.add_commands() = c;
      if (!open[current].session->run(one, [](proto::WorkerMessage&&) {}).ok())
        open[current].close();  // run() ended the stream
    }
    check();
  }
}

}  // namespace kiln::fuzz
