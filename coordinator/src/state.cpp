#include "state.h"

#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kiln/proto/json.h"

namespace kiln::coord {

namespace {

// Bump on every schema change, with a migration from the previous version in open().
// 2: sessions.secret. 3: job_findings and job_steps (new tables: kSchema makes them).
// 4: jobs.mesh. 5: jobs.restarts and job_specs (a new table).
constexpr int kSchemaVersion = 5;

constexpr const char* kSchema = R"(
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY, address TEXT NOT NULL, device TEXT NOT NULL, state TEXT NOT NULL,
  session_id TEXT NOT NULL, epoch INTEGER NOT NULL, memory_limit_bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
  id TEXT PRIMARY KEY, state TEXT NOT NULL, job_id TEXT NOT NULL, tenant TEXT NOT NULL,
  message TEXT NOT NULL, worker_ids TEXT NOT NULL, created_unix_ms INTEGER NOT NULL,
  secret TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS jobs (
  seq INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, state TEXT NOT NULL,
  priority INTEGER NOT NULL, workers INTEGER NOT NULL, command TEXT NOT NULL,
  tenant TEXT NOT NULL, session_id TEXT NOT NULL, worker_addresses TEXT NOT NULL,
  exit_code INTEGER NOT NULL, message TEXT NOT NULL, submitted_unix_ms INTEGER NOT NULL,
  started_unix_ms INTEGER NOT NULL, finished_unix_ms INTEGER NOT NULL, mesh TEXT NOT NULL DEFAULT '',
  restarts TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS job_logs (
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, line TEXT NOT NULL, PRIMARY KEY (job_id, idx));
CREATE TABLE IF NOT EXISTS job_steps (
  job_id TEXT NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL, unix_ms INTEGER NOT NULL,
  seconds REAL NOT NULL, busy_seconds REAL NOT NULL, loss REAL, tokens REAL NOT NULL,
  PRIMARY KEY (job_id, step, rank));
CREATE TABLE IF NOT EXISTS job_specs (job_id TEXT PRIMARY KEY, spec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS job_findings (
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL,
  unix_ms INTEGER NOT NULL, PRIMARY KEY (job_id, idx));
)";

template <typename List>
std::string to_json(const List& list) {
  return nlohmann::json(std::vector<std::string>(list.begin(), list.end())).dump();
}

std::vector<std::string> from_json(const std::string& s) {
  return nlohmann::json::parse(s).get<std::vector<std::string>>();
}

// Columns step, rank, unix_ms, seconds, busy_seconds, loss, tokens from column `c` on.
proto::StepRecord step_of(Stmt& st, int c) {
  proto::StepRecord r;
  r.set_step(st.integer(c));
  r.set_rank(static_cast<int32_t>(st.integer(c + 1)));
  r.set_unix_ms(st.integer(c + 2));
  r.set_seconds(st.real(c + 3));
  r.set_busy_seconds(st.real(c + 4));
  if (!st.is_null(c + 5)) r.set_loss(st.real(c + 5));
  r.set_tokens(st.real(c + 6));
  return r;
}

}  // namespace

int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

int64_t now_unix_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

std::string random_hex(size_t bytes) {
  std::string raw(bytes, '\0');
  for (size_t got = 0; got < bytes;) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(absl::StrCat("getrandom: ", std::strerror(errno)));
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

std::string shown(const std::string& v) {
  constexpr size_t kShown = 64;
  std::string out = absl::CHexEscape(v.substr(0, kShown));
  if (v.size() > kShown) absl::StrAppend(&out, "... (", v.size(), " bytes)");
  return out;
}

absl::Status State::open(const std::string& path) {
  if (auto st = db_.open(path); !st.ok()) return st;
  try {
    Stmt v = db_.prepare("PRAGMA user_version");
    v.step();
    const int64_t version = v.integer(0);
    if (version > kSchemaVersion) {
      return absl::FailedPreconditionError(
          "state file '" + path + "' has schema version " + std::to_string(version) +
          " but this kiln-coordinator knows only up to " + std::to_string(kSchemaVersion));
    }
    Transaction t(db_);
    db_.exec(kSchema);  // a fresh file gets the current tables; old ones are migrated below
    if (version == 1) db_.exec("ALTER TABLE sessions ADD COLUMN secret TEXT NOT NULL DEFAULT ''");
    // Columns added to a jobs table that an older file has (kSchema made any missing table).
    auto add_job_column = [&](const char* name, const char* type) {
      Stmt cols = db_.prepare("SELECT COUNT(*) FROM pragma_table_info('jobs') WHERE name = ?");
      cols.bind(1, std::string(name));
      cols.step();
      if (cols.integer(0) == 0)
        db_.exec(std::string("ALTER TABLE jobs ADD COLUMN ") + name + " " + type);
    };
    if (version >= 1 && version < 4) add_job_column("mesh", "TEXT NOT NULL DEFAULT ''");
    if (version >= 1 && version < 5) add_job_column("restarts", "TEXT NOT NULL DEFAULT '{}'");
    db_.exec("PRAGMA user_version = " + std::to_string(kSchemaVersion));
    t.commit();
  } catch (const DbError& e) {
    return absl::UnavailableError(e.what());
  }
  return absl::OkStatus();
}

Loaded State::load() {
  Loaded out;
  Stmt w = db_.prepare(
      "SELECT id, address, device, state, session_id, epoch, memory_limit_bytes FROM workers");
  while (w.step()) {
    WorkerRec r;
    r.info.set_worker_id(w.text(0));
    r.info.set_address(w.text(1));
    r.info.set_device(w.text(2));
    r.info.set_state(w.text(3));
    r.info.set_session_id(w.text(4));
    r.info.set_epoch(w.integer(5));
    r.memory_limit_bytes = w.integer(6);
    out.workers[r.info.worker_id()] = r;
  }
  Stmt s = db_.prepare(
      "SELECT id, state, job_id, tenant, message, worker_ids, created_unix_ms, secret"
      " FROM sessions");
  while (s.step()) {
    SessionRec r{s.text(0),   s.text(1), s.text(2), s.text(3), s.text(4), from_json(s.text(5)),
                 s.integer(6), s.text(7)};
    out.sessions[r.id] = r;
  }
  Stmt j = db_.prepare(
      "SELECT seq, id, state, priority, workers, command, tenant, session_id, worker_addresses,"
      " exit_code, message, submitted_unix_ms, started_unix_ms, finished_unix_ms, mesh, restarts FROM jobs");
  while (j.step()) {
    JobRec r;
    r.seq = j.integer(0);
    proto::Job& job = r.job;
    job.set_job_id(j.text(1));
    job.set_state(j.text(2));
    job.set_priority(static_cast<int32_t>(j.integer(3)));
    job.set_workers(static_cast<int32_t>(j.integer(4)));
    for (auto& c : from_json(j.text(5))) job.add_command(c);
    job.set_tenant(j.text(6));
    job.set_session_id(j.text(7));
    for (auto& a : from_json(j.text(8))) job.add_worker_addresses(a);
    job.set_exit_code(static_cast<int32_t>(j.integer(9)));
    job.set_message(j.text(10));
    job.set_submitted_unix_ms(j.integer(11));
    job.set_started_unix_ms(j.integer(12));
    job.set_finished_unix_ms(j.integer(13));
    for (const std::string& dim : from_json(j.text(14).empty() ? "[]" : j.text(14))) {
      proto::MeshDim& d = *job.add_mesh();  // "name=size"
      d.set_name(dim.substr(0, dim.find('=')));
      d.set_size(std::atoi(dim.c_str() + dim.find('=') + 1));
    }
    // See Note [Restarts] in jobs.cpp.
    const nlohmann::json restarts = nlohmann::json::parse(j.text(15));
    job.set_max_restarts(restarts.value("max_restarts", 0));
    job.set_restarts(restarts.value("restarts", 0));
    job.set_min_workers(restarts.value("min_workers", job.workers()));
    job.set_max_workers(restarts.value("max_workers", job.workers()));
    job.set_checkpoint_dir(restarts.value("checkpoint_dir", ""));
    job.set_checkpoint_every(restarts.value("checkpoint_every", 0));
    job.set_batch(restarts.value("batch", false));
    out.max_seq = std::max(out.max_seq, r.seq);
    out.jobs[job.job_id()] = r;
  }
  Stmt specs = db_.prepare("SELECT job_id, spec FROM job_specs");  // See Note [Batch jobs]
  while (specs.step()) {
    auto it = out.jobs.find(specs.text(0));
    if (it != out.jobs.end()) it->second.spec = specs.blob(1);
  }
  // Each rank's latest step (Note [Step telemetry] in worker/src/reports.h).
  Stmt last = db_.prepare(
      "SELECT step, rank, unix_ms, seconds, busy_seconds, loss, tokens, job_id FROM job_steps"
      " WHERE (job_id, rank, step) IN (SELECT job_id, rank, MAX(step) FROM job_steps"
      " GROUP BY job_id, rank) ORDER BY job_id, rank");
  while (last.step()) {
    auto it = out.jobs.find(last.text(7));
    if (it != out.jobs.end()) *it->second.job.add_last_steps() = step_of(last, 0);
  }
  Stmt f = db_.prepare("SELECT job_id, kind, text, unix_ms FROM job_findings ORDER BY job_id, idx");
  while (f.step()) {
    auto it = out.jobs.find(f.text(0));
    if (it == out.jobs.end()) continue;
    proto::Finding& finding = *it->second.job.add_findings();
    finding.set_kind(f.text(1));
    finding.set_text(f.text(2));
    finding.set_unix_ms(f.integer(3));
  }
  return out;
}

void State::put_worker(const WorkerRec& r) {
  const proto::WorkerInfo& w = r.info;
  db_.prepare("INSERT OR REPLACE INTO workers VALUES (?, ?, ?, ?, ?, ?, ?)")
      .bind(1, w.worker_id())
      .bind(2, w.address())
      .bind(3, w.device())
      .bind(4, w.state())
      .bind(5, w.session_id())
      .bind(6, static_cast<int64_t>(w.epoch()))
      .bind(7, static_cast<int64_t>(r.memory_limit_bytes))
      .run();
}

void State::put_session(const SessionRec& s) {
  db_.prepare("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
      .bind(1, s.id)
      .bind(2, s.state)
      .bind(3, s.job_id)
      .bind(4, s.tenant)
      .bind(5, s.message)
      .bind(6, to_json(s.worker_ids))
      .bind(7, s.created_unix_ms)
      .bind(8, s.secret)
      .run();
}

void State::delete_session(const std::string& id) {
  db_.prepare("DELETE FROM sessions WHERE id = ?").bind(1, id).run();
}

void State::delete_worker(const std::string& id) {
  db_.prepare("DELETE FROM workers WHERE id = ?").bind(1, id).run();
}

void State::put_job(const JobRec& r) {
  const proto::Job& j = r.job;
  std::vector<std::string> mesh;
  for (const proto::MeshDim& d : j.mesh())
    mesh.push_back(d.name() + "=" + std::to_string(d.size()));
  nlohmann::json restarts = proto::restart_fields(j);  // See Note [Restarts] in jobs.cpp
  restarts["batch"] = j.batch();
  db_.prepare(
         "INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
      .bind(1, r.seq)
      .bind(2, j.job_id())
      .bind(3, j.state())
      .bind(4, j.priority())
      .bind(5, j.workers())
      .bind(6, to_json(j.command()))
      .bind(7, j.tenant())
      .bind(8, j.session_id())
      .bind(9, to_json(j.worker_addresses()))
      .bind(10, j.exit_code())
      .bind(11, j.message())
      .bind(12, j.submitted_unix_ms())
      .bind(13, j.started_unix_ms())
      .bind(14, j.finished_unix_ms())
      .bind(15, to_json(mesh))
      .bind(16, restarts.dump())
      .run();
}

void State::put_spec(const std::string& job_id, const std::string& spec) {
  db_.prepare("INSERT OR REPLACE INTO job_specs VALUES (?, ?)").bind(1, job_id).bind_blob(2, spec).run();
}

void State::put_step(const std::string& job_id, const proto::StepRecord& r) {
  Stmt st = db_.prepare("INSERT OR REPLACE INTO job_steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  st.bind(1, job_id)
      .bind(2, r.step())
      .bind(3, r.rank())
      .bind(4, r.unix_ms())
      .bind_real(5, r.seconds())
      .bind_real(6, r.busy_seconds());
  if (r.has_loss())
    st.bind_real(7, r.loss());
  else
    st.bind_null(7);
  st.bind_real(8, r.tokens()).run();
}

std::vector<proto::StepRecord> State::steps(const std::string& job_id, int64_t from,
                                            int64_t limit) {
  Stmt st = db_.prepare(
      "SELECT step, rank, unix_ms, seconds, busy_seconds, loss, tokens FROM job_steps"
      " WHERE job_id = ? AND step >= ? ORDER BY step, rank LIMIT ?");
  st.bind(1, job_id).bind(2, from).bind(3, limit);
  std::vector<proto::StepRecord> out;
  while (st.step()) out.push_back(step_of(st, 0));
  return out;
}

void State::put_finding(const std::string& job_id, int idx, const proto::Finding& f) {
  db_.prepare("INSERT OR REPLACE INTO job_findings VALUES (?, ?, ?, ?, ?)")
      .bind(1, job_id)
      .bind(2, idx)
      .bind(3, f.kind())
      .bind(4, f.text())
      .bind(5, f.unix_ms())
      .run();
}

int64_t State::log_count(const std::string& job_id) {
  Stmt s = db_.prepare("SELECT COALESCE(MAX(idx) + 1, 0) FROM job_logs WHERE job_id = ?");
  s.bind(1, job_id).step();
  return s.integer(0);
}

void State::append_logs(const std::string& job_id, const std::vector<std::string>& lines) {
  int64_t idx = log_count(job_id);
  for (const auto& line : lines) {
    Stmt s = db_.prepare("INSERT INTO job_logs VALUES (?, ?, ?)");
    s.bind(1, job_id).bind(2, idx++).bind(3, line).run();
  }
}

std::vector<std::string> State::logs(const std::string& job_id, int64_t from, int64_t limit) {
  Stmt s =
      db_.prepare("SELECT line FROM job_logs WHERE job_id = ? AND idx >= ? ORDER BY idx LIMIT ?");
  s.bind(1, job_id).bind(2, from).bind(3, limit);
  std::vector<std::string> out;
  while (s.step()) out.push_back(s.text(0));
  return out;
}

}  // namespace kiln::coord
