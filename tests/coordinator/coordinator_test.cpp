// kiln-coordinator as a process on loopback, driven through raw gRPC stubs: the worker registry
// and heartbeats, dead workers and their retention, gang scheduling and priorities, state across
// SIGKILL and from an older schema, input validation, auth and the loopback rule, the rendezvous
// store. Tenants are auth_test.cpp.
#include <sqlite3.h>

#include "harness.h"

namespace kiln::test {
namespace {

using std::chrono::milliseconds;

std::string state_of(Daemon& d, const std::string& job_id) {
  proto::GetJobRequest req;
  req.set_job_id(job_id);
  proto::Job job;
  absl::Status st = d.call(&Stub::GetJob, req, &job);
  return st.ok() ? job.state() : st.ToString();
}

std::map<std::string, std::string> worker_states(Daemon& d) {
  proto::ListWorkersReply reply;
  EXPECT_TRUE(d.call(&Stub::ListWorkers, proto::ListWorkersRequest(), &reply).ok());
  std::map<std::string, std::string> out;
  for (const auto& w : reply.workers()) out[w.worker_id()] = w.state();
  return out;
}

absl::StatusOr<proto::SessionInfo> open_session(Daemon& d, int workers, uint32_t wait_ms = 0) {
  proto::OpenSessionRequest req;
  req.set_protocol_version(proto::kProtocolVersion);
  req.set_workers(workers);
  req.set_wait_ms(wait_ms);
  proto::SessionInfo info;
  absl::Status st = d.call(&Stub::OpenSession, req, &info);
  if (!st.ok()) return st;
  return info;
}

TEST(Coordinator, RegisterHeartbeatList) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0"), w1(d, "w1");
  EXPECT_EQ(worker_states(d), (std::map<std::string, std::string>{{"w0", "idle"}, {"w1", "idle"}}));
  const uint64_t old_epoch = w0.epoch();
  ASSERT_TRUE(w0.register_now().ok());
  EXPECT_EQ(w0.epoch(), old_epoch + 1);

  proto::HeartbeatRequest hb;
  hb.set_worker_id("w0");
  hb.set_epoch(old_epoch);
  proto::HeartbeatReply reply;
  absl::Status st = d.call(&Stub::Heartbeat, hb, &reply);
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  hb.set_worker_id("nobody");
  st = d.call(&Stub::Heartbeat, hb, &reply);
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_NE(st.message().find("register again"), std::string::npos);
  // A worker names sessions it serves that are over: the reply tells it to close them.
  hb.set_worker_id("w1");
  hb.set_epoch(w1.epoch());
  hb.add_sessions("s-gone");
  ASSERT_TRUE(d.call(&Stub::Heartbeat, hb, &reply).ok());
  ASSERT_EQ(reply.close_sessions_size(), 1);
  EXPECT_EQ(reply.close_sessions(0), "s-gone");
}

TEST(Coordinator, VersionMismatchIsRefused) {
  TempDir dir;
  Daemon d(dir.path());
  proto::RegisterWorkerRequest req;
  req.set_protocol_version(proto::kProtocolVersion + 1);
  req.set_worker_id("w0");
  req.set_address("w0:1");
  proto::RegisterWorkerReply reply;
  absl::Status st = d.call(&Stub::RegisterWorker, req, &reply);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("use matching Kiln versions"), std::string::npos) << st;
  proto::SubmitJobRequest sub;
  sub.set_workers(1);
  sub.add_command("true");  // protocol_version left out: 0
  proto::Job job;
  st = d.call(&Stub::SubmitJob, sub, &job);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("protocol 0"), std::string::npos) << st;
}

