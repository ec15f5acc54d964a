// kiln/error.h: the user-facing error type and the KILN_CHECK / KILN_ASSERT macros.
//
//   KILN_CHECK(a.dim() == 2, ValueError, "mm: expected a 2-D tensor, got ", a.sizes());
//   KILN_ASSERT(impl != nullptr);           // a Kiln bug: aborts with "internal error"
//   try { ... } catch (const kiln::Error& e) { if (e.kind() == kiln::ErrorKind::Index) ... }
//
// Note [Error kinds]: the kinds mirror the Python exceptions they map to (ValueError, TypeError,
// IndexError, NotImplementedError, RuntimeError), so bindings translate them 1:1.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

enum class ErrorKind { Value, Type, Index, NotImplemented, Runtime };

const char* error_kind_name(ErrorKind k);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Note [Warnings]: a warning goes to the current handler (default: one "kiln warning: ..." line on
// stderr; the Python package installs one that calls warnings.warn). KILN_WARN_ONCE warns the
// first time its call site runs in the process, like PyTorch's TORCH_WARN_ONCE.
using WarningHandler = void (*)(const std::string& msg);
// Installs `h` (nullptr restores the default) and returns the previous handler.
WarningHandler set_warning_handler(WarningHandler h);
void warn(const std::string& msg);

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(ErrorKind kind, const std::string& msg);
[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace kiln

#define KILN_CHECK(cond, kind, ...)                                                   \
  do {                                                                                \
    if (__builtin_expect(!(cond), 0))                                                 \
      ::kiln::detail::throw_error(::kiln::ErrorKind::kind,                            \
                                  ::kiln::detail::str_cat(__VA_ARGS__));              \
  } while (0)

#define KILN_FAIL(kind, ...) \
  ::kiln::detail::throw_error(::kiln::ErrorKind::kind, ::kiln::detail::str_cat(__VA_ARGS__))

#define KILN_WARN_ONCE(...)                                                           \
  do {                                                                                \
    static const bool kiln_warned_ = (::kiln::warn(::kiln::detail::str_cat(__VA_ARGS__)), true); \
    (void)kiln_warned_;                                                               \
  } while (0)

#define KILN_ASSERT(cond, ...)                                                     \
  do {                                                                             \
    if (__builtin_expect(!(cond), 0))                                              \
      ::kiln::detail::assert_fail(#cond, __FILE__, __LINE__,                       \
                                  ::kiln::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
