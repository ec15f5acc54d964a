// kiln-coordinator's tenants (Note [Session credentials] in coordinator/src/sessions.cpp):
// each tenant sees and uses only its own sessions, a session id is no credential without its
// secret, the workers of a gang reach its store, and tokens are checked as they are loaded.
#include "harness.h"

namespace kiln::test {
namespace {

const std::string kAlice = "atok", kBob = "btok", kWorker = "wtok", kNoOne = "";

// A coordinator with tenants alice and bob, the worker token wtok, and worker w0 registered.
struct Tenants {
  TempDir dir;
  std::unique_ptr<Daemon> d;
  std::unique_ptr<FakeWorker> w0;
  Tenants() {
    std::ofstream(dir.path() / "tokens") << "alice atok\nbob btok\n";
    d = std::make_unique<Daemon>(
        dir.path(),
        std::vector<std::string>{"--tokens", (dir.path() / "tokens").string(), "--worker-token",
                                 kWorker},
        kAlice);
    w0 = std::make_unique<FakeWorker>(*d, "w0", std::chrono::milliseconds(100), kWorker);
  }
};

std::map<std::string, std::string> sessions_listed(Daemon& d, const std::string& token) {
  proto::ListWorkersReply reply;
  EXPECT_TRUE(d.call(&Stub::ListWorkers, proto::ListWorkersRequest(), &reply, &token).ok());
  std::map<std::string, std::string> out;
  for (const auto& w : reply.workers()) out[w.worker_id()] = w.session_id();
  return out;
}

// Each step of issue 18's report, done by the owner, by the other tenant and by no one.
TEST(CoordinatorAuth, TenantsSeeAndUseOnlyTheirOwnSessions) {
  Tenants t;
  Daemon& d = *t.d;
  proto::OpenSessionRequest open;
  open.set_protocol_version(proto::kProtocolVersion);
  open.set_workers(1);
  proto::SessionInfo alice;
  ASSERT_TRUE(d.call(&Stub::OpenSession, open, &alice).ok());
  const std::string id = alice.session_id();
  EXPECT_EQ(alice.session_secret().size(), 32u);  // 128 bits, hex

  // kiln workers: the session is named to alice (and to the workers) only.
  EXPECT_EQ(sessions_listed(d, kAlice)["w0"], id);
  EXPECT_EQ(sessions_listed(d, kWorker)["w0"], id);
  EXPECT_EQ(sessions_listed(d, kBob)["w0"], "");
  proto::ListWorkersReply listed;
  EXPECT_TRUE(absl::IsUnauthenticated(
      d.call(&Stub::ListWorkers, proto::ListWorkersRequest(), &listed, &kNoOne)));

  // LookupSession.
  proto::LookupSessionRequest look;
  look.set_session_id(id);
  proto::SessionInfo info;
  ASSERT_TRUE(d.call(&Stub::LookupSession, look, &info, &kAlice).ok());
  EXPECT_EQ(info.worker_ids(0), "w0");
  EXPECT_TRUE(info.session_secret().empty());  // handed out by OpenSession only
  absl::Status st = d.call(&Stub::LookupSession, look, &info, &kBob);
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  EXPECT_NE(st.message().find("is not a session of tenant bob"), std::string::npos) << st;
  EXPECT_TRUE(absl::IsUnauthenticated(d.call(&Stub::LookupSession, look, &info, &kNoOne)));

  // A worker's check of a Hello: the gang's worker, with the session's secret.
  st = d.call(&Stub::LookupSession, look, &info, &kWorker);  // naming no worker
  EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
  look.set_worker_id("w0");
  for (std::string secret : {std::string(), std::string(32, '0'), alice.session_secret() + "0"}) {
    look.set_session_secret(secret);
    st = d.call(&Stub::LookupSession, look, &info, &kWorker);
    EXPECT_TRUE(absl::IsPermissionDenied(st)) << st;
    EXPECT_NE(st.message().find("did not present the secret of session " + id),
              std::string::npos)
        << st;
  }
  look.set_session_secret(alice.session_secret());
  ASSERT_TRUE(d.call(&Stub::LookupSession, look, &info, &kWorker).ok());
  EXPECT_EQ(info.rank(), 0);
  look.set_worker_id("w9");
  EXPECT_TRUE(absl::IsPermissionDenied(d.call(&Stub::LookupSession, look, &info, &kWorker)));
  look.set_worker_id("w0");  // bob holding the secret is still not alice
  EXPECT_TRUE(absl::IsPermissionDenied(d.call(&Stub::LookupSession, look, &info, &kBob)));

  // The rendezvous store: alice and the gang's workers.
  auto store_set = [&](const std::string& token, const std::string& worker_id) {
    proto::StoreRequest req;
    req.set_session_id(id);
    req.set_op("set");
    req.set_key("k");
    req.set_value(token + "/" + worker_id);
    req.set_worker_id(worker_id);
    proto::StoreReply reply;
    return d.call(&Stub::Store, req, &reply, &token);
  };
  EXPECT_TRUE(store_set(kAlice, "").ok());
  EXPECT_TRUE(store_set(kWorker, "w0").ok());
  EXPECT_TRUE(absl::IsPermissionDenied(store_set(kBob, "")));
  EXPECT_TRUE(absl::IsPermissionDenied(store_set(kBob, "w0")));
  EXPECT_TRUE(absl::IsPermissionDenied(store_set(kWorker, "")));
  EXPECT_TRUE(absl::IsPermissionDenied(store_set(kWorker, "w9")));
  EXPECT_TRUE(absl::IsUnauthenticated(store_set(kNoOne, "")));
  proto::StoreRequest get;
  get.set_session_id(id);
  get.set_op("get");
  get.set_key("k");
  proto::StoreReply got;
  ASSERT_TRUE(d.call(&Stub::Store, get, &got, &kAlice).ok());
  EXPECT_EQ(got.value(), "wtok/w0");  // the refused writes wrote nothing

  // CloseSession.
  proto::CloseSessionRequest close;
  close.set_session_id(id);
  proto::CloseSessionReply closed;
  EXPECT_TRUE(absl::IsPermissionDenied(d.call(&Stub::CloseSession, close, &closed, &kBob)));
  EXPECT_TRUE(absl::IsUnauthenticated(d.call(&Stub::CloseSession, close, &closed, &kNoOne)));
  EXPECT_EQ(sessions_listed(d, kAlice)["w0"], id);  // still open
  EXPECT_TRUE(d.call(&Stub::CloseSession, close, &closed, &kAlice).ok());
}

// `kiln workers` as bob does not name alice's session (the CLI prints what it is given).
TEST(CoordinatorAuth, KilnWorkersShowsAnotherTenantsWorkerAsBusyOnly) {
  Tenants t;
  proto::OpenSessionRequest open;
  open.set_protocol_version(proto::kProtocolVersion);
  open.set_workers(1);
  proto::SessionInfo alice;
  ASSERT_TRUE(t.d->call(&Stub::OpenSession, open, &alice).ok());
  for (const std::string& token : {kBob, kAlice}) {
    const pid_t cli = spawn(
        {KILN_CLI, "workers", "--json", "--coordinator", t.d->address(), "--token", token},
        t.dir.path() / "cli.out", t.dir.path() / "cli.err");
    ASSERT_EQ(wait_for(cli, std::chrono::seconds(20)), 0) << slurp(t.dir.path() / "cli.err");
    const std::string out = slurp(t.dir.path() / "cli.out");
    EXPECT_NE(out.find("\"state\":\"busy\""), std::string::npos) << out;
    EXPECT_EQ(out.find(alice.session_id()) != std::string::npos, token == kAlice) << out;
  }
}

// Each tenant needs a token of its own, distinct from the workers'; blank tokens are no tokens.
TEST(CoordinatorAuth, TokensMustBeDistinctAndNotBlank) {
  TempDir dir;
  struct Case {
    std::string tokens, worker_token, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"alice same\nbob same\n", "", ":2: tenant bob has the token of line 1 (tenant alice)"},
           {"alice a\x01z\n", "", ":1: a token must be printable ASCII without spaces"},
           {"alice atok\n", " ", "--worker-token: a token must be printable ASCII"},
           {"alice atok\n", "atok", "--worker-token is also the token of tenant alice"}}) {
    std::ofstream(dir.path() / "tokens") << c.tokens;
    std::vector<std::string> argv = {KILN_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--state",
                                     (dir.path() / "s.db").string(), "--tokens",
                                     (dir.path() / "tokens").string()};
    if (!c.worker_token.empty()) {
      argv.push_back("--worker-token");
      argv.push_back(c.worker_token);
    }
    const pid_t pid = spawn(argv, dir.path() / "out", dir.path() / "err");
    EXPECT_EQ(wait_for(pid, std::chrono::seconds(10)), 1) << c.needle;
    EXPECT_NE(slurp(dir.path() / "err").find(c.needle), std::string::npos)
        << slurp(dir.path() / "err");
  }
}