TEST(Coordinator, DeadWorkerFailsItsSessionAndJob) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3"});
  FakeWorker w0(d, "w0"), w1(d, "w1");  // beating every 100 ms: never late by 600 ms
  const proto::Job job = submit(d, 2);
  ASSERT_TRUE(eventually([&] { return state_of(d, job.job_id()) == "running"; }));
  proto::GetJobRequest get;
  get.set_job_id(job.job_id());
  proto::Job running;
  ASSERT_TRUE(d.call(&Stub::GetJob, get, &running).ok());
  EXPECT_EQ(running.worker_addresses_size(), 2);

  const auto stopped = Clock::now();
  w1.stop();
  ASSERT_TRUE(eventually([&] { return worker_states(d)["w1"] == "dead"; }));
  // 3 beats of 200 ms, plus the reaper's tick and slack for a loaded machine.
  EXPECT_LT(Clock::now() - stopped, milliseconds(3000));
  EXPECT_EQ(worker_states(d)["w0"], "idle");

  proto::LookupSessionRequest look;
  look.set_session_id(running.session_id());
  proto::SessionInfo info;
  absl::Status st = d.call(&Stub::LookupSession, look, &info);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("worker w1 stopped heartbeating"), std::string::npos) << st;
  ASSERT_TRUE(d.call(&Stub::GetJob, get, &running).ok());
  EXPECT_EQ(running.state(), "failed");
  EXPECT_NE(running.message().find("w1 stopped heartbeating"), std::string::npos);

  auto two = open_session(d, 2);
  EXPECT_TRUE(absl::IsUnavailable(two.status())) << two.status();
  auto one = open_session(d, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->worker_ids(0), "w0");
}

TEST(Coordinator, InteractiveSessionWithoutAClientIsClosed) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--session-idle-s", "1"});
  FakeWorker w0(d, "w0");
  auto s = open_session(d, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  w0.serve(s->session_id());  // a client streams: the session stays
  std::this_thread::sleep_for(milliseconds(2000));
  EXPECT_EQ(worker_states(d)["w0"], "busy");
  const auto left = Clock::now();
  w0.serve("");  // the client died: within the idle limit (1 s) the worker is free again
  ASSERT_TRUE(eventually([&] { return worker_states(d)["w0"] == "idle"; }));
  EXPECT_LT(Clock::now() - left, milliseconds(4000));
  proto::LookupSessionRequest look;
  look.set_session_id(s->session_id());
  proto::SessionInfo info;
  absl::Status st = d.call(&Stub::LookupSession, look, &info);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no client streamed"), std::string::npos) << st;
}

// A driver whose report stream breaks before it reports an exit (kiln submit SIGKILLed) and does
// not come back within --driver-grace-s fails its job, and the job's worker is free for the next
// one. A driver that re-attaches in time keeps it.
TEST(Coordinator, LostDriverFailsItsJob) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--driver-grace-s", "1"});
  FakeWorker w0(d, "w0");
  const proto::Job job = submit(d, 1);
  ASSERT_TRUE(eventually([&] { return state_of(d, job.job_id()) == "running"; }));
  // A driver's report stream, attached by its first line.
  auto attach = [&](grpc::ClientContext& ctx, proto::Job& reply, const std::string& line) {
    auto w = d.stub().ReportJob(&ctx, &reply);
    proto::JobReport r;
    r.set_job_id(job.job_id());
    r.add_log_lines(line);
    EXPECT_TRUE(w->Write(r));
    return w;
  };
  {
    grpc::ClientContext ctx;
    proto::Job reply;
    auto w = attach(ctx, reply, "step 1");
    ASSERT_TRUE(eventually([&] {  // the line is stored: the stream is attached to the job
      proto::WatchJobRequest req;
      req.set_job_id(job.job_id());
      grpc::ClientContext wctx;
      wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      auto reader = d.stub().WatchJob(&wctx, req);
      proto::JobEvent e;
      bool seen = false;
      while (!seen && reader->Read(&e)) seen = e.log_line() == "step 1";
      wctx.TryCancel();
      reader->Finish();
      return seen;
    }));
    ctx.TryCancel();  // the driver's stream breaks without a finished report
    w->Finish();
  }
  // It re-attaches within the grace: the job runs on.
  std::this_thread::sleep_for(milliseconds(500));
  {
    grpc::ClientContext ctx;
    proto::Job reply;
    auto w = attach(ctx, reply, "step 2");
    std::this_thread::sleep_for(milliseconds(2000));
    EXPECT_EQ(state_of(d, job.job_id()), "running");
    ctx.TryCancel();  // and goes for good
    w->Finish();
  }
  const auto gone = Clock::now();
  ASSERT_TRUE(eventually([&] { return state_of(d, job.job_id()) == "failed"; }));
  EXPECT_GE(Clock::now() - gone, milliseconds(800));
  proto::GetJobRequest get;
  get.set_job_id(job.job_id());
  proto::Job failed;
  ASSERT_TRUE(d.call(&Stub::GetJob, get, &failed).ok());
  EXPECT_NE(failed.message().find("no driver has reported for 1 s"), std::string::npos)
      << failed.message();
  EXPECT_EQ(worker_states(d)["w0"], "idle");
  const proto::Job next = submit(d, 1);
  ASSERT_TRUE(eventually([&] { return state_of(d, next.job_id()) == "running"; }));
}

