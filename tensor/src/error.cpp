#include "kiln/error.h"

#include <atomic>
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

namespace {
void default_warning_handler(const std::string& msg) {
  std::fprintf(stderr, "kiln warning: %s\n", msg.c_str());
}
std::atomic<WarningHandler> g_warning_handler{&default_warning_handler};
}  // namespace

WarningHandler set_warning_handler(WarningHandler h) {
  return g_warning_handler.exchange(h != nullptr ? h : &default_warning_handler);
}

void warn(const std::string& msg) { g_warning_handler.load()(msg); }

namespace detail {
void throw_error(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "kiln: internal error at %s:%d: assertion '%s' failed%s%s\n", file, line,
               cond, msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}
}  // namespace detail

}  // namespace kiln
