// Jobs that survive failures (Note [Restarts] in coordinator/src/jobs.cpp): a failed driver or a
// dead worker queues the job again as "restarting" while it has restarts left, an elastic job
// restarts on fewer workers with its mesh's first dim shrunk, the restart count outlives the
// coordinator, and `kiln submit` runs COMMAND again with the checkpoint settings.
#include "harness.h"

namespace kiln::test {
namespace {

proto::SubmitJobRequest restartable(int workers, int max_restarts) {
  proto::SubmitJobRequest req;
  req.set_protocol_version(proto::kProtocolVersion);
  req.set_workers(workers);
  req.add_command("true");
  req.set_max_restarts(max_restarts);
  req.set_checkpoint_dir("/shared/ckpt");
  req.set_checkpoint_every(5);
  return req;
}

// A dp=2,tp=2 job that may restart twice, down to 2 workers.
proto::SubmitJobRequest elastic_2x2() {
  proto::SubmitJobRequest req = restartable(4, 2);
  req.set_min_workers(2);
  for (auto [name, size] : {std::pair{"dp", 2}, {"tp", 2}}) {
    proto::MeshDim& m = *req.add_mesh();
    m.set_name(name);
    m.set_size(size);
  }
  return req;
}

bool running_again(Daemon& d, const std::string& id, const std::string& old_session) {
  return eventually(
      [&] {
        const proto::Job j = get_job(d, id);
        return j.state() == "running" && j.session_id() != old_session;
      },
      std::chrono::seconds(10));
}

TEST(Restarts, AFailedDriverRestartsTheJobUntilItsRestartsAreUsedUp) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3"});
  FakeWorker w0(d, "w0"), w1(d, "w1");
  proto::Job job;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, restartable(2, 1), &job).ok());
  EXPECT_EQ(job.max_restarts(), 1);
  EXPECT_EQ(job.min_workers(), 2);
  EXPECT_EQ(job.max_workers(), 2);
  ASSERT_TRUE(eventually([&] { return get_job(d, job.job_id()).state() == "running"; }));
  const std::string first = get_job(d, job.job_id()).session_id();

  ASSERT_TRUE(finish_job(d, job.job_id(), 3).ok());
  proto::Job j = get_job(d, job.job_id());
  EXPECT_EQ(j.state(), "restarting");
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_TRUE(j.session_id().empty());
  ASSERT_EQ(j.findings_size(), 1);
  EXPECT_EQ(j.findings(0).kind(), "restart");
  EXPECT_NE(j.findings(0).text().find("the driver exited with code 3; restart 1 of 1"),
            std::string::npos)
      << j.findings(0).text();
  ASSERT_TRUE(running_again(d, job.job_id(), first));
  // The second failure is the last one allowed: the job fails.
  ASSERT_TRUE(finish_job(d, job.job_id(), 4).ok());
  j = get_job(d, job.job_id());
  EXPECT_EQ(j.state(), "failed");
  EXPECT_EQ(j.exit_code(), 4);
  EXPECT_EQ(j.restarts(), 1);
}

TEST(Restarts, ADeadWorkerRestartsAnElasticJobOnFewerWorkers) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3"});
  auto w0 = std::make_unique<FakeWorker>(d, "w0");
  auto w1 = std::make_unique<FakeWorker>(d, "w1");
  auto w2 = std::make_unique<FakeWorker>(d, "w2");
  auto w3 = std::make_unique<FakeWorker>(d, "w3");
  proto::Job job;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, elastic_2x2(), &job).ok());
  ASSERT_TRUE(eventually([&] { return get_job(d, job.job_id()).state() == "running"; }));
  const std::string first = get_job(d, job.job_id()).session_id();

  w3->stop();  // three workers are left: dp shrinks to 1 (tp groups of 2 stay whole)
  ASSERT_TRUE(running_again(d, job.job_id(), first));
  proto::Job j = get_job(d, job.job_id());
  EXPECT_EQ(j.workers(), 2);
  EXPECT_EQ(j.max_workers(), 4);
  ASSERT_EQ(j.mesh_size(), 2);
  EXPECT_EQ(j.mesh(0).size(), 1);
  EXPECT_EQ(j.mesh(1).size(), 2);
  EXPECT_EQ(j.restarts(), 1);
  ASSERT_GE(j.findings_size(), 1);
  EXPECT_NE(j.findings(0).text().find("worker w3 stopped heartbeating; restart 1 of 2"),
            std::string::npos)
      << j.findings(0).text();

  // The restart count and the history outlive the coordinator.
  d.crash();
  d.start();
  j = get_job(d, job.job_id());
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.min_workers(), 2);
  EXPECT_EQ(j.checkpoint_dir(), "/shared/ckpt");
  EXPECT_EQ(j.checkpoint_every(), 5);
  EXPECT_EQ(j.findings(0).kind(), "restart");
  ASSERT_TRUE(finish_job(d, job.job_id(), 0).ok());
  EXPECT_EQ(get_job(d, job.job_id()).state(), "succeeded");
}