// See Note [Quotas] in coordinator/src/jobs.cpp.
TEST(CoordinatorAuth, QuotasCapATenantsWorkersAndLetOthersGoAhead) {
  TempDir dir;
  std::ofstream(dir.path() / "tokens") << "alice atok\nbob btok\n";
  Daemon d(dir.path(),
           {"--tokens", (dir.path() / "tokens").string(), "--worker-token", kWorker, "--quota",
            "alice=2"},
           kAlice);
  std::vector<std::unique_ptr<FakeWorker>> w;
  for (int i = 0; i < 4; ++i)
    w.push_back(std::make_unique<FakeWorker>(d, "w" + std::to_string(i),
                                             std::chrono::milliseconds(100), kWorker));
  auto submit_as = [&](const std::string& token, int workers, int priority) {
    proto::SubmitJobRequest req;
    req.set_protocol_version(proto::kProtocolVersion);
    req.set_workers(workers);
    req.set_priority(priority);
    req.add_command("true");
    proto::Job job;
    absl::Status st = d.call(&Stub::SubmitJob, req, &job, &token);
    return std::make_pair(st, job);
  };
  auto job_of = [&](const std::string& id, const std::string& token) {
    proto::GetJobRequest get;
    get.set_job_id(id);
    proto::Job job;
    EXPECT_TRUE(d.call(&Stub::GetJob, get, &job, &token).ok());
    return job;
  };
  // More than the quota in one job: refused at once.
  auto [big, none] = submit_as(kAlice, 3, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(big)) << big;
  EXPECT_NE(big.message().find("tenant alice's quota is 2 worker slots"), std::string::npos) << big;
  // Alice's first 2-worker job runs; her second waits for her quota, at a higher priority than
  // bob's job, which goes ahead of it on the free workers.
  auto [st1, a1] = submit_as(kAlice, 2, 0);
  ASSERT_TRUE(st1.ok()) << st1;
  ASSERT_TRUE(eventually([&] { return job_of(a1.job_id(), kAlice).state() == "running"; }));
  auto [st2, a2] = submit_as(kAlice, 2, 5);
  auto [st3, b1] = submit_as(kBob, 2, 0);
  ASSERT_TRUE(st2.ok() && st3.ok());
  ASSERT_TRUE(eventually([&] { return job_of(b1.job_id(), kBob).state() == "running"; }));
  proto::Job waiting = job_of(a2.job_id(), kAlice);
  EXPECT_EQ(waiting.state(), "queued");
  EXPECT_EQ(waiting.message(),
            "waiting: tenant alice holds 2 of its 2 worker slots; 2 more would exceed its quota");
  // An interactive session beyond the quota is refused at once; bob has no quota.
  proto::OpenSessionRequest open;
  open.set_protocol_version(proto::kProtocolVersion);
  open.set_workers(1);
  open.set_wait_ms(5000);
  proto::SessionInfo info;
  absl::Status refused = d.call(&Stub::OpenSession, open, &info, &kAlice);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  // Alice's first job ends: her second runs, its message cleared.
  proto::CancelJobRequest cancel;
  cancel.set_job_id(a1.job_id());
  proto::Job cancelled;
  ASSERT_TRUE(d.call(&Stub::CancelJob, cancel, &cancelled, &kAlice).ok());
  ASSERT_TRUE(eventually([&] { return job_of(a2.job_id(), kAlice).state() == "running"; }));
  EXPECT_EQ(job_of(a2.job_id(), kAlice).message(), "");
}

}  // namespace
}  // namespace kiln::test
