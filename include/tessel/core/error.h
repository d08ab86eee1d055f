// Error types and checks. The library reports every failure by throwing a tessel::Error
// subclass whose message says what is wrong and, for the user, what to do next; only main()
// turns an Error into an exit code. TESSEL_CHECK is always on; TESSEL_DCHECK only in debug.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessel {

namespace detail {
// Messages longer than kMaxMessage keep their start and end (what failed and what to do) and
// lose the middle, where a huge echoed value would sit.
constexpr size_t kMaxMessage = 2000;
std::string cut_message(const std::string& what);
}  // namespace detail

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(detail::cut_message(what)) {}
};
// A caller passed something impossible: a bad config value, shape or layout.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
// A file is missing, unreadable, truncated or corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};
// A peer failed or a collective was misused.
class CommError : public Error {
 public:
  using Error::Error;
};
// A blocking call passed its deadline.
class Timeout : public Error {
 public:
  using Error::Error;
};

// str("a=", 1, ", b=", 2.5) -> "a=1, b=2.5": builds messages without format strings.
template <typename... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// A value as a message echoes it: whole up to 80 characters, else its first 60, "..." and its
// length, so that a 100,000-character value does not flood the terminal.
std::string excerpt(const std::string& value);

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace detail

}  // namespace tessel

// TESSEL_CHECK(cond, "message parts", ...) throws tessel::Error naming the failed condition.
#define TESSEL_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      ::tessel::detail::check_failed(__FILE__, __LINE__, #cond, ::tessel::str(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define TESSEL_DCHECK(cond, ...) \
  do {                           \
  } while (0)
#else
#define TESSEL_DCHECK(cond, ...) TESSEL_CHECK(cond, __VA_ARGS__)
#endif
