// Batch jobs as the coordinator runs them (Note [Batch jobs] in worker/src/batch.h): the spec is
// checked at submission and kept in the state file, each worker of the gang is told to run it
// until it does, rank 0's success ends the job, and a failure restarts or fails it. The workers'
// side is tests/python/test_batch_run.py.
#include "harness.h"
#include "kiln/proto/program.pb.h"

namespace kiln::test {
namespace {

std::string spec_bytes(int64_t batch_size = 4) {
  proto::BatchJob spec;
  spec.mutable_step()->add_inputs(1);
  spec.mutable_step()->add_input_specs()->set_dtype("float32");
  proto::Instruction& neg = *spec.mutable_step()->add_nodes();
  neg.set_op("neg");
  neg.add_args()->set_value(1);
  neg.add_outputs(2);
  spec.mutable_step()->add_outputs(2);
  spec.add_inputs()->set_state("w");
  spec.set_loss(0);
  spec.set_init_checkpoint("/shared/init");
  spec.set_data("/shared/data.safetensors");
  spec.set_batch_size(batch_size);
  spec.set_steps(3);
  return spec.SerializeAsString();
}

proto::SubmitJobRequest batch_job(int workers, std::string spec = spec_bytes()) {
  proto::SubmitJobRequest req;
  req.set_protocol_version(proto::kProtocolVersion);
  req.set_workers(workers);
  req.set_batch(std::move(spec));
  req.set_max_restarts(1);
  req.set_checkpoint_dir("/shared/ckpt");
  req.set_checkpoint_every(2);
  return req;
}

std::vector<std::string> gang_of(Daemon& d, const std::string& session_id) {
  proto::LookupSessionRequest look;
  look.set_session_id(session_id);
  proto::SessionInfo info;
  EXPECT_TRUE(d.call(&Stub::LookupSession, look, &info).ok());
  return {info.worker_ids().begin(), info.worker_ids().end()};
}

proto::HeartbeatRequest result(const std::string& session_id, bool ok, int64_t steps,
                               const std::string& message = "", bool drained = false) {
  proto::HeartbeatRequest req;
  proto::BatchResult& r = *req.add_batch_results();
  r.set_session_id(session_id);
  r.set_ok(ok);
  r.set_steps(steps);
  r.set_message(message);
  r.set_drained(drained);
  return req;
}

TEST(BatchJobs, WorkersAreToldToRunItAndItsEndFinishesTheJob) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3"});
  std::map<std::string, std::unique_ptr<FakeWorker>> w;
  for (const char* id : {"w0", "w1"}) w[id] = std::make_unique<FakeWorker>(d, id);
  proto::Job job;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, batch_job(2), &job).ok());
  EXPECT_TRUE(job.batch());
  ASSERT_TRUE(eventually([&] { return get_job(d, job.job_id()).state() == "running"; }));
  const std::string first = get_job(d, job.job_id()).session_id();
  const std::vector<std::string> ranks = gang_of(d, first);
  ASSERT_EQ(ranks.size(), 2u);

  // A worker that does not serve the session yet is told to run it, as its rank.
  proto::HeartbeatReply reply;
  ASSERT_TRUE(w[ranks[1]]->beat_once({}, &reply).ok());
  ASSERT_EQ(reply.run_batches_size(), 1);
  const proto::BatchRun& run = reply.run_batches(0);
  EXPECT_EQ(run.session_id(), first);
  EXPECT_FALSE(run.session_secret().empty());
  EXPECT_EQ(run.job_id(), job.job_id());
  EXPECT_EQ(run.rank(), 1);
  EXPECT_EQ(run.world_size(), 2);
  EXPECT_EQ(run.spec(), spec_bytes());
  EXPECT_EQ(run.checkpoint_dir(), "/shared/ckpt");
  EXPECT_EQ(run.checkpoint_every(), 2);
  // One that serves it is not.
  proto::HeartbeatRequest serving;
  serving.add_sessions(first);
  ASSERT_TRUE(w[ranks[1]]->beat_once(serving, &reply).ok());
  EXPECT_EQ(reply.run_batches_size(), 0);

  // Rank 1's success alone does not end the job; rank 0's failure restarts it.
  ASSERT_TRUE(w[ranks[1]]->beat_once(result(first, true, 3)).ok());
  EXPECT_EQ(get_job(d, job.job_id()).state(), "running");
  ASSERT_TRUE(w[ranks[0]]->beat_once(result(first, false, 1, "boom")).ok());
  proto::Job j = get_job(d, job.job_id());
  EXPECT_EQ(j.state(), "restarting");
  ASSERT_EQ(j.findings_size(), 1);
  EXPECT_NE(j.findings(0).text().find("rank 0 failed: boom; restart 1 of 1"), std::string::npos)
      << j.findings(0).text();
  // The spec outlives the coordinator, and the restarted job's workers get it.
  d.crash();
  d.start();
  ASSERT_TRUE(eventually(
      [&] {
        const proto::Job r = get_job(d, job.job_id());
        return r.state() == "running" && r.session_id() != first;
      },
      std::chrono::seconds(10)));
  const std::string second = get_job(d, job.job_id()).session_id();
  const std::vector<std::string> again = gang_of(d, second);
  ASSERT_TRUE(w[again[0]]->beat_once({}, &reply).ok());
  ASSERT_EQ(reply.run_batches_size(), 1);
  EXPECT_EQ(reply.run_batches(0).spec(), spec_bytes());
  // A late result of the first session changes nothing; rank 0's success ends the job.
  ASSERT_TRUE(w[ranks[0]]->beat_once(result(first, true, 3)).ok());
  EXPECT_EQ(get_job(d, job.job_id()).state(), "running");
  ASSERT_TRUE(w[again[0]]->beat_once(result(second, true, 3)).ok());
  j = get_job(d, job.job_id());
  EXPECT_EQ(j.state(), "succeeded");
  EXPECT_EQ(j.restarts(), 1);
  bool logged = false;
  for (const std::string& line : logs(d, job.job_id()))
    logged |= line == "[kiln-worker rank 0] finished step 3";
  EXPECT_TRUE(logged);
}

