#include "kiln/error.h"

#include <cstdio>
#include <cstdlib>

namespace kiln {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::Value: return "ValueError";
    case ErrorKind::Type: return "TypeError";
    case ErrorKind::Index: return "IndexError";
    case ErrorKind::NotImplemented: return "NotImplementedError";
    case ErrorKind::Runtime: return "RuntimeError";
  }
  return "Error";
}

namespace detail {
void throw_error(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "kiln: internal error at %s:%d: assertion '%s' failed%s%s\n", file, line,
               cond, msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}
}  // namespace detail

}  // namespace kiln