// An ended session answers lookups with why it ended for --session-retention-s, then is
// forgotten (in memory and in the state file), so the coordinator does not grow without bound.
TEST(Coordinator, EndedSessionsAreForgottenAfterTheRetention) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--session-retention-s", "1"});
  FakeWorker w0(d, "w0");
  auto s = open_session(d, 1);
  ASSERT_TRUE(s.ok()) << s.status();
  proto::CloseSessionRequest close;
  close.set_session_id(s->session_id());
  proto::CloseSessionReply closed;
  ASSERT_TRUE(d.call(&Stub::CloseSession, close, &closed).ok());
  proto::LookupSessionRequest look;
  look.set_session_id(s->session_id());
  proto::SessionInfo info;
  absl::Status st = d.call(&Stub::LookupSession, look, &info);
  EXPECT_FALSE(st.ok());
  EXPECT_FALSE(absl::IsNotFound(st)) << st;  // still known: it says the session is over
  ASSERT_TRUE(
      eventually([&] { return absl::IsNotFound(d.call(&Stub::LookupSession, look, &info)); }));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2((dir.path() / "state.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr),
            SQLITE_OK);
  int rows = -1;
  sqlite3_exec(
      db, "SELECT COUNT(*) FROM sessions",
      [](void* out, int, char** v, char**) {
        *static_cast<int*>(out) = std::atoi(v[0]);
        return 0;
      },
      &rows, nullptr);
  sqlite3_close(db);
  EXPECT_EQ(rows, 0);
  EXPECT_TRUE(open_session(d, 1).ok());  // the worker is free
}

TEST(Coordinator, DeadWorkersAreForgottenAfterTheRetention) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--dead-after", "2", "--worker-retention-s", "1"});
  auto w0 = std::make_unique<FakeWorker>(d, "w0");
  FakeWorker w1(d, "w1");
  w0->stop();
  ASSERT_TRUE(eventually([&] { return worker_states(d)["w0"] == "dead"; }));
  ASSERT_TRUE(eventually([&] { return !worker_states(d).count("w0"); }));
  EXPECT_EQ(worker_states(d), (std::map<std::string, std::string>{{"w1", "idle"}}));
  d.crash();  // forgotten in the state file too
  d.start();
  EXPECT_EQ(worker_states(d), (std::map<std::string, std::string>{{"w1", "idle"}}));
  EXPECT_TRUE(w0->register_now().ok());  // a forgotten worker that comes back registers anew
  EXPECT_EQ(worker_states(d)["w0"], "idle");
}

// A version 1 state file (from before session secrets) is migrated; its open sessions have no
// secret, so no worker accepts them (a new session is needed).
TEST(Coordinator, MigratesAVersionOneStateFile) {
  TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "state.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, R"(
      CREATE TABLE sessions (
        id TEXT PRIMARY KEY, state TEXT NOT NULL, job_id TEXT NOT NULL, tenant TEXT NOT NULL,
        message TEXT NOT NULL, worker_ids TEXT NOT NULL, created_unix_ms INTEGER NOT NULL);
      INSERT INTO sessions VALUES ('s-old', 'open', '', '', '', '["w0"]', 0);
      PRAGMA user_version = 1;)",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  Daemon d(dir.path());
  proto::LookupSessionRequest look;
  look.set_session_id("s-old");
  look.set_worker_id("w0");
  proto::SessionInfo info;
  absl::Status st = d.call(&Stub::LookupSession, look, &info);
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_NE(st.message().find("predates session secrets"), std::string::npos) << st;
  FakeWorker w1(d, "w1");
  auto s = open_session(d, 1);  // new sessions are stored with their secret
  ASSERT_TRUE(s.ok()) << s.status();
  d.crash();
  d.start();
  look.set_session_id(s->session_id());
  look.set_worker_id("w1");
  look.set_session_secret(s->session_secret());
  EXPECT_TRUE(d.call(&Stub::LookupSession, look, &info).ok());
}

