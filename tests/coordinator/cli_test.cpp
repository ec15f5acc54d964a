// The `kiln` job commands as programs against a real kiln-coordinator with a fake worker:
// submit runs the driver with the session in its environment and exits with its status, logs
// and status read the result back (also as JSON), cancel stops a running driver.
#include <nlohmann/json.hpp>

#include "harness.h"

namespace kiln::test {
namespace {

TEST(KilnCli, SubmitWithAMeshSetsTheWorkersAndKilnMesh) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0"), w1(d, "w1");
  Cli sub = run_kiln(dir.path(), d,
                     {"submit", "--mesh", "dp=1,tp=2", "--", "sh", "-c",
                      "echo \"mesh $KILN_MESH workers $KILN_WORKERS\""});
  EXPECT_EQ(sub.status, 0) << sub.err;
  EXPECT_NE(sub.out.find("mesh dp=1,tp=2 workers "), std::string::npos) << sub.out;
  Cli status = run_kiln(dir.path(), d, {"status", "job-1"});
  EXPECT_NE(status.out.find("mesh:      dp=1 x tp=2"), std::string::npos) << status.out;
  for (const char* bad : {"tp", "tp=0", "=2", "tp=x"})
    EXPECT_EQ(run_kiln(dir.path(), d, {"submit", "--mesh", bad, "--", "true"}).status, 2) << bad;
}

TEST(KilnCli, SubmitRunsTheDriverAndReportsItsExit) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  Cli sub = run_kiln(dir.path(), d,
                     {"submit", "--workers", "1", "--", "sh", "-c",
                      "echo hi; echo \"env $KILN_JOB_ID $KILN_WORKERS $KILN_SESSION\"; "
                      "echo oops >&2; exit 3"});
  EXPECT_EQ(sub.status, 3) << sub.err;
  EXPECT_NE(sub.out.find("hi\n"), std::string::npos) << sub.out;
  EXPECT_NE(sub.out.find("env job-1 w0.test:7000 s-"), std::string::npos) << sub.out;
  EXPECT_NE(sub.err.find("oops"), std::string::npos) << sub.err;

  Cli logs = run_kiln(dir.path(), d, {"logs", "job-1"});
  EXPECT_EQ(logs.status, 0) << logs.err;
  EXPECT_EQ(logs.out.substr(0, 3), "hi\n");
  EXPECT_NE(logs.out.find("oops"), std::string::npos);

  Cli follow = run_kiln(dir.path(), d, {"logs", "-f", "job-1", "--json"});  // ended: returns
  EXPECT_EQ(follow.status, 0) << follow.err;
  EXPECT_EQ(nlohmann::json::parse(follow.out.substr(0, follow.out.find('\n')))["log"], "hi");

  Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  ASSERT_EQ(status.status, 0) << status.err;
  const auto job = nlohmann::json::parse(status.out);
  EXPECT_EQ(job["state"], "failed");
  EXPECT_EQ(job["exit_code"], 3);
  EXPECT_EQ(job["command"][0], "sh");

  Cli jobs = run_kiln(dir.path(), d, {"jobs", "--json"});
  ASSERT_EQ(jobs.status, 0) << jobs.err;
  EXPECT_EQ(nlohmann::json::parse(jobs.out)["job_id"], "job-1");
  Cli workers = run_kiln(dir.path(), d, {"workers", "--json"});
  ASSERT_EQ(workers.status, 0) << workers.err;
  EXPECT_EQ(nlohmann::json::parse(workers.out)["state"], "idle");  // the gang is released

  Cli table = run_kiln(dir.path(), d, {"jobs"});
  EXPECT_EQ(table.status, 0);
  EXPECT_EQ(table.out.find("\033["), std::string::npos);  // no colour off a TTY
  EXPECT_NE(table.out.find("job-1  failed"), std::string::npos) << table.out;
}

TEST(KilnCli, BinaryOutputIsReportedAsUtf8) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  Cli sub = run_kiln(dir.path(), d,
                     {"submit", "--", "sh", "-c", "printf 'a\\377b \\303\\251\\n'; echo done"});
  EXPECT_EQ(sub.status, 0) << sub.err;
  Cli logs = run_kiln(dir.path(), d, {"logs", "job-1"});
  EXPECT_EQ(logs.out, "a?b \xc3\xa9\ndone\n");
}

