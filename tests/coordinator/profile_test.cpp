// Remote profiling as the coordinator runs it (Note [Remote profiling] in
// coordinator/src/profiles.h): `kiln profile` asks every rank of a running job through its
// heartbeats, merges their traces on the coordinator's clock, and names the ranks that never
// answered. Fake workers answer here; tests/python/test_remote_profile.py runs real ones.
#include <nlohmann/json.hpp>

#include "harness.h"

namespace kiln::test {
namespace {

using json = nlohmann::json;

// The profile requests in `w`'s next beat reply.
std::vector<proto::ProfileRequest> requests_of(FakeWorker& w) {
  proto::HeartbeatReply reply;
  EXPECT_TRUE(w.beat_once({}, &reply).ok());
  return {reply.profile().begin(), reply.profile().end()};
}

// A worker's answer: two ops on thread 1 at `ts` and `ts` + 100 us of its trace.
proto::HeartbeatRequest answer(const proto::ProfileRequest& r, int64_t origin_unix_us,
                               int64_t offset_us) {
  proto::HeartbeatRequest req;
  proto::RankProfile& p = *req.add_profiles();
  p.set_session_id(r.session_id());
  p.set_profile_id(r.profile_id());
  p.set_origin_unix_us(origin_unix_us);
  p.set_clock_offset_us(offset_us);
  p.set_trace(
      json{{"traceEvents",
            {{{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "k"}}}},
             {{"ph", "X"}, {"name", "mm"}, {"pid", 0}, {"tid", 1}, {"ts", 10.0}, {"dur", 5.0}},
             {{"ph", "X"}, {"name", "add"}, {"pid", 0}, {"tid", 1}, {"ts", 110.0}, {"dur", 5.0}}}}}
          .dump());
  return req;
}

proto::ProfileJobRequest profile_request(const std::string& job_id, int steps,
                                         uint32_t timeout_ms = 0) {
  proto::ProfileJobRequest req;
  req.set_job_id(job_id);
  req.set_steps(steps);
  req.set_timeout_ms(timeout_ms);
  return req;
}

// One ProfileJob call's outcome.
struct Profiled {
  absl::Status status;
  proto::ProfileInfo info;
  std::string trace;
};

Profiled profile(Daemon& d, const proto::ProfileJobRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = d.stub().ProfileJob(&ctx, req);
  Profiled out;
  for (proto::ProfileChunk c; reader->Read(&c);) {
    if (c.has_info()) out.info = c.info();
    out.trace += c.data();
  }
  out.status = proto::from_grpc(reader->Finish());
  return out;
}

TEST(RemoteProfile, BadRequestsAreRefusedNamingTheProblem) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100"});
  FakeWorker w0(d, "w0"), w1(d, "w1");
  const RunningJob job = start_job(d, 2);
  const std::string id = job.job.job_id();

  Profiled r = profile(d, profile_request(id, 0));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status)) << r.status;
  EXPECT_NE(r.status.message().find("steps must be in [1, 100], got 0"), std::string::npos);
  r = profile(d, profile_request(id, 1000000));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status)) << r.status;
  r = profile(d, profile_request("job-nope", 2));
  EXPECT_TRUE(absl::IsNotFound(r.status)) << r.status;
  EXPECT_NE(r.status.message().find("unknown job job-nope"), std::string::npos);

  const proto::Job queued = submit(d, 2);  // no workers left: it waits
  r = profile(d, profile_request(queued.job_id(), 2));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status)) << r.status;
  EXPECT_NE(r.status.message().find("is queued, not running"), std::string::npos) << r.status;

  // A second request while the first waits.
  std::thread first([&] { r = profile(d, profile_request(id, 2, 1500)); });
  ASSERT_TRUE(eventually([&] { return !requests_of(w0).empty(); }));
  Profiled second = profile(d, profile_request(id, 2));
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status)) << second.status;
  EXPECT_NE(second.status.message().find("already being profiled"), std::string::npos);
  first.join();
  // Nobody answered within its timeout: every rank is named.
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status)) << r.status;
  EXPECT_NE(r.status.message().find("rank 0 (worker w"), std::string::npos) << r.status;
  EXPECT_NE(r.status.message().find("rank 1 (worker w"), std::string::npos) << r.status;
  // And the job may be profiled again.
  std::thread again([&] { r = profile(d, profile_request(id, 1, 300)); });
  again.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status)) << r.status;
}