TEST(Coordinator, OpenSessionIsAllOrNothingAndWaits) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0"), w1(d, "w1");
  auto a = open_session(d, 1);
  ASSERT_TRUE(a.ok());
  auto b = open_session(d, 2);
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_EQ(worker_states(d)[a->worker_ids(0) == "w0" ? "w1" : "w0"], "idle");  // no partial

  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(200));
    proto::CloseSessionRequest req;
    req.set_session_id(a->session_id());
    proto::CloseSessionReply r;
    EXPECT_TRUE(d.call(&Stub::CloseSession, req, &r).ok());
  });
  auto c = open_session(d, 2, 5000);
  closer.join();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->world_size(), 2);
  proto::LookupSessionRequest look;
  look.set_session_id(c->session_id());
  look.set_worker_id(c->worker_ids(1));
  look.set_session_secret(c->session_secret());  // as a worker checks a client's Hello
  proto::SessionInfo info;
  ASSERT_TRUE(d.call(&Stub::LookupSession, look, &info).ok());
  EXPECT_EQ(info.rank(), 1);
  look.set_worker_id("stranger");
  EXPECT_TRUE(absl::IsPermissionDenied(d.call(&Stub::LookupSession, look, &info)));
}

TEST(Coordinator, GangSchedulingAndPriorities) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  auto held = open_session(d, 1);  // w0 busy
  ASSERT_TRUE(held.ok());
  const proto::Job gang = submit(d, 2);
  const proto::Job low = submit(d, 1, 0);
  const proto::Job high = submit(d, 1, 5);
  EXPECT_EQ(state_of(d, gang.job_id()), "queued");

  FakeWorker w1(d, "w1");  // one free worker: the highest priority job takes it
  ASSERT_TRUE(eventually([&] { return state_of(d, high.job_id()) == "running"; }));
  EXPECT_EQ(state_of(d, gang.job_id()), "queued");
  EXPECT_EQ(state_of(d, low.job_id()), "queued");

  proto::CloseSessionRequest close;
  close.set_session_id(held->session_id());
  proto::CloseSessionReply closed;
  ASSERT_TRUE(d.call(&Stub::CloseSession, close, &closed).ok());
  // One worker free, the 2-worker job first in line: it waits, and nothing jumps the queue.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(state_of(d, gang.job_id()), "queued");
  EXPECT_EQ(state_of(d, low.job_id()), "queued");

  ASSERT_TRUE(finish_job(d, high.job_id(), 0).ok());
  EXPECT_EQ(state_of(d, high.job_id()), "succeeded");
  EXPECT_EQ(state_of(d, gang.job_id()), "running");
  EXPECT_EQ(worker_states(d), (std::map<std::string, std::string>{{"w0", "busy"}, {"w1", "busy"}}));

  proto::CancelJobRequest cancel;
  cancel.set_job_id(gang.job_id());
  proto::Job cancelled;
  ASSERT_TRUE(d.call(&Stub::CancelJob, cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), "cancelled");
  EXPECT_EQ(state_of(d, low.job_id()), "running");
  const proto::Job waiting = submit(d, 2);  // one worker free: stays queued
  EXPECT_TRUE(absl::IsFailedPrecondition(finish_job(d, waiting.job_id(), 0)));  // no driver yet
}