// See Note [Preemption]: a batch job has no driver to checkpoint, so a higher-priority job gets
// its workers at once (not after --preempt-grace-s), and it runs again when they free up.
// See Note [Draining batch jobs] in worker/src/batch.h.
TEST(BatchJobs, APreemptedBatchJobDrainsAndRunsAgain) {
  TempDir dir;
  Daemon d(dir.path(), {"--heartbeat-ms", "200", "--dead-after", "3"});
  std::vector<std::unique_ptr<FakeWorker>> w;
  for (const char* id : {"w0", "w1"}) w.push_back(std::make_unique<FakeWorker>(d, id));
  proto::Job low;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, batch_job(2), &low).ok());
  ASSERT_TRUE(eventually([&] { return get_job(d, low.job_id()).state() == "running"; }));
  const std::string first = get_job(d, low.job_id()).session_id();
  proto::SubmitJobRequest urgent = batch_job(2);
  urgent.set_priority(5);
  proto::Job high;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, urgent, &high).ok());
  ASSERT_TRUE(eventually([&] { return get_job(d, low.job_id()).preempting(); }));
  // Its workers are asked to drain, at every beat until the run ends.
  const std::vector<std::string> gang = gang_of(d, first);
  ASSERT_EQ(gang.size(), 2u);
  FakeWorker* rank0 = nullptr;
  FakeWorker* rank1 = nullptr;
  for (auto& fw : w) (fw->id() == gang[0] ? rank0 : rank1) = fw.get();
  proto::HeartbeatReply reply;
  ASSERT_TRUE(rank1->beat_once(result(first, false, 7, "stopped on request", true), &reply).ok());
  EXPECT_EQ(std::vector<std::string>(reply.drain_sessions().begin(), reply.drain_sessions().end()),
            std::vector<std::string>{first});
  EXPECT_EQ(get_job(d, low.job_id()).state(), "running");  // rank 1's word alone: still draining
  EXPECT_EQ(get_job(d, high.job_id()).state(), "queued");
  ASSERT_TRUE(rank0->beat_once(result(first, false, 7, "stopped on request", true)).ok());
  ASSERT_TRUE(eventually([&] { return get_job(d, high.job_id()).state() == "running"; },
                         std::chrono::seconds(5)));  // at once: the grace is 30 s
  proto::Job j = get_job(d, low.job_id());
  EXPECT_EQ(j.state(), "preempted");
  EXPECT_EQ(j.restarts(), 0);
  // When the urgent job ends, the preempted one runs again, on a new session.
  const std::string urgent_session = get_job(d, high.job_id()).session_id();
  for (const std::string& wid : gang_of(d, urgent_session))
    for (auto& fw : w)
      if (fw->id() == wid) ASSERT_TRUE(fw->beat_once(result(urgent_session, true, 3)).ok());
  ASSERT_TRUE(eventually([&] {
    const proto::Job again = get_job(d, low.job_id());
    return again.state() == "running" && again.session_id() != first;
  }));
}

TEST(BatchJobs, BadSpecsAreRefused) {
  TempDir dir;
  Daemon d(dir.path());
  auto refused = [&](const proto::SubmitJobRequest& req, const std::string& says) {
    expect_refused(d, req, says);
  };
  refused(batch_job(2, "not a proto \xff\xff"), "is not a BatchJob");
  refused(batch_job(3, spec_bytes(4)), "batch_size 4 does not split over 3 data-parallel ranks");
  proto::SubmitJobRequest r = batch_job(2);
  r.add_command("python");
  refused(r, "a batch job has no command");
  r = batch_job(2);
  r.set_min_workers(1);
  refused(r, "no --min-workers");
  proto::BatchJob spec;
  spec.ParseFromString(spec_bytes());
  spec.set_steps(0);
  refused(batch_job(2, spec.SerializeAsString()), "steps >= 1 (got 0)");
  spec.set_steps(3);
  spec.clear_inputs();
  refused(batch_job(2, spec.SerializeAsString()), "1 inputs and 0 input sources");
  refused(batch_job(2, std::string((8 << 20) + 1, 'x')), "the limit is 8388608");
}

