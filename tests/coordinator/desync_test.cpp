// Desync detection (Note [Desync detection] in coordinator/src/desync.h): fake workers of a
// running job report collectives with their heartbeats, as kiln-worker does, and the coordinator
// names the rank out of step on the job (kiln status), in its log, and in its metrics. Real
// workers and a real desync: tests/python/test_desync.py.

#include "harness.h"

namespace kiln::test {
namespace {

proto::CollectiveRecord record(const std::string& session, uint64_t seq, const std::string& op,
                               const std::string& shape, std::vector<int> members,
                               const std::string& group = "world") {
  proto::CollectiveRecord r;
  r.set_session_id(session);
  r.set_group(group);
  for (int m : members) r.add_members(m);
  r.set_seq(seq);
  r.set_op(op);
  r.set_shape(shape);
  return r;
}

// One heartbeat from `worker` carrying `records`.
absl::Status report(Daemon& d, const FakeWorker& worker,
                    std::vector<proto::CollectiveRecord> records) {
  proto::HeartbeatRequest req;
  for (auto& r : records) *req.add_collectives() = std::move(r);
  return worker.beat_once(std::move(req));
}

TEST(Desync, TheRankOutsideTheMajorityIsNamed) {
  TempDir dir;
  Daemon d(dir.path());
  std::map<std::string, std::unique_ptr<FakeWorker>> w;
  for (const char* id : {"w0", "w1", "w2"}) w[id] = std::make_unique<FakeWorker>(d, id);
  RunningJob j = start_job(d, 3);
  ASSERT_EQ(j.ranks.size(), 3u);
  const std::string& sid = j.job.session_id();
  const std::vector<int> all = {0, 1, 2};
  // Ten collectives in step, reported in batches: nothing to say.
  for (const std::string& id : j.ranks) {
    std::vector<proto::CollectiveRecord> batch;
    for (uint64_t s = 1; s <= 10; ++s)
      batch.push_back(record(sid, s, "all_reduce", "float32[8]", all));
    ASSERT_TRUE(report(d, *w[id], batch).ok());
  }
  EXPECT_EQ(get_job(d, j.job.job_id()).findings_size(), 0);
  // #11: ranks 0 and 1 all-reduce, rank 2 runs its next collective instead.
  ASSERT_TRUE(report(d, *w[j.ranks[0]], {record(sid, 11, "all_reduce", "float32[8]", all)}).ok());
  ASSERT_TRUE(
      report(d, *w[j.ranks[2]], {record(sid, 11, "all_gather_into_tensor", "float32[2]", all)})
          .ok());
  ASSERT_TRUE(report(d, *w[j.ranks[1]], {record(sid, 11, "all_reduce", "float32[8]", all)}).ok());
  const proto::Job job = get_job(d, j.job.job_id());
  ASSERT_EQ(job.findings_size(), 1);
  EXPECT_EQ(job.findings(0).kind(), "desync");
  const std::string& text = job.findings(0).text();
  EXPECT_NE(text.find("rank 2 skipped or reordered a collective"), std::string::npos) << text;
  EXPECT_NE(text.find("collective #11 of group 'world'"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 ran all_gather_into_tensor float32[2]"), std::string::npos) << text;
  EXPECT_NE(text.find("where ranks 0, 1 ran all_reduce float32[8]"), std::string::npos) << text;
  // Once per group; in the log; and it survives a restart of the coordinator.
  ASSERT_TRUE(report(d, *w[j.ranks[2]], {record(sid, 12, "broadcast", "float32[1]", all)}).ok());
  EXPECT_EQ(get_job(d, j.job.job_id()).findings_size(), 1);
  const std::vector<std::string> lines = logs(d, j.job.job_id());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "[kiln-coordinator] desync: " + text);
  d.crash();
  d.start();
  ASSERT_EQ(get_job(d, j.job.job_id()).findings_size(), 1);
  EXPECT_EQ(get_job(d, j.job.job_id()).findings(0).text(), text);
}

TEST(Desync, OfTwoRanksTheOneThatSkippedIsNamedAndGroupsAreKeptApart) {
  TempDir dir;
  Daemon d(dir.path());
  std::map<std::string, std::unique_ptr<FakeWorker>> w;
  for (const char* id : {"w0", "w1", "w2", "w3"}) w[id] = std::make_unique<FakeWorker>(d, id);
  RunningJob j = start_job(d, 4);
  ASSERT_EQ(j.ranks.size(), 4u);
  const std::string& sid = j.job.session_id();
  // Two tensor-parallel groups share the name "tp" ({0, 1} and {2, 3}): their sequences are
  // different groups', so differing collectives there are no desync.
  ASSERT_TRUE(
      report(d, *w[j.ranks[0]], {record(sid, 1, "all_reduce", "float32[4]", {0, 1}, "tp")}).ok());
  ASSERT_TRUE(report(d, *w[j.ranks[2]],
                     {record(sid, 1, "all_gather_into_tensor", "float32[4]", {2, 3}, "tp")})
                  .ok());
  EXPECT_EQ(get_job(d, j.job.job_id()).findings_size(), 0);
  // A worker's records for a session it is not in are ignored.
  ASSERT_TRUE(
      report(d, *w[j.ranks[3]], {record("s-unknown", 1, "all_reduce", "float32[4]", {0, 1})}).ok());
  // In group {0, 1}: rank 0 ran #2 all_reduce then #3 broadcast; rank 1 skipped the all_reduce.
  ASSERT_TRUE(report(d, *w[j.ranks[0]],
                     {record(sid, 2, "all_reduce", "float32[4]", {0, 1}, "tp"),
                      record(sid, 3, "broadcast", "float32[4]", {0, 1}, "tp")})
                  .ok());
  ASSERT_TRUE(report(d, *w[j.ranks[1]],
                     {record(sid, 1, "all_reduce", "float32[4]", {0, 1}, "tp"),
                      record(sid, 2, "broadcast", "float32[4]", {0, 1}, "tp")})
                  .ok());
  const proto::Job job = get_job(d, j.job.job_id());
  ASSERT_EQ(job.findings_size(), 1);
  const std::string& text = job.findings(0).text();
  EXPECT_NE(text.find("rank 1 skipped or reordered a collective: at collective #2 of group 'tp'"),
            std::string::npos)
      << text;
}

TEST(Desync, BadRecordsAreHarmless) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0"), w1(d, "w1");
  RunningJob j = start_job(d, 2);
  const std::string& sid = j.job.session_id();
  // Huge sequence numbers, empty fields and a flood: accepted, bounded, no finding.
  std::vector<proto::CollectiveRecord> flood;
  for (uint64_t s = 0; s < 25000; ++s)
    flood.push_back(record(sid, UINT64_MAX - s, "", std::string(20, 'x'), {}));
  ASSERT_TRUE(report(d, w0, flood).ok());
  EXPECT_EQ(get_job(d, j.job.job_id()).findings_size(), 0);
  // The coordinator still serves.
  EXPECT_EQ(get_job(d, j.job.job_id()).state(), "running");
}

}  // namespace
}  // namespace kiln::test