// See Note [Placement] in coordinator/src/jobs.cpp: each tensor-parallel pair on one host.
TEST(Coordinator, AMeshJobsInnerGroupsArePlacedOnOneHost) {
  TempDir dir;
  Daemon d(dir.path());
  std::vector<std::unique_ptr<FakeWorker>> w;  // ids alternate between the two hosts
  for (int i = 0; i < 4; ++i)
    w.push_back(std::make_unique<FakeWorker>(d, "w" + std::to_string(i), milliseconds(100), "",
                                             (i % 2 ? "hostb" : "hosta") + std::string(":7000")));
  auto submit_mesh = [&](int workers, std::vector<std::pair<std::string, int>> dims) {
    proto::SubmitJobRequest req;
    req.set_protocol_version(proto::kProtocolVersion);
    req.set_workers(workers);
    req.add_command("true");
    for (auto& [name, size] : dims) {
      proto::MeshDim& m = *req.add_mesh();
      m.set_name(name);
      m.set_size(size);
    }
    proto::Job job;
    absl::Status st = d.call(&Stub::SubmitJob, req, &job);
    return std::make_pair(st, job);
  };
  auto [bad1, j1] = submit_mesh(4, {{"dp", 2}, {"tp", 3}});
  EXPECT_TRUE(absl::IsInvalidArgument(bad1)) << bad1;
  EXPECT_NE(bad1.message().find("the mesh has 6 ranks but the job asks for 4"), std::string::npos);
  auto [bad2, j2] = submit_mesh(4, {{"dp", 2}, {"dp", 2}});
  EXPECT_TRUE(absl::IsInvalidArgument(bad2)) << bad2;
  auto [bad3, j3] = submit_mesh(0, {{"tp", 0}});
  EXPECT_TRUE(absl::IsInvalidArgument(bad3)) << bad3;
  auto [ok, job] = submit_mesh(4, {{"dp", 2}, {"tp", 2}});
  ASSERT_TRUE(ok.ok()) << ok;
  ASSERT_TRUE(eventually([&] { return state_of(d, job.job_id()) == "running"; }));
  proto::GetJobRequest get;
  get.set_job_id(job.job_id());
  proto::Job running;
  ASSERT_TRUE(d.call(&Stub::GetJob, get, &running).ok());
  ASSERT_EQ(running.worker_addresses_size(), 4);
  EXPECT_EQ(running.worker_addresses(0), running.worker_addresses(1));  // tp group of ranks 0, 1
  EXPECT_EQ(running.worker_addresses(2), running.worker_addresses(3));  // and of ranks 2, 3
  ASSERT_EQ(running.mesh_size(), 2);
  EXPECT_EQ(running.mesh(1).name(), "tp");
  d.crash();  // the mesh is kept in the state file
  d.start();
  ASSERT_TRUE(d.call(&Stub::GetJob, get, &running).ok());
  ASSERT_EQ(running.mesh_size(), 2);
  EXPECT_EQ(running.mesh(0).size(), 2);
}

TEST(Coordinator, SigkillKeepsQueuedJobsAndWorkersReRegister) {
  TempDir dir;
  auto d = std::make_unique<Daemon>(dir.path());
  uint64_t epoch = 0;
  {
    FakeWorker w0(*d, "w0");
    epoch = w0.epoch();
  }
  auto busy = open_session(*d, 1);  // w0 busy: the jobs below stay queued
  ASSERT_TRUE(busy.ok());
  std::vector<std::string> ids;
  for (int p : {0, 3, 0})
    ids.push_back(submit(*d, 1, p, {"echo", "job", std::to_string(p)}).job_id());
  d->crash();
  d->start();

  proto::ListJobsReply list;
  ASSERT_TRUE(d->call(&Stub::ListJobs, proto::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(list.jobs(i).job_id(), ids[i]);
    EXPECT_EQ(list.jobs(i).state(), "queued");
  }
  EXPECT_EQ(list.jobs(1).priority(), 3);
  EXPECT_EQ(list.jobs(2).command(2), "0");

  FakeWorker w0(*d, "w0");  // the worker restarted too: its old session ends
  EXPECT_EQ(w0.epoch(), epoch + 1);
  ASSERT_TRUE(eventually([&] { return state_of(*d, ids[1]) == "running"; }));
  EXPECT_EQ(state_of(*d, ids[0]), "queued");
  EXPECT_EQ(d->terminate(), 0);
}

TEST(Coordinator, RefusesAStateFileFromANewerSchema) {
  TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir.path() / "state.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  const pid_t pid = spawn({KILN_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--state",
                           (dir.path() / "state.db").string()},
                          dir.path() / "out", dir.path() / "err");
  EXPECT_EQ(wait_for(pid, std::chrono::seconds(10)), 1);
  EXPECT_NE(slurp(dir.path() / "err").find("schema version 99"), std::string::npos)
      << slurp(dir.path() / "err");
}

