// InProcessTransport: the embedded worker (kiln/client/embedded.h). Batches run synchronously on
// a worker::Session; replies wait in a queue until the connection reads them.
#include "kiln/client/embedded.h"
#include "kiln/dispatch_key.h"
#include "kiln/error.h"

namespace kiln::client {

InProcessTransport::InProcessTransport(worker::SessionOptions options)
    : session_(std::move(options)),
      device_(session_.options().device.str()),
      name_("in-process worker '" + session_.options().worker_id + "'") {}

void InProcessTransport::send(proto::Batch&& batch) {
  // The worker runs on the client's thread, but not in the client's dispatch state (a flush
  // can happen inside backward, under vmap or while tracing): it starts from the defaults, as
  // a worker thread would.
  LocalDispatchKeySet& tls = tls_local_dispatch_key_set();
  LocalDispatchKeySet saved = tls;
  tls = LocalDispatchKeySet{};
  struct Restore {
    LocalDispatchKeySet& tls;
    LocalDispatchKeySet saved;
    ~Restore() { tls = saved; }
  } restore{tls, saved};
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

namespace {

const bool g_registered = [] {  // See InProcessFactory in kiln/client/transport.h
  set_in_process_factory([](const worker::SessionOptions& o) -> std::unique_ptr<Transport> {
    return std::make_unique<InProcessTransport>(o);
  });
  return true;
}();

}  // namespace

}  // namespace kiln::client
