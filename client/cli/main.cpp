// client/cli/main.cpp: the `kiln` command-line tool: `kiln run` (client/cli/run.h), the torchrun
// analog for one machine, and the coordinator's job commands (client/cli/jobs.h).
//
//   kiln --help
//   kiln run --help
//   kiln run --nproc 2 build/bin/digits
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "jobs.h"
#include "run.h"

namespace {

constexpr const char* kHelp = R"(usage: kiln <command> [options]

commands:
  run      start N ranks of a program on this machine (the torchrun analog)
  workers  the coordinator's workers
  jobs     the coordinator's jobs
  submit   queue a job and run its driver here once its workers are free
  status   one job
  cancel   cancel a job
  logs     a job's driver output
  steps    a job's steps per rank
  profile  profile a running job's next N steps on every rank (one merged Chrome trace)
  plan     plan FSDP x TP memory and traffic for a mesh of any size (kiln-plan)

'kiln <command> --help' shows a command's options.
)";

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kHelp, stderr);
    return kiln::client::kExitUsage;
  }
  if (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::fputs(kHelp, stdout);
    return 0;
  }
  if (args[0] == "run") {
    const kiln::client::ParsedRun parsed =
        kiln::client::parse_run_args(std::vector<std::string>(args.begin() + 1, args.end()));
    if (!parsed.options) return parsed.exit_status;
    return kiln::client::launch(*parsed.options);
  }
  if (args[0] == "plan") {  // kiln-plan, next to this binary, links the runtime; this one does not
    const std::string tool =
        (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kiln-plan").string();
    std::vector<char*> av{const_cast<char*>(tool.c_str())};
    for (int i = 2; i < argc; ++i) av.push_back(argv[i]);
    av.push_back(nullptr);
    execv(tool.c_str(), av.data());
    std::fprintf(stderr, "kiln: cannot run %s: %s\n", tool.c_str(), std::strerror(errno));
    return kiln::client::kExitUsage;
  }
  if (kiln::client::is_job_command(args[0])) {
    return kiln::client::run_job_command(args[0],
                                         std::vector<std::string>(args.begin() + 1, args.end()));
  }
  std::fprintf(stderr, "kiln: unknown command '%s' (see kiln --help)\n", args[0].c_str());
  return kiln::client::kExitUsage;
}
