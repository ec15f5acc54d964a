// tests/conformance/remote_path.cpp: the Remote path (builds with kiln_client). The sample is
// uploaded to an embedded worker (client::connect_in_process, the in-process transport), the
// op is recorded there, and the outputs read back must equal eager CPU's (random ops bit for
// bit: the worker replays the client's generator counters). The worker runs CPU kernels, so the
// path checks the rows' CPU claims.
#include "conformance/path.h"
#include "kiln/client/session.h"

namespace kiln::conformance {
namespace {

class RemotePath : public Path {
 public:
  std::string name() const override { return "Remote"; }
  testing::Backend claims() const override { return testing::Backend::CPU; }
  DispatchKey key() const override { return DispatchKey::Remote; }
  std::string unavailable() const override { return ""; }

  Outcome run(const Case& c) const override {
    client::Session& s = session();
    try {
      return run_on_device(c, s.device());
    } catch (const Error&) {
      // The worker's error was raised at the read; sync reports it once more, then the session
      // is clean for the next case.
      try {
        s.sync();
      } catch (const Error&) {
      }
      throw;
    }
  }

 private:
  static client::Session& session() {
    static client::Session s = client::connect_in_process(1, {.worker_id = "conformance"});
    return s;
  }
};

}  // namespace

KILN_CONFORMANCE_PATH(RemotePath);

}  // namespace kiln::conformance
