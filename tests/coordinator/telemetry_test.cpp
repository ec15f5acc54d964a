// Step telemetry (Note [Step telemetry] in worker/src/reports.h) and stragglers (Note
// [Stragglers] in coordinator/src/stragglers.h): fake workers of a running job report steps with
// their heartbeats, as kiln-worker does; the coordinator keeps them (JobSteps, `kiln steps`,
// each rank's latest in `kiln status`, across a restart), refuses nonsense quietly, and names a
// rank whose busy time stays over 1.3x the median. Real workers: tests/python/test_telemetry.py.

#include "harness.h"

namespace kiln::test {
namespace {

proto::StepRecord step(const std::string& session, int64_t n, double seconds, double busy,
                       std::optional<double> loss = std::nullopt, double tokens = 0) {
  proto::StepRecord r;
  r.set_session_id(session);
  r.set_step(n);
  r.set_unix_ms(1000 * n);
  r.set_seconds(seconds);
  r.set_busy_seconds(busy);
  if (loss) r.set_loss(*loss);
  r.set_tokens(tokens);
  return r;
}

absl::Status beat(Daemon& d, const FakeWorker& w, std::vector<proto::StepRecord> steps) {
  proto::HeartbeatRequest req;
  for (auto& s : steps) *req.add_steps() = std::move(s);
  return w.beat_once(std::move(req));
}

std::vector<proto::StepRecord> job_steps(Daemon& d, const std::string& job, int64_t from = 0) {
  proto::JobStepsRequest req;
  req.set_job_id(job);
  req.set_from_step(from);
  proto::JobStepsReply reply;
  EXPECT_TRUE(d.call(&Stub::JobSteps, req, &reply).ok());
  return {reply.steps().begin(), reply.steps().end()};
}

TEST(Telemetry, StepsAreKeptPerRankAndShownByStatusAndSteps) {
  TempDir dir;
  Daemon d(dir.path());
  std::map<std::string, std::unique_ptr<FakeWorker>> w;
  for (const char* id : {"w0", "w1"}) w[id] = std::make_unique<FakeWorker>(d, id);
  RunningJob j = start_job(d, 2);
  const std::string& sid = j.job.session_id();
  for (int r = 0; r < 2; ++r) {
    std::vector<proto::StepRecord> batch;
    for (int64_t n = 1; n <= 5; ++n)
      batch.push_back(step(sid, n, 0.5, 0.4 + 0.01 * r, 3.0 - 0.1 * n + r, 2048));
    ASSERT_TRUE(beat(d, *w[j.ranks[r]], batch).ok());
  }
  std::vector<proto::StepRecord> all = job_steps(d, j.job.job_id());
  ASSERT_EQ(all.size(), 10u);
  EXPECT_EQ(all[0].step(), 1);
  EXPECT_EQ(all[0].rank(), 0);
  EXPECT_EQ(all[1].rank(), 1);
  EXPECT_DOUBLE_EQ(all[8].loss(), 2.5);  // step 5, rank 0
  EXPECT_EQ(job_steps(d, j.job.job_id(), 4).size(), 4u);
  proto::Job job = get_job(d, j.job.job_id());
  ASSERT_EQ(job.last_steps_size(), 2);
  EXPECT_EQ(job.last_steps(0).step(), 5);
  EXPECT_EQ(job.findings_size(), 0);  // 0.41 against 0.40: no straggler

  // The CLI: each rank's latest step in `kiln status`, the curve in `kiln steps`.
  Cli st = run_kiln(dir.path(), d, {"status", j.job.job_id()});
  EXPECT_NE(st.out.find("rank 0:    step 5: loss 2.5, 0.500 s (busy 0.400 s), 4096 tokens/s"),
            std::string::npos)
      << st.out;
  Cli steps = run_kiln(dir.path(), d, {"steps", "--from", "5", j.job.job_id()});
  EXPECT_EQ(steps.out,
            "rank 0 step 5: loss 2.5, 0.500 s (busy 0.400 s), 4096 tokens/s\n"
            "rank 1 step 5: loss 3.5, 0.500 s (busy 0.410 s), 4096 tokens/s\n");
  EXPECT_NE(run_kiln(dir.path(), d, {"steps", "--from", "x", j.job.job_id()}).status, 0);

  // Nonsense is dropped quietly: a step 0, NaN and negative times; a NaN loss is left out.
  ASSERT_TRUE(beat(d, *w[j.ranks[0]],
                   {step(sid, 0, 1, 1), step(sid, 6, NAN, 1), step(sid, 7, -1, 0),
                    step(sid, 8, 0.5, 0.9, NAN)})
                  .ok());
  all = job_steps(d, j.job.job_id(), 6);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].step(), 8);
  EXPECT_FALSE(all[0].has_loss());
  EXPECT_DOUBLE_EQ(all[0].busy_seconds(), 0.5);  // never more than the step
  // Another tenant's or an unknown job, and a bad range, are errors.
  proto::JobStepsRequest bad;
  bad.set_job_id(j.job.job_id());
  bad.set_from_step(-1);
  proto::JobStepsReply reply;
  EXPECT_TRUE(absl::IsInvalidArgument(d.call(&Stub::JobSteps, bad, &reply)));
  bad.set_from_step(0);
  bad.set_limit(1 << 30);
  EXPECT_TRUE(absl::IsInvalidArgument(d.call(&Stub::JobSteps, bad, &reply)));
  bad.set_job_id("no-such-job");
  bad.set_limit(0);
  EXPECT_TRUE(absl::IsNotFound(d.call(&Stub::JobSteps, bad, &reply)));