TEST(RemoteProfile, TracesOfEveryRankAreMergedOnTheCoordinatorsClock) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100"});
  std::map<std::string, std::unique_ptr<FakeWorker>> workers;
  for (const char* id : {"w0", "w1"}) workers[id] = std::make_unique<FakeWorker>(d, id);
  const RunningJob job = start_job(d, 2);
  const std::string id = job.job.job_id();
  const fs::path out = dir.path() / "merged.json";

  Cli cli;
  std::thread client([&] {
    cli = run_kiln(dir.path(), d, {"profile", id, "--steps", "2", "-o", out.string()});
  });
  // Rank 1's clock is 5 s ahead of the coordinator's; both started their trace at the same
  // coordinator time, 1'000'000'000 us.
  const int64_t t = 1'000'000'000;
  for (int rank = 0; rank < 2; ++rank) {
    FakeWorker& w = *workers.at(job.ranks[rank]);
    std::vector<proto::ProfileRequest> asked;
    ASSERT_TRUE(eventually([&] { return !(asked = requests_of(w)).empty(); }));
    EXPECT_EQ(asked[0].steps(), 2);
    EXPECT_EQ(asked[0].session_id(), job.job.session_id());
    const int64_t skew = rank == 1 ? 5'000'000 : 0;
    EXPECT_TRUE(w.beat_once(answer(asked[0], t + skew, -skew)).ok());
    EXPECT_TRUE(requests_of(w).empty()) << "rank " << rank << " is asked again after answering";
  }
  client.join();
  ASSERT_EQ(cli.status, 0) << cli.err;
  EXPECT_NE(cli.out.find("2 of 2 ranks"), std::string::npos) << cli.out;

  const json merged = json::parse(slurp(out));
  EXPECT_EQ(merged["otherData"]["base_unix_us"], t);
  std::map<int, std::vector<double>> ts;
  std::map<int, std::string> names;
  for (const json& e : merged["traceEvents"]) {
    if (e["ph"] == "X") ts[e["pid"].get<int>()].push_back(e["ts"].get<double>());
    if (e["ph"] == "M" && e["name"] == "process_name")
      names[e["pid"].get<int>()] = e["args"]["name"];
  }
  EXPECT_EQ(ts[0], (std::vector<double>{10.0, 110.0}));
  EXPECT_EQ(ts[1], (std::vector<double>{10.0, 110.0}));  // aligned despite the 5 s skew
  EXPECT_EQ(names[0], "rank 0 (worker " + job.ranks[0] + ")");
  EXPECT_EQ(names[1], "rank 1 (worker " + job.ranks[1] + ")");

  // The job lists it, and the file is kept under the state file's directory.
  const proto::Job listed = get_job(d, id);
  ASSERT_EQ(listed.profiles_size(), 1);
  EXPECT_EQ(listed.profiles(0).steps(), 2);
  EXPECT_EQ(listed.profiles(0).ranks_size(), 2);
  const fs::path kept = dir.path() / "state.db.profiles" / id /
                        (std::to_string(listed.profiles(0).profile_id()) + ".json");
  EXPECT_EQ(slurp(kept), slurp(out));
  // A restarted coordinator still lists it.
  d.crash();
  d.start();
  EXPECT_EQ(get_job(d, id).profiles_size(), 1);
}

TEST(RemoteProfile, ARankThatNeverAnswersIsNamed) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100"});
  FakeWorker w0(d, "w0"), w1(d, "w1");
  const RunningJob job = start_job(d, 2);
  FakeWorker& rank0 = w0.id() == job.ranks[0] ? w0 : w1;
  Profiled r;
  std::thread client([&] { r = profile(d, profile_request(job.job.job_id(), 1, 1500)); });
  std::vector<proto::ProfileRequest> asked;
  ASSERT_TRUE(eventually([&] { return !(asked = requests_of(rank0)).empty(); }));
  EXPECT_TRUE(rank0.beat_once(answer(asked[0], 1'000'000, 0)).ok());
  client.join();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.info.ranks_size(), 1);
  ASSERT_EQ(r.info.missing_size(), 1);
  EXPECT_NE(r.info.missing(0).find("rank 1 (worker " + job.ranks[1] + "): no trace within"),
            std::string::npos)
      << r.info.missing(0);
  EXPECT_NE(r.trace.find("\"mm\""), std::string::npos);
}

}  // namespace
}  // namespace kiln::test
