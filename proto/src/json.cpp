#include "kiln/proto/json.h"

namespace kiln::proto {

using nlohmann::json;

json to_json(const StepRecord& r) {
  json out = {{"step", r.step()},
              {"rank", r.rank()},
              {"unix_ms", r.unix_ms()},
              {"seconds", r.seconds()},
              {"busy_seconds", r.busy_seconds()},
              {"tokens", r.tokens()}};
  if (r.has_loss()) out["loss"] = r.loss();
  return out;
}

json to_json(const Finding& f) {
  return {{"kind", f.kind()}, {"text", f.text()}, {"unix_ms", f.unix_ms()}};
}

json restart_fields(const Job& j) {
  return {{"max_restarts", j.max_restarts()},     {"restarts", j.restarts()},
          {"min_workers", j.min_workers()},       {"max_workers", j.max_workers()},
          {"checkpoint_dir", j.checkpoint_dir()}, {"checkpoint_every", j.checkpoint_every()}};
}

json to_json(const Job& j) {
  json steps = json::array(), findings = json::array();
  for (const StepRecord& r : j.last_steps()) steps.push_back(to_json(r));
  for (const Finding& f : j.findings()) findings.push_back(to_json(f));
  json mesh = json::array();
  for (const MeshDim& d : j.mesh()) mesh.push_back({{"name", d.name()}, {"size", d.size()}});
  json out = {{"job_id", j.job_id()},
              {"state", j.state()},
              {"workers", j.workers()},
              {"priority", j.priority()},
              {"command", std::vector<std::string>(j.command().begin(), j.command().end())},
              {"tenant", j.tenant()},
              {"session_id", j.session_id()},
              {"worker_addresses",
               std::vector<std::string>(j.worker_addresses().begin(), j.worker_addresses().end())},
              {"exit_code", j.exit_code()},
              {"message", j.message()},
              {"submitted_unix_ms", j.submitted_unix_ms()},
              {"started_unix_ms", j.started_unix_ms()},
              {"finished_unix_ms", j.finished_unix_ms()},
              {"mesh", mesh},
              {"findings", findings},
              {"last_steps", steps}};
  out.update(restart_fields(j));
  json profiles = json::array();  // See Note [Remote profiling] in coordinator/src/profiles.h
  for (const ProfileInfo& p : j.profiles())
    profiles.push_back(
        {{"profile_id", p.profile_id()},
         {"steps", p.steps()},
         {"unix_ms", p.unix_ms()},
         {"bytes", p.bytes()},
         {"ranks", std::vector<int>(p.ranks().begin(), p.ranks().end())},
         {"missing", std::vector<std::string>(p.missing().begin(), p.missing().end())}});
  out["profiles"] = profiles;
  return out;
}

json to_json(const WorkerInfo& w) {
  return {{"worker_id", w.worker_id()},
          {"address", w.address()},
          {"device", w.device()},
          {"state", w.state()},
          {"session_id", w.session_id()},
          {"epoch", w.epoch()},
          {"last_heartbeat_unix_ms", w.last_heartbeat_unix_ms()},
          {"memory_in_use_bytes", w.memory_in_use_bytes()}};
}

}  // namespace kiln::proto