TEST(Coordinator, MalformedRequestsAreRefusedAndTheDaemonServesOn) {
  TempDir dir;
  Daemon d(dir.path());
  auto expect_invalid = [](const absl::Status& st, const std::string& field) {
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(st.message().find(field), std::string::npos) << st;
  };
  proto::SubmitJobRequest sub;
  sub.set_protocol_version(proto::kProtocolVersion);
  proto::Job job;
  sub.set_workers(-2);
  sub.add_command("true");
  expect_invalid(d.call(&Stub::SubmitJob, sub, &job), "workers");
  sub.set_workers(1);
  sub.clear_command();
  expect_invalid(d.call(&Stub::SubmitJob, sub, &job), "command");
  sub.add_command(std::string(200 << 10, 'x'));
  expect_invalid(d.call(&Stub::SubmitJob, sub, &job), "command");
  sub.set_command(0, std::string(20 << 20, 'x'));  // past the message limit
  EXPECT_TRUE(absl::IsResourceExhausted(d.call(&Stub::SubmitJob, sub, &job)));

  proto::GetJobRequest get;
  expect_invalid(d.call(&Stub::GetJob, get, &job), "job_id");
  get.set_job_id("job-999");
  EXPECT_TRUE(absl::IsNotFound(d.call(&Stub::GetJob, get, &job)));
  proto::RegisterWorkerRequest reg;
  reg.set_protocol_version(proto::kProtocolVersion);
  proto::RegisterWorkerReply regr;
  expect_invalid(d.call(&Stub::RegisterWorker, reg, &regr), "worker_id");
  reg.set_worker_id("w");
  expect_invalid(d.call(&Stub::RegisterWorker, reg, &regr), "address");
  // What the registry keeps is checked (issue 18: a 1 MB id broke `kiln workers`).
  struct Bad {
    std::string id, address, device, needle;
  };
  for (const Bad& b : std::vector<Bad>{
           {std::string(1 << 20, 'w'), "h:1", "cpu", "... (1048576 bytes)' must be 1 to 128"},
           {"a/b", "h:1", "cpu", "worker_id 'a/b' must be 1 to 128 characters of [A-Za-z0-9._-]"},
           {"w", "not an address:::", "cpu", "the port must be a number in [1, 65535]"},
           {"w", "not an address:1", "cpu", "the host must be a name or an address"},
           {"w", "h:0", "cpu", "the port must be"},
           {"w", "h:99999", "cpu", "the port must be"},
           {"w", ":7", "cpu", "the host must be"},
           {"w", "[zz]:7", "cpu", "not an IPv6 address"},
           {"w", "h:7", "tpu:9", "device 'tpu:9' must be cpu or cuda:N"},
           {"w", "h:7", "cuda:", "must be cpu or cuda:N"},
           {"w", "h:7", "cuda:99999", "must be cpu or cuda:N"}}) {
    reg.set_worker_id(b.id);
    reg.set_address(b.address);
    reg.set_device(b.device);
    expect_invalid(d.call(&Stub::RegisterWorker, reg, &regr), b.needle);
  }
  EXPECT_TRUE(worker_states(d).empty());
  for (auto [id, address, device] : {std::tuple{"w-1.a_b", "[::1]:7000", "cuda:3"},
                                     std::tuple{"w2", "10.0.0.2:7000", ""},
                                     std::tuple{"w3", "node-3.cluster.local:65535", "cpu"}}) {
    reg.set_worker_id(id);
    reg.set_address(address);
    reg.set_device(device);
    EXPECT_TRUE(d.call(&Stub::RegisterWorker, reg, &regr).ok()) << id;
  }
  EXPECT_EQ(worker_states(d).size(), 3u);
  proto::ListJobsRequest list;
  list.set_state("sleeping");
  proto::ListJobsReply listr;
  expect_invalid(d.call(&Stub::ListJobs, list, &listr), "state");
  proto::StoreRequest store;
  proto::StoreReply storer;
  expect_invalid(d.call(&Stub::Store, store, &storer), "session_id");
  store.set_session_id("s-x");
  store.set_key("k");
  store.set_op("explode");
  expect_invalid(d.call(&Stub::Store, store, &storer), "op");
  proto::OpenSessionRequest open;
  open.set_protocol_version(proto::kProtocolVersion);
  open.set_workers(0);
  proto::SessionInfo info;
  expect_invalid(d.call(&Stub::OpenSession, open, &info), "workers");
  proto::CancelJobRequest cancel;
  cancel.set_job_id("job-404");
  EXPECT_TRUE(absl::IsNotFound(d.call(&Stub::CancelJob, cancel, &job)));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto w = d.stub().ReportJob(&ctx, &job);
    w->Write(proto::JobReport());  // no job_id
    w->WritesDone();
    expect_invalid(proto::from_grpc(w->Finish()), "job_id");
  }
  // Still serving, with nothing stored from the bad calls.
  EXPECT_EQ(submit(d, 1).job_id(), "job-1");
}

