// GangTransport: one SPMD program over N workers (Note [Gangs] in kiln/client/transport.h).
#include "kiln/client/transport.h"
#include "kiln/error.h"

namespace kiln::client {

GangTransport::GangTransport(std::vector<std::unique_ptr<Transport>> ranks)
    : ranks_(std::move(ranks)) {
  KILN_CHECK(!ranks_.empty(), Value, "a gang needs at least one worker");
  name_ = "gang of " + std::to_string(ranks_.size()) + " workers (rank 0: " + ranks_[0]->name() + ")";
}

void GangTransport::send(proto::Batch&& batch) {
  for (size_t r = 1; r < ranks_.size(); ++r) {
    proto::Batch copy;
    for (const proto::Command& c : batch.commands()) {
      if (c.has_fetch()) copy.add_commands()->mutable_sync()->set_request(c.fetch().request());
      else *copy.add_commands() = c;
    }
    if (copy.commands_size() > 0) ranks_[r]->send(std::move(copy));
  }
  ranks_[0]->send(std::move(batch));
}

std::optional<proto::Error> GangTransport::check_ranks(uint64_t request) {
  std::optional<proto::Error> first;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    proto::WorkerMessage mr = ranks_[r]->receive();  // a dead rank raises UNAVAILABLE here
    KILN_CHECK(mr.has_sync() && mr.sync().request() == request, Runtime, ranks_[r]->name(),
               ": expected the reply to sync ", request, ", got ", mr.ShortDebugString());
    if (!first && mr.sync().has_error()) {
      first = mr.sync().error();
      first->set_message("rank " + std::to_string(r) + " (" + ranks_[r]->name() +
                         "): " + first->message());
    }
  }
  return first;
}

namespace {

// Rank 0's reply carries another rank's error when it has none of its own; when it has one, the
// other's is appended: a collective that timed out on rank 0 was often left by a rank that failed
// first, and that rank's error names the cause.
template <typename Reply>
void merge(Reply& reply, const proto::Error& other) {
  if (!reply.has_error()) {
    *reply.mutable_error() = other;
  } else if (reply.error().message() != other.message()) {
    reply.mutable_error()->set_message(reply.error().message() + "; and " + other.message());
  }
}

}  // namespace

proto::WorkerMessage GangTransport::receive() {
  proto::WorkerMessage m = ranks_[0]->receive();
  if (m.has_fetch() && checked_fetch_ != m.fetch().request()) {  // its first piece
    checked_fetch_ = m.fetch().request();
    std::optional<proto::Error> e = check_ranks(m.fetch().request());  // always read: in step
    if (e) merge(*m.mutable_fetch(), *e);
    return m;
  }
  if (!m.has_sync()) return m;
  std::optional<proto::Error> e = check_ranks(m.sync().request());
  if (e) merge(*m.mutable_sync(), *e);
  return m;
}

void GangTransport::close() {
  for (auto& t : ranks_) t->close();
}

}  // namespace kiln::client
