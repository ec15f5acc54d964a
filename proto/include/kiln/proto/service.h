// kiln/proto/service.h: what every service layer (worker/, client/, coordinator/) shares about
// talking gRPC: the protocol version, message sizes, absl::Status <-> grpc::Status (DESIGN.md
// "Errors": the codes map 1:1), bearer-token checks and the loopback-only listener rule.
//
//   if (auto st = kiln::proto::check_token(*ctx, token_); !st.ok()) return kiln::proto::to_grpc(st);
//   absl::Status st = kiln::proto::from_grpc(stub->Call(&ctx, req, &reply));
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <absl/status/status.h>
#include <grpcpp/grpcpp.h>

namespace kiln::proto {

// Bumped on every incompatible change of the .proto files; peers with different versions
// refuse each other (FAILED_PRECONDITION naming both versions).
inline constexpr uint32_t kProtocolVersion = 3;  // 2: DTensor instructions; 3: gang stages
// Tensors larger than this travel in several TensorData pieces (tensor.proto).
inline constexpr size_t kChunkBytes = size_t{1} << 20;
// The largest message a server or channel accepts; larger ones fail with RESOURCE_EXHAUSTED.
inline constexpr int kMaxMessageBytes = 16 << 20;
// The largest Chrome trace one worker sends for a profile request (it travels in one heartbeat;
// Note [Remote profiling] in coordinator/src/profiles.h). A bigger one is replaced by an error.
inline constexpr size_t kMaxRankTraceBytes = size_t{12} << 20;

grpc::Status to_grpc(const absl::Status& st);
absl::Status from_grpc(const grpc::Status& st);

// OK when `peer` speaks our protocol; else FAILED_PRECONDITION: "<peer_name> speaks kiln
// protocol P but this <self_name> speaks V; use matching Kiln versions".
absl::Status check_version(uint32_t peer, std::string_view peer_name, std::string_view self_name);

// OK when `token` is empty (auth off) or the call carries `authorization: Bearer <token>`;
// else UNAUTHENTICATED.
absl::Status check_token(const grpc::ServerContext& ctx, std::string_view token);
// check_token for the value of a call's authorization metadata (nullopt: the call had none).
absl::Status check_bearer(std::optional<std::string_view> authorization, std::string_view token);
// The value of a call's authorization metadata, if it has one.
std::optional<std::string_view> authorization_of(const grpc::ServerContext& ctx);
// Adds `authorization: Bearer <token>` to an outgoing call (nothing when token is empty).
void add_token(grpc::ClientContext& ctx, std::string_view token);
// A configured token must be printable ASCII without spaces (it travels in an HTTP/2 header, and
// a blank one would pass for a token); INVALID_ARGUMENT naming `what` ("--token") otherwise.
absl::Status check_token_text(std::string_view token, std::string_view what);
// a == b, in a time that does not depend on where they differ (tokens and session secrets).
bool secrets_equal(std::string_view a, std::string_view b);

// A listener address is allowed on a non-loopback host only with a token or TLS configured;
// INVALID_ARGUMENT naming the address otherwise. "127.0.0.1:N", "[::1]:N" and "localhost:N"
// are loopback.
absl::Status check_listen_address(std::string_view address, bool secured);

}  // namespace kiln::proto