TEST(Coordinator, TokensPerTenant) {
  TempDir dir;
  std::ofstream(dir.path() / "tokens") << "# tenant token\nalice atok\nbob btok\n";
  Daemon d(dir.path(), {"--tokens", (dir.path() / "tokens").string(), "--worker-token", "wtok"},
           "atok");
  proto::SubmitJobRequest sub;
  sub.set_protocol_version(proto::kProtocolVersion);
  sub.set_workers(1);
  sub.add_command("true");
  proto::Job job;
  for (std::string bad : {"", "nope", "wtok"}) {
    absl::Status st = d.call(&Stub::SubmitJob, sub, &job, &bad);
    EXPECT_TRUE(absl::IsUnauthenticated(st)) << bad << ": " << st;
  }
  ASSERT_TRUE(d.call(&Stub::SubmitJob, sub, &job).ok());
  EXPECT_EQ(job.tenant(), "alice");
  const std::string bob = "btok";
  proto::ListJobsReply list;
  ASSERT_TRUE(d.call(&Stub::ListJobs, proto::ListJobsRequest(), &list, &bob).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  proto::GetJobRequest get;
  get.set_job_id(job.job_id());
  EXPECT_TRUE(absl::IsNotFound(d.call(&Stub::GetJob, get, &job, &bob)));

  proto::RegisterWorkerRequest reg;
  reg.set_protocol_version(proto::kProtocolVersion);
  reg.set_worker_id("w0");
  reg.set_address("w0:1");
  proto::RegisterWorkerReply regr;
  EXPECT_TRUE(absl::IsUnauthenticated(d.call(&Stub::RegisterWorker, reg, &regr)));  // a client's
  const std::string wtok = "wtok";
  EXPECT_TRUE(d.call(&Stub::RegisterWorker, reg, &regr, &wtok).ok());
}

TEST(Coordinator, NonLoopbackListenNeedsAToken) {
  TempDir dir;
  const pid_t pid = spawn(
      {KILN_COORDINATOR_BIN, "--listen", "0.0.0.0:0", "--state", (dir.path() / "s.db").string()},
      dir.path() / "out", dir.path() / "err");
  EXPECT_EQ(wait_for(pid, std::chrono::seconds(10)), 1);
  EXPECT_NE(slurp(dir.path() / "err").find("refusing to listen on '0.0.0.0:0'"), std::string::npos)
      << slurp(dir.path() / "err");
}

TEST(Coordinator, RendezvousStore) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  auto s = open_session(d, 1);
  ASSERT_TRUE(s.ok());
  auto op = [&](const std::string& name, const std::string& key, const std::string& value = "",
                uint32_t wait_ms = 0) {
    proto::StoreRequest req;
    req.set_session_id(s->session_id());
    req.set_op(name);
    req.set_key(key);
    req.set_value(value);
    req.set_wait_ms(wait_ms);
    req.set_amount(2);
    proto::StoreReply reply;
    absl::Status st = d.call(&Stub::Store, req, &reply);
    return std::make_pair(st, reply);
  };
  EXPECT_TRUE(absl::IsNotFound(op("get", "addr").first));
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    op("set", "addr", "127.0.0.1:5555");
  });
  auto got = op("get", "addr", "", 5000);
  setter.join();
  ASSERT_TRUE(got.first.ok()) << got.first;
  EXPECT_EQ(got.second.value(), "127.0.0.1:5555");
  EXPECT_EQ(op("add", "n").second.counter(), 2);
  EXPECT_EQ(op("add", "n").second.counter(), 4);
  EXPECT_TRUE(absl::IsDeadlineExceeded(op("get", "never", "", 100).first));
  EXPECT_EQ(op("compare_set", "c", "first").second.value(), "first");   // absent, expected ""
  EXPECT_EQ(op("compare_set", "c", "second").second.value(), "first");  // expected "" != "first"

  proto::CloseSessionRequest close;
  close.set_session_id(s->session_id());
  proto::CloseSessionReply closed;
  ASSERT_TRUE(d.call(&Stub::CloseSession, close, &closed).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(op("get", "addr").first));
}

TEST(Coordinator, SigtermExitsZero) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  submit(d, 1);
  EXPECT_EQ(d.terminate(), 0) << d.stderr_text();
}

}  // namespace
}  // namespace kiln::test
