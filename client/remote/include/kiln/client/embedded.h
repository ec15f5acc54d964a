// kiln/client/embedded.h: the embedded worker, in library kiln_embedded (the one client library
// that links the worker; kiln_client links none of it, and finds this transport through
// set_in_process_factory, which kiln_embedded calls when it is loaded).
//
//   auto s = kiln::client::connect_in_process(2);      // two embedded workers (kiln/client/session.h)
//   auto& t = dynamic_cast<kiln::client::InProcessTransport&>(s.connection().transport());
#pragma once

#include <string>
#include <vector>

#include "kiln/client/transport.h"
#include "kiln/worker/session.h"

namespace kiln::client {

// Runs batches on a kiln::worker::Session in this process.
class InProcessTransport final : public Transport {
 public:
  explicit InProcessTransport(worker::SessionOptions options);
  void send(proto::Batch&& batch) override;
  proto::WorkerMessage receive() override;
  const std::string& worker_device() const override { return device_; }
  const std::string& name() const override { return name_; }
  void close() override {}
  worker::Session& session() { return session_; }

 private:
  worker::Session session_;
  std::string device_;
  std::string name_;
  std::vector<proto::WorkerMessage> replies_;  // not yet received, oldest first
  size_t next_ = 0;
};

}  // namespace kiln::client
