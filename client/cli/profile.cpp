// `kiln profile JOB --steps N [-o FILE] [--timeout S]`: profiles a running job's next N steps on
// every rank and writes the coordinator's merged Chrome trace (See Note [Remote profiling] in
// coordinator/src/profiles.h). Exits 0 when every rank is in the trace, 1 otherwise (the trace
// of the ranks that answered is still written, and the missing ones are named).
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "jobs.h"
#include "kiln/proto/service.h"
#include "run.h"

namespace kiln::client {

namespace {

int profile_usage(const std::string& msg) {
  std::fprintf(stderr, "kiln: %s (usage: kiln profile JOB --steps N [-o FILE] [--timeout S])\n",
               msg.c_str());
  return kExitUsage;
}

bool parse_int(const std::string& s, int64_t* out) {
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return !s.empty() && ec == std::errc() && ptr == s.data() + s.size();
}

}  // namespace

int profile_main(const CoordClient& c, const std::vector<std::string>& args) {
  proto::ProfileJobRequest req;
  std::string out_path;
  int64_t steps = 0, timeout_s = 120;
  bool have_steps = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool has_value = i + 1 < args.size();
    if (a == "--steps" && has_value) {
      if (!parse_int(args[++i], &steps))
        return profile_usage("--steps takes an integer, got '" + args[i] + "'");
      have_steps = true;
    } else if ((a == "-o" || a == "--output") && has_value) {
      out_path = args[++i];
    } else if (a == "--timeout" && has_value) {
      if (!parse_int(args[++i], &timeout_s) || timeout_s < 1 || timeout_s > 3600)
        return profile_usage("--timeout takes seconds in [1, 3600], got '" + args[i] + "'");
    } else if (req.job_id().empty() && !a.empty() && a[0] != '-') {
      req.set_job_id(a);
    } else {
      return profile_usage("unexpected argument '" + a + "' for kiln profile");
    }
  }
  if (req.job_id().empty()) return profile_usage("kiln profile takes a JOB id");
  if (!have_steps) return profile_usage("kiln profile needs --steps N");
  // The coordinator checks the range and names it; out-of-int32 values are refused here.
  if (steps < 1 || steps > INT32_MAX)
    return profile_usage("--steps must be at least 1, got " + std::to_string(steps));
  req.set_steps(static_cast<int32_t>(steps));
  req.set_timeout_ms(static_cast<uint32_t>(timeout_s * 1000));
  if (out_path.empty()) out_path = req.job_id() + "-profile.json";

  grpc::ClientContext ctx;
  c.prepare(ctx, /*follow=*/true);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s + 60));
  auto reader = c.stub->ProfileJob(&ctx, req);
  proto::ProfileInfo info;
  std::string trace;
  for (proto::ProfileChunk chunk; reader->Read(&chunk);) {
    if (chunk.has_info()) info = chunk.info();
    trace += chunk.data();
  }
  if (auto st = reader->Finish(); !st.ok()) return report_rpc_error(c, st);
  std::ofstream f(out_path, std::ios::binary);
  f << trace;
  f.close();
  if (!f) {
    std::fprintf(stderr, "kiln: cannot write the trace to '%s'\n", out_path.c_str());
    return 1;
  }
  std::printf("wrote %s: profile %lld of job %s, %d steps, %d of %d ranks, %zu bytes\n",
              out_path.c_str(), static_cast<long long>(info.profile_id()), req.job_id().c_str(),
              info.steps(), info.ranks_size(), info.ranks_size() + info.missing_size(),
              trace.size());
  for (const std::string& m : info.missing()) std::fprintf(stderr, "kiln: missing %s\n", m.c_str());
  return info.missing_size() ? 1 : 0;
}

}  // namespace kiln::client