// See Note [Batch jobs on a mesh]: the gang, --mesh and the per-rank steps must fit the mesh the
// step was captured on; the job takes that mesh when --mesh is not given.
TEST(BatchJobs, AStepOnAMeshNeedsItsGang) {
  TempDir dir;
  Daemon d(dir.path());
  proto::BatchJob spec;
  spec.ParseFromString(spec_bytes(4));
  spec.add_mesh_names("dp");
  spec.add_mesh_shape(2);
  spec.add_mesh_names("tp");
  spec.add_mesh_shape(2);
  const std::string on_mesh = spec.SerializeAsString();
  expect_refused(d, batch_job(2, on_mesh), "captured on the mesh dp=2,tp=2; the job asks for 2");
  proto::SubmitJobRequest r = batch_job(4, on_mesh);
  proto::MeshDim* m = r.add_mesh();
  m->set_name("dp");
  m->set_size(4);
  m = r.add_mesh();
  m->set_name("tp");
  m->set_size(1);
  expect_refused(d, r, "--mesh differs from the mesh the batch job's step was captured on");
  proto::BatchJob bad = spec;
  bad.set_mesh_shape(1, -2);
  expect_refused(d, batch_job(4, bad.SerializeAsString()), "captured on the mesh");
  bad = spec;
  bad.set_batch_size(3);  // splits over the first dim (2), not the gang (4)
  expect_refused(d, batch_job(4, bad.SerializeAsString()), "does not split over 2 data-parallel");
  bad = spec;
  *bad.add_programs()->mutable_step() = spec.step();
  for (int k = 0; k < 3; ++k) bad.add_program_of_rank(0);  // three ranks of four
  expect_refused(d, batch_job(4, bad.SerializeAsString()), "do not fit its mesh of 4 workers");
  bad.add_program_of_rank(1);  // no step 1
  expect_refused(d, batch_job(4, bad.SerializeAsString()), "do not fit its mesh of 4 workers");

  // See Note [Elastic batch jobs]: --min-workers needs the spec's world size, a multiple of the
  // inner dims, and steps that repeat along the first dim.
  proto::SubmitJobRequest elastic = batch_job(4, on_mesh);
  elastic.set_min_workers(2);
  expect_refused(d, elastic, "its spec records no world size");
  proto::BatchJob sized = spec;
  sized.set_world_size(2);
  expect_refused(d, batch_job(4, sized.SerializeAsString()), "captured for 2 workers");
  sized.set_world_size(4);
  elastic = batch_job(4, sized.SerializeAsString());
  elastic.set_min_workers(3);
  expect_refused(d, elastic, "min_workers 3 is not a multiple of 2");
  for (int k = 0; k < 2; ++k) *sized.add_programs()->mutable_step() = spec.step();
  for (int k : {0, 1, 1, 0}) sized.add_program_of_rank(k);  // differ along "dp"
  elastic = batch_job(4, sized.SerializeAsString());
  elastic.set_min_workers(2);
  expect_refused(d, elastic, "run different steps along its mesh's first dim");
  sized.set_program_of_rank(2, 0);
  sized.set_program_of_rank(3, 1);
  elastic = batch_job(4, sized.SerializeAsString());
  elastic.set_min_workers(2);
  proto::Job elastic_job;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, elastic, &elastic_job).ok());
  EXPECT_EQ(elastic_job.min_workers(), 2);

  spec.set_batch_size(6);  // 3 rows per "dp" rank
  proto::Job job;
  ASSERT_TRUE(d.call(&Stub::SubmitJob, batch_job(4, spec.SerializeAsString()), &job).ok());
  ASSERT_EQ(job.mesh_size(), 2);
  EXPECT_EQ(job.mesh(0).name(), "dp");
  EXPECT_EQ(job.mesh(1).size(), 2);
}

TEST(BatchJobs, SubmitBatchNeedsAReadableSpec) {
  TempDir dir;
  Daemon d(dir.path());
  Cli missing = run_kiln(dir.path(), d, {"submit", "--batch", (dir.path() / "nope").string()});
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("cannot read"), std::string::npos) << missing.err;
  std::ofstream(dir.path() / "spec") << spec_bytes();
  Cli both = run_kiln(dir.path(), d,
                      {"submit", "--batch", (dir.path() / "spec").string(), "--", "true"});
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
  Cli detached = run_kiln(dir.path(), d,
                          {"submit", "--batch", (dir.path() / "spec").string(), "--detach"});
  EXPECT_EQ(detached.status, 0) << detached.err;
  EXPECT_TRUE(get_job(d, "job-1").batch());
}

}  // namespace
}  // namespace kiln::test
