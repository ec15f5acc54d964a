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
    for (const proto::Command& c : batch.commands())
      if (!c.has_fetch()) *copy.add_commands() = c;
    if (copy.commands_size() > 0) ranks_[r]->send(std::move(copy));
  }
  ranks_[0]->send(std::move(batch));
}

proto::WorkerMessage GangTransport::receive() {
  proto::WorkerMessage m = ranks_[0]->receive();
  if (!m.has_sync()) return m;
  for (size_t r = 1; r < ranks_.size(); ++r) {
    proto::WorkerMessage mr = ranks_[r]->receive();
    KILN_CHECK(mr.has_sync() && mr.sync().request() == m.sync().request(), Runtime,
               ranks_[r]->name(), ": expected the reply to sync ", m.sync().request(), ", got ",
               mr.ShortDebugString());
    if (!m.sync().has_error() && mr.sync().has_error()) {
      m = std::move(mr);
      m.mutable_sync()->mutable_error()->set_message("rank " + std::to_string(r) + " (" +
                                                     ranks_[r]->name() + "): " +
                                                     m.sync().error().message());
    }
  }
  return m;
}

void GangTransport::close() {
  for (auto& t : ranks_) t->close();
}

}  // namespace kiln::client
