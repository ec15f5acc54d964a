#include "kiln/proto/service.h"

#include <absl/strings/str_cat.h>

namespace kiln::proto {

grpc::Status to_grpc(const absl::Status& st) {
  if (st.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

absl::Status from_grpc(const grpc::Status& st) {
  if (st.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
}

absl::Status check_version(uint32_t peer, std::string_view peer_name, std::string_view self_name) {
  if (peer == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(std::string(peer_name), " speaks kiln protocol ", peer,
                                                    " but this ", std::string(self_name), " speaks ",
                                                    kProtocolVersion, "; use matching Kiln versions"));
}

absl::Status check_token(const grpc::ServerContext& ctx, std::string_view token) {
  if (token.empty()) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return absl::UnauthenticatedError("missing 'authorization: Bearer TOKEN' metadata");
  std::string_view got(it->second.data(), it->second.size());
  if (got != "Bearer " + std::string(token)) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

void add_token(grpc::ClientContext& ctx, std::string_view token) {
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + std::string(token));
}

absl::Status check_listen_address(std::string_view address, bool secured) {
  if (secured) return absl::OkStatus();
  for (std::string_view lo : {"127.0.0.1:", "localhost:", "[::1]:"}) {
    if (address.substr(0, lo.size()) == lo) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "refusing to listen on '", std::string(address),
      "' without a token or TLS: use a loopback address (127.0.0.1:PORT) or configure --token"));
}

}  // namespace kiln::proto
