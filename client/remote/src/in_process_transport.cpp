// InProcessTransport: the embedded worker. Batches run synchronously on a worker::Session;
// replies wait in a queue until the connection reads them.
#include "kiln/client/transport.h"
#include "kiln/error.h"

namespace kiln::client {

InProcessTransport::InProcessTransport(worker::SessionOptions options)
    : session_(std::move(options)),
      device_(session_.options().device.str()),
      name_("in-process worker '" + session_.options().worker_id + "'") {}

void InProcessTransport::send(proto::Batch&& batch) {
  absl::Status st = session_.run(batch, [this](proto::WorkerMessage&& m) {
    replies_.push_back(std::move(m));
  });
  if (!st.ok()) raise_status(st, name_);
}

proto::WorkerMessage InProcessTransport::receive() {
  KILN_CHECK(next_ < replies_.size(), Runtime, name_, ": no reply is pending");
  proto::WorkerMessage m = std::move(replies_[next_++]);
  if (next_ == replies_.size()) {
    replies_.clear();
    next_ = 0;
  }
  return m;
}

}  // namespace kiln::client