  // Kept across a restart, latest steps included.
  d.crash();
  d.start();
  EXPECT_EQ(job_steps(d, j.job.job_id()).size(), 11u);
  job = get_job(d, j.job.job_id());
  ASSERT_EQ(job.last_steps_size(), 2);
  EXPECT_EQ(job.last_steps(0).step(), 8);
}

TEST(Telemetry, ARankSlowForThreeStepsIsAStraggler) {
  TempDir dir;
  Daemon d(dir.path());
  std::map<std::string, std::unique_ptr<FakeWorker>> w;
  for (const char* id : {"w0", "w1", "w2"}) w[id] = std::make_unique<FakeWorker>(d, id);
  RunningJob j = start_job(d, 3);
  const std::string& sid = j.job.session_id();
  // Rank 1 is 2x slower at steps 2 and 3, fine at 4, then slower from step 5 on.
  auto busy = [](int rank, int64_t n) { return rank == 1 && n != 4 && n != 1 ? 0.2 : 0.1; };
  for (int64_t n = 1; n <= 6; ++n) {
    for (int r = 0; r < 3; ++r)
      ASSERT_TRUE(beat(d, *w[j.ranks[r]], {step(sid, n, 0.25, busy(r, n))}).ok());
    EXPECT_EQ(get_job(d, j.job.job_id()).findings_size(), 0) << "step " << n;
  }
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(beat(d, *w[j.ranks[r]], {step(sid, 7, 0.25, busy(r, 7))}).ok());
  proto::Job job = get_job(d, j.job.job_id());
  ASSERT_EQ(job.findings_size(), 1);
  EXPECT_EQ(job.findings(0).kind(), "straggler");
  EXPECT_NE(job.findings(0).text().find("rank 1 is a straggler"), std::string::npos)
      << job.findings(0).text();
  EXPECT_NE(job.findings(0).text().find("steps 5 to 7"), std::string::npos)
      << job.findings(0).text();
  const std::vector<std::string> lines = logs(d, j.job.job_id());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "[kiln-coordinator] straggler: " + job.findings(0).text());
  // Once per rank.
  for (int r = 0; r < 3; ++r)
    ASSERT_TRUE(beat(d, *w[j.ranks[r]], {step(sid, 8, 0.25, busy(r, 8))}).ok());
  EXPECT_EQ(get_job(d, j.job.job_id()).findings_size(), 1);
}

}  // namespace
}  // namespace kiln::test
