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

std::optional<std::string_view> authorization_of(const grpc::ServerContext& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

absl::Status check_bearer(std::optional<std::string_view> authorization, std::string_view token) {
  if (token.empty()) return absl::OkStatus();
  if (!authorization)
    return absl::UnauthenticatedError("missing 'authorization: Bearer TOKEN' metadata");
  if (!secrets_equal(*authorization, "Bearer " + std::string(token)))
    return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

absl::Status check_token(const grpc::ServerContext& ctx, std::string_view token) {
  return check_bearer(authorization_of(ctx), token);
}

absl::Status check_token_text(std::string_view token, std::string_view what) {
  if (token.empty())
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": the token is empty"));
  for (char c : token) {
    if (c > ' ' && c < 0x7f) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what), ": a token must be printable ASCII without spaces; got ", token.size(),
        " characters with ", c == ' ' ? "a space" : "a control or non-ASCII byte"));
  }
  return absl::OkStatus();
}

bool secrets_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const std::string_view& longer = a.size() >= b.size() ? a : b;
  for (size_t i = 0; i < longer.size(); ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
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
