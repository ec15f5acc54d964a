// tests/fake_coordinator.h: a small in-process Coordinator for the worker's and the client's
// tests: it records registrations and heartbeats, opens sessions "sess-K" on the first N
// registered workers (waiting up to 10 s for them), answers LookupSession from `sessions`
// (a worker's lookup must carry the secret of the session, secret_of(id)), keeps a Store,
// records CloseSession, and can forget a worker (NOT_FOUND) or close sessions on the next
// heartbeat.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "kiln/proto/coordinator.grpc.pb.h"

namespace kiln::testing {

class FakeCoordinator final : public proto::Coordinator::Service {
 public:
  FakeCoordinator() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeCoordinator() override {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    server_->Shutdown(std::chrono::system_clock::now());
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  static std::string secret_of(const std::string& session_id) { return "secret-" + session_id; }

  grpc::Status RegisterWorker(grpc::ServerContext*, const proto::RegisterWorkerRequest* req,
                              proto::RegisterWorkerReply* reply) override {
    std::lock_guard<std::mutex> lock(mu);
    registrations.push_back(*req);
    reply->set_epoch(registrations.size());
    reply->set_heartbeat_interval_ms(50);
    forget = false;
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    std::lock_guard<std::mutex> lock(mu);
    heartbeats.push_back(*req);
    cv.notify_all();
    if (forget) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    for (const auto& s : close) reply->add_close_sessions(s);
    return grpc::Status::OK;
  }
  grpc::Status OpenSession(grpc::ServerContext*, const proto::OpenSessionRequest* req,
                           proto::SessionInfo* info) override {
    std::unique_lock<std::mutex> lock(mu);
    opened.push_back(*req);
    std::vector<const proto::RegisterWorkerRequest*> workers;
    auto enough = [&] {
      workers.clear();
      for (const auto& r : registrations) {
        bool seen = false;
        for (auto* w : workers) seen |= w->worker_id() == r.worker_id();
        if (!seen) workers.push_back(&r);
      }
      return static_cast<int>(workers.size()) >= req->workers();
    };
    if (!cv.wait_for(lock, std::chrono::seconds(10), enough))
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "not enough workers");
    const std::string id = "sess-" + std::to_string(opened.size());
    info->set_session_id(id);
    info->set_session_secret(secret_of(id));
    info->set_world_size(req->workers());
    std::vector<std::string>& ids = sessions[id];
    for (int r = 0; r < req->workers(); ++r) {
      info->add_worker_addresses(workers[r]->address());
      info->add_worker_ids(workers[r]->worker_id());
      ids.push_back(workers[r]->worker_id());
    }
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const proto::CloseSessionRequest* req,
                            proto::CloseSessionReply*) override {
    std::lock_guard<std::mutex> lock(mu);
    closed.push_back(req->session_id());
    return grpc::Status::OK;
  }
  grpc::Status LookupSession(grpc::ServerContext*, const proto::LookupSessionRequest* req,
                             proto::SessionInfo* info) override {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sessions.find(req->session_id());
    if (it == sessions.end())
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no session '" + req->session_id() + "'");
    if (!req->worker_id().empty() && req->session_secret() != secret_of(req->session_id()))
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "wrong session secret");
    info->set_session_id(req->session_id());
    for (size_t r = 0; r < it->second.size(); ++r) {
      info->add_worker_ids(it->second[r]);
      if (it->second[r] == req->worker_id()) info->set_rank(static_cast<int>(r));
    }
    info->set_world_size(static_cast<int>(it->second.size()));
    return grpc::Status::OK;
  }
  // set and get (waiting up to wait_ms, in slices so a cancelled call or shutdown ends it).
  grpc::Status Store(grpc::ServerContext* ctx, const proto::StoreRequest* req,
                     proto::StoreReply* reply) override {
    std::unique_lock<std::mutex> lock(mu);
    store_callers.push_back(req->worker_id());
    std::string key = req->session_id() + "/" + req->key();
    if (req->op() == "set") {
      store[key] = req->value();
      cv.notify_all();
      return grpc::Status::OK;
    }
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(req->wait_ms());
    while (!store.count(key) && !stopping && !ctx->IsCancelled() &&
           std::chrono::steady_clock::now() < end)
      cv.wait_for(lock, std::chrono::milliseconds(50));
    if (!store.count(key)) return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, key);
    reply->set_value(store[key]);
    return grpc::Status::OK;
  }

  // Waits until `pred` holds (under the lock); false after kWait.
  template <typename P>
  bool wait(P pred, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, pred);
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::RegisterWorkerRequest> registrations;
  std::vector<proto::HeartbeatRequest> heartbeats;
  bool forget = false;
  std::vector<std::string> close;
  std::map<std::string, std::vector<std::string>> sessions;  // id -> worker ids, rank order
  std::vector<proto::OpenSessionRequest> opened;
  std::vector<std::string> closed;
  std::map<std::string, std::string> store;
  std::vector<std::string> store_callers;  // the worker_id of every Store call
  bool stopping = false;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace kiln::testing