// See Note [Growing back]: the elastic job a lost worker shrank to 2 grows back to 4 once two
// workers have been idle for --grow-after-s with no job waiting; growing is a preemption that
// restarts at once and does not use up a restart.
TEST(Restarts, AnElasticJobGrowsBackWhenWorkersAreIdle) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3", "--grow-after-s", "1"});
  std::vector<std::unique_ptr<FakeWorker>> ws;
  for (const char* name : {"w0", "w1", "w2", "w3"})
    ws.push_back(std::make_unique<FakeWorker>(d, name));
  proto::Job job;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, elastic_2x2(), &job).ok());
  ASSERT_TRUE(eventually([&] { return get_job(d, job.job_id()).state() == "running"; }));
  const std::string first = get_job(d, job.job_id()).session_id();
  ws[3]->stop();
  ASSERT_TRUE(running_again(d, job.job_id(), first));
  ASSERT_EQ(get_job(d, job.job_id()).workers(), 2);
  const std::string second = get_job(d, job.job_id()).session_id();

  // A job waiting for workers holds the growth off, and then takes the new worker and the idle one.
  proto::Job other;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, restartable(2, 0), &other).ok());
  ws.push_back(std::make_unique<FakeWorker>(d, "w4"));
  ASSERT_TRUE(eventually([&] { return get_job(d, other.job_id()).state() == "running"; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(get_job(d, job.job_id()).preempting());

  // When it ends, its two workers are idle: the job is asked to grow.
  ASSERT_TRUE(finish_job(d, other.job_id(), 0).ok());
  ASSERT_TRUE(eventually([&] { return get_job(d, job.job_id()).preempting(); }));
  proto::Job j = get_job(d, job.job_id());
  EXPECT_NE(j.message().find("growing from 2 to 4 workers"), std::string::npos) << j.message();
  EXPECT_EQ(j.findings(j.findings_size() - 1).kind(), "grow");
  ASSERT_TRUE(finish_job(d, job.job_id(), 143).ok());  // its driver, stopped, exits
  ASSERT_TRUE(running_again(d, job.job_id(), second));
  j = get_job(d, job.job_id());
  EXPECT_EQ(j.workers(), 4);
  EXPECT_EQ(j.mesh(0).size(), 2);
  EXPECT_EQ(j.restarts(), 1);  // the growth is not a restart
  ASSERT_TRUE(finish_job(d, job.job_id(), 0).ok());
  EXPECT_EQ(get_job(d, job.job_id()).state(), "succeeded");
}

TEST(Restarts, BadSettingsAreRefused) {
  TempDir dir;
  Daemon d(dir.path());
  auto refused = [&](const proto::SubmitJobRequest& req, const std::string& says) {
    expect_refused(d, req, says);
  };
  proto::SubmitJobRequest r = restartable(2, -1);
  refused(r, "max_restarts must be in [0, 1000], got -1");
  r = restartable(2, 1001);
  refused(r, "max_restarts must be in [0, 1000]");
  r = restartable(2, 1);
  r.set_min_workers(3);
  refused(r, "min_workers must be in [1, workers = 2], got 3");
  r.set_min_workers(-1);
  refused(r, "min_workers must be in");
  r = restartable(2, 1);
  r.set_checkpoint_every(-5);
  refused(r, "checkpoint_every must be >= 0 steps, got -5");
  r = restartable(2, 1);
  r.set_checkpoint_dir(std::string("a\0b", 3));
  refused(r, "checkpoint_dir must be a path");
  r = restartable(4, 1);
  r.set_min_workers(3);
  for (auto [name, size] : {std::pair{"dp", 2}, {"tp", 2}}) {
    proto::MeshDim& m = *r.add_mesh();
    m.set_name(name);
    m.set_size(size);
  }
  refused(r, "min_workers 3 is not a multiple of 2");
}

// `kiln submit --max-restarts`: the driver fails once, runs again with KILN_RESTARTS=1 and the
// checkpoint settings, and the job succeeds; `kiln status` shows the restart.
TEST(Restarts, SubmitRunsAFailedDriverAgain) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3"});
  FakeWorker w0(d, "w0");
  Cli sub = run_kiln(dir.path(), d,
                     {"submit", "--max-restarts", "2", "--checkpoint-dir", "/ck",
                      "--checkpoint-every", "7", "--", "sh", "-c",
                      "echo run $KILN_RESTARTS $KILN_CHECKPOINT_DIR $KILN_CHECKPOINT_EVERY; "
                      "[ \"$KILN_RESTARTS\" = 1 ]"});
  EXPECT_EQ(sub.status, 0) << sub.err;
  EXPECT_EQ(sub.out, "run 0 /ck 7\nrun 1 /ck 7\n");
  EXPECT_NE(sub.err.find("job-1 restarting (the driver exited with code 1; restart 1 of 2"),
            std::string::npos)
      << sub.err;
  Cli status = run_kiln(dir.path(), d, {"status", "job-1"});
  EXPECT_NE(status.out.find("restarts:  1 of 2 (workers 1..1)"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("checkpoint:/ck, every 7 steps"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("restart:   "), std::string::npos) << status.out;
  for (const char* bad : {"--max-restarts", "--min-workers", "--checkpoint-every"})
    EXPECT_EQ(run_kiln(dir.path(), d, {"submit", bad, "x", "--", "true"}).status, 2) << bad;
  EXPECT_EQ(run_kiln(dir.path(), d, {"submit", "--checkpoint-dir"}).status, 2);
}

}  // namespace
}  // namespace kiln::test
