// kiln/client/session.h: connecting to workers (DESIGN.md "Execution").
//
//   auto s = kiln::client::connect("127.0.0.1:5000");          // a worker, or a coordinator
//   kiln::Device dev = s.device();                             // Device("remote:N")
//   model.to(dev);  auto x = kiln::randn({8, 4}).to(dev);      // record on the worker
//   float loss = model.forward(x).sum().item<float>();         // flush + fetch
//   s.sync();  s.close();
//
//   auto e = kiln::client::connect_in_process();               // the embedded worker
//
// connect(address): when the address answers Coordinator.OpenSession, the session's workers are
// used (Hello carries the session id and each worker's rank); when it answers UNIMPLEMENTED it
// is a worker, reached directly (then workers must be 1). With no address, KILN_COORDINATOR
// (set by `kiln submit`, with KILN_JOB_ID: then the session is the job's gang) names it. The token comes from
// ConnectOptions or KILN_TOKEN. The address "inproc" means connect_in_process(workers).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/client/connection.h"
#include "kiln/worker/session.h"  // SessionOptions (a struct; no worker code is linked)

namespace kiln::client {

struct ConnectOptions {
  int workers = 1;
  std::string token;             // "" : KILN_TOKEN, if set
  int connect_timeout_ms = 5000;
  uint32_t wait_ms = 0;          // how long a coordinator may wait for free workers
};

class Session {
 public:
  Session() = default;
  // The session's device, Device(Remote, N): with several workers, every op recorded on it
  // runs on each of them (Note [Gangs] in kiln/client/transport.h).
  Device device() const;
  int world_size() const;
  // `t` split along dim 0 into world_size() equal shards, shard r on rank r (a data-parallel
  // batch); the result has the shard's shape. With one worker: t.to(device()).
  Tensor scatter(const Tensor& t) const;
  // Averages every defined .grad of `params` over the workers (the all_reduce of data-parallel
  // training, recorded as an op on the gang's process group "world"); nothing with one worker.
  void all_reduce_gradients(const std::vector<Tensor>& params) const;
  // Marks the end of a training step (the next step number, from 1): each worker records its
  // step time, the part not spent waiting for collectives, and its own value of `loss` (a
  // one-element tensor on this session's device, or undefined), for the coordinator's job
  // telemetry (`kiln status`; See Note [Step telemetry] in worker/src/reports.h). `tokens`: what
  // the step processed on the whole gang (0: not counted). Costs no round trip.
  void log_step(const Tensor& loss = {}, double tokens = 0) const;
  // Runs everything recorded so far on every worker; raises the first remote error.
  void sync() const;
  // Flushes, frees the session's workers (CloseSession at a coordinator); later ops on its
  // tensors raise. Idempotent; also done when the last copy of the Session dies.
  void close() const;
  const std::string& session_id() const;
  Connection& connection() const;

 private:
  friend Session connect(const std::string&, ConnectOptions);
  friend Session connect_in_process(int, worker::SessionOptions);
  struct State;
  std::shared_ptr<State> state_;
};

Session connect(const std::string& address = "", ConnectOptions options = {});
// `workers` embedded workers (in-process transports), for tests and single-process use. They
// form a gang without a process group: collectives need real workers from a coordinator.
// RuntimeError when kiln_embedded is not linked (See InProcessFactory in transport.h).
Session connect_in_process(int workers = 1, worker::SessionOptions options = {});

// `t` split along dim 0 into ranks.size() equal shards, shard i on gang worker ranks[i] (a
// pipeline stage's data-parallel replicas), one value held by those workers (Note [Gang
// stages]); the result has the shard's shape.
Tensor scatter_to(const Tensor& t, Device device, const std::vector<int>& ranks);

}  // namespace kiln::client

namespace kiln {
using client::connect;  // kiln::connect(address, {.workers = N}), as in Python's kiln.connect
}  // namespace kiln