TEST(KilnCli, CancelStopsARunningDriver) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  const pid_t pid =
      spawn({KILN_CLI, "submit", "--", "sh", "-c", "echo started; sleep 30"},
            dir.path() / "sub.out", dir.path() / "sub.err", {"KILN_COORDINATOR=" + d.address()});
  ASSERT_TRUE(eventually([&] { return slurp(dir.path() / "sub.out") == "started\n"; }));
  Cli cancel = run_kiln(dir.path(), d, {"cancel", "job-1"});
  EXPECT_EQ(cancel.status, 0) << cancel.err;
  const int rc = wait_for(pid, std::chrono::seconds(10));
  EXPECT_NE(rc, -1) << "kiln submit still running after the cancel";
  EXPECT_NE(rc, 0);
  EXPECT_NE(slurp(dir.path() / "sub.err").find("cancelled"), std::string::npos);
  Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  EXPECT_EQ(nlohmann::json::parse(status.out)["state"], "cancelled");
}

// See Note [Preemption] in coordinator/src/jobs.cpp: a higher-priority job takes the workers of a
// running one, whose driver checkpoints on SIGTERM and exits; it shows "preempted", and runs
// again (KILN_RESTARTS=1) once the other is done, and succeeds.
TEST(KilnCli, APreemptedJobCheckpointsWaitsAndResumes) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0"), w1(d, "w1");
  const pid_t low =
      spawn({KILN_CLI, "submit", "--workers", "2", "--", "sh", "-c",
             "if [ \"$KILN_RESTARTS\" = 1 ]; then echo resumed; exit 0; fi; "
             "trap 'echo checkpoint within $KILN_PREEMPT_GRACE_S s; exit 0' TERM; echo started; "
             "while :; do sleep 0.1; done"},
            dir.path() / "low.out", dir.path() / "low.err", {"KILN_COORDINATOR=" + d.address()});
  ASSERT_TRUE(eventually([&] { return slurp(dir.path() / "low.out") == "started\n"; }));
  std::atomic<bool> seen_preempted{false};
  std::atomic<bool> done{false};
  std::thread watch([&] {  // the low job's state while the high one runs
    while (!done) {
      if (get_job(d, "job-1").state() == "preempted") seen_preempted = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  Cli high = run_kiln(
      dir.path(), d,
      {"submit", "--priority", "5", "--workers", "2", "--", "sh", "-c", "echo high; sleep 0.5"});
  EXPECT_EQ(high.status, 0) << high.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  const int rc = wait_for(low, std::chrono::seconds(20));
  done = true;
  watch.join();
  EXPECT_EQ(rc, 0) << slurp(dir.path() / "low.err");
  EXPECT_TRUE(seen_preempted);
  EXPECT_EQ(slurp(dir.path() / "low.out"), "started\ncheckpoint within 30 s\nresumed\n");
  EXPECT_NE(slurp(dir.path() / "low.err").find("job-1 preempted; COMMAND runs again"),
            std::string::npos)
      << slurp(dir.path() / "low.err");
  const proto::Job job = get_job(d, "job-1");
  EXPECT_EQ(job.state(), "succeeded");
  EXPECT_FALSE(job.preempting());
}

TEST(KilnCli, SigtermCancelsTheJob) {
  TempDir dir;
  Daemon d(dir.path());  // no worker: the job stays queued
  const pid_t pid =
      spawn({KILN_CLI, "submit", "--workers", "2", "--", "true"}, dir.path() / "sub.out",
            dir.path() / "sub.err", {"KILN_COORDINATOR=" + d.address()});
  ASSERT_TRUE(
      eventually([&] { return slurp(dir.path() / "sub.err").find("job-1") != std::string::npos; }));
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_for(pid, std::chrono::seconds(10)), 128 + SIGTERM);
  Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  EXPECT_EQ(nlohmann::json::parse(status.out)["state"], "cancelled");
}

// `kiln submit` SIGKILLed while its driver runs: once --driver-grace-s passes without a report
// stream, the coordinator fails the job instead of holding its worker forever.
TEST(KilnCli, SigkilledSubmitFailsTheJob) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--driver-grace-s", "1"});
  FakeWorker w0(d, "w0");
  const pid_t pid =
      spawn({KILN_CLI, "submit", "--workers", "1", "--", "sh", "-c",
             "echo $$ > " + (dir.path() / "driver.pid").string() + "; echo started; exec sleep 30"},
            dir.path() / "sub.out", dir.path() / "sub.err", {"KILN_COORDINATOR=" + d.address()});
  ASSERT_TRUE(eventually(
      [&] { return slurp(dir.path() / "sub.out").find("started") != std::string::npos; }));
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_for(pid, std::chrono::seconds(10)), 128 + SIGKILL);
  ASSERT_TRUE(eventually([&] {
    Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
    return status.status == 0 && nlohmann::json::parse(status.out)["state"] == "failed";
  }));
  Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  EXPECT_NE(status.out.find("no driver has reported"), std::string::npos) << status.out;
  kill(std::stoi(slurp(dir.path() / "driver.pid")), SIGKILL);  // the orphaned driver
}

