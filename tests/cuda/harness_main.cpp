// The kiln_gpu_tests runner (tests/cuda/harness.h).
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>

#include "cuda/harness.h"
#include "kiln/cuda/device.h"

namespace kiln::gputest {
namespace {
std::vector<std::string>* g_failures = nullptr;
}

std::vector<TestCase>& registry() {
  static std::vector<TestCase> r;
  return r;
}

int register_test(const char* suite, const char* name, void (*fn)()) {
  registry().push_back({std::string(suite) + "." + name, fn});
  return 0;
}

void add_failure(const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << file << ":" << line << ": " << msg;
  if (g_failures) g_failures->push_back(os.str());
}

bool gpu_available() { return cuda::is_available(); }

}  // namespace kiln::gputest

int main(int argc, char** argv) {
  using namespace kiln::gputest;
  std::string filter = argc > 1 ? argv[1] : "";
  int passed = 0, failed = 0, skipped = 0;
  for (const TestCase& t : registry()) {
    if (!filter.empty() && t.name.find(filter) == std::string::npos) continue;
    std::vector<std::string> failures;
    g_failures = &failures;
    std::string skip_reason;
    bool skip = false;
    try {
      t.fn();
    } catch (const Skip& s) {
      skip = true;
      skip_reason = s.reason;
    } catch (const AssertionAbort&) {
    } catch (const std::exception& e) {
      failures.push_back(std::string("unexpected exception: ") + e.what());
    } catch (...) {
      failures.push_back("unexpected non-std exception");
    }
    g_failures = nullptr;
    if (!failures.empty()) {
      ++failed;
      std::cout << "[FAIL] " << t.name << "\n";
      size_t shown = 0;
      for (const std::string& f : failures) {
        if (++shown > 10) {
          std::cout << "    ... " << failures.size() - 10 << " more\n";
          break;
        }
        std::cout << "    " << f << "\n";
      }
    } else if (skip) {
      ++skipped;
      std::cout << "[SKIP] " << t.name << " (" << skip_reason << ")\n";
    } else {
      ++passed;
      std::cout << "[ OK ] " << t.name << "\n";
    }
    std::cout.flush();
  }
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped" << std::endl;
  return failed == 0 ? 0 : 1;
}
