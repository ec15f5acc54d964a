// The gangs' rendezvous store: a key-value map per open session, in memory (it only has to
// outlive a gang's start-up), dropped when the session ends. The ops follow torch's TCPStore:
// set, get (optionally waiting for the key), add (a decimal counter) and compare_set. Only the
// session's tenant and the workers of its gang reach its keys (Note [Session credentials] in
// sessions.cpp).
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include "kiln/coord/coordinator.h"
#include "state.h"

namespace kiln::coord {

absl::StatusOr<proto::StoreReply> Coordinator::store(const proto::StoreRequest& req,
                                                     const Caller& caller,
                                                     const Cancelled& cancelled) {
  if (req.session_id().empty()) return absl::InvalidArgumentError("session_id is required");
  if (req.key().empty()) return absl::InvalidArgumentError("key is required");
  const std::string& op = req.op();
  if (op != "set" && op != "get" && op != "add" && op != "compare_set") {
    return absl::InvalidArgumentError(
        absl::StrCat("op must be set, get, add or compare_set; got '", op, "'"));
  }
  std::unique_lock lock(mu_);
  const auto until = Clock::now() + std::chrono::milliseconds(req.wait_ms());
  while (true) {
    auto s = sessions_.find(req.session_id());
    if (s == sessions_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown session ", req.session_id()));
    }
    if (auto st = check_access_locked(s->second, caller, req.worker_id()); !st.ok()) return st;
    if (s->second.state == "failed") {
      return absl::UnavailableError(
          absl::StrCat("session ", s->first, " failed: ", s->second.message));
    }
    if (s->second.state != "open") {
      return absl::FailedPreconditionError(absl::StrCat("session ", s->first, " is closed"));
    }
    auto& kv = kv_[s->first];
    auto it = kv.find(req.key());
    proto::StoreReply reply;
    if (op == "set") {
      kv[req.key()] = req.value();
      changed_locked();
      return reply;
    }
    if (op == "add") {
      int64_t counter = 0;
      if (it != kv.end() && !absl::SimpleAtoi(it->second, &counter)) {
        return absl::FailedPreconditionError(
            absl::StrCat("key '", req.key(), "' holds a value that is not a counter"));
      }
      counter += req.amount();
      kv[req.key()] = absl::StrCat(counter);
      changed_locked();
      reply.set_counter(counter);
      return reply;
    }
    if (op == "compare_set") {
      // Swaps when the key holds `expected`, or is absent and `expected` is empty; answers the
      // value the key holds afterwards.
      const bool match = it == kv.end() ? req.expected().empty() : it->second == req.expected();
      if (match) {
        kv[req.key()] = req.value();
        changed_locked();
      }
      reply.set_value(kv.count(req.key()) ? kv[req.key()] : "");
      return reply;
    }
    if (it != kv.end()) {
      reply.set_value(it->second);
      return reply;
    }
    if (req.wait_ms() == 0) return absl::NotFoundError(absl::StrCat("no key '", req.key(), "'"));
    if (stopping_) return absl::UnavailableError("the coordinator is shutting down");
    if (Clock::now() >= until || cancelled()) {
      return absl::DeadlineExceededError(
          absl::StrCat("key '", req.key(), "' was not set within ", req.wait_ms(), " ms"));
    }
    cv_.wait_until(lock, std::min(until, Clock::now() + std::chrono::milliseconds(200)));
  }
}

}  // namespace kiln::coord