// A driver that prints nothing for longer than --driver-grace-s is alive all the same: kiln
// submit attaches its report stream at once, keeps it alive, and re-attaches after a coordinator
// restart without waiting for a line.
TEST(KilnCli, QuietDriverOutlivesTheGrace) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--driver-grace-s", "6"});
  FakeWorker w0(d, "w0");
  const pid_t pid =
      spawn({KILN_CLI, "submit", "--workers", "1", "--", "sh", "-c", "sleep 14"},
            dir.path() / "sub.out", dir.path() / "sub.err", {"KILN_COORDINATOR=" + d.address()});
  std::this_thread::sleep_for(std::chrono::milliseconds(7500));  // quiet, past the grace
  Cli running = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  EXPECT_EQ(nlohmann::json::parse(running.out)["state"], "running") << running.out;
  d.crash();
  d.start();
  EXPECT_EQ(wait_for(pid, std::chrono::seconds(30)), 0) << slurp(dir.path() / "sub.err");
  Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  EXPECT_EQ(nlohmann::json::parse(status.out)["state"], "succeeded") << status.out;
}

// The coordinator is SIGKILLed and restarted (same port, same state) while `kiln submit` drives a
// job: the driver re-attaches (Note [Driver re-attach]), the job ends succeeded and its log
// holds the lines from both sides of the restart.
TEST(KilnCli, SubmitSurvivesACoordinatorRestart) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "100", "--driver-grace-s", "20"});
  FakeWorker w0(d, "w0");
  const fs::path go = dir.path() / "go";
  const pid_t pid =
      spawn({KILN_CLI, "submit", "--workers", "1", "--", "sh", "-c",
             "echo before; while [ ! -f " + go.string() + " ]; do sleep 0.05; done; echo after"},
            dir.path() / "sub.out", dir.path() / "sub.err", {"KILN_COORDINATOR=" + d.address()});
  ASSERT_TRUE(eventually([&] {  // stored (a line in flight when the coordinator dies is lost)
    return run_kiln(dir.path(), d, {"logs", "job-1"}).out.find("before") != std::string::npos;
  }));
  d.crash();
  d.start();
  std::ofstream(go) << "";
  EXPECT_EQ(wait_for(pid, std::chrono::seconds(30)), 0) << slurp(dir.path() / "sub.err");
  Cli status = run_kiln(dir.path(), d, {"status", "job-1", "--json"});
  EXPECT_EQ(nlohmann::json::parse(status.out)["state"], "succeeded") << status.out;
  Cli logs = run_kiln(dir.path(), d, {"logs", "job-1"});
  EXPECT_NE(logs.out.find("before"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("after"), std::string::npos) << logs.out;
}

TEST(KilnCli, ErrorsAreClear) {
  TempDir dir;
  Daemon d(dir.path());
  Cli bad = run_kiln(dir.path(), d, {"submit", "--workers", "-1", "--", "true"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("INVALID_ARGUMENT"), std::string::npos) << bad.err;
  Cli unknown = run_kiln(dir.path(), d, {"status", "job-77"});
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.err.find("unknown job job-77"), std::string::npos) << unknown.err;
  Cli nothing = run_kiln(dir.path(), d, {"submit", "--workers", "1"});
  EXPECT_EQ(nothing.status, 2);
}

}  // namespace
}  // namespace kiln::test
