#include "tessel/core/error.h"

namespace tessel {

std::string excerpt(const std::string& value) {
  if (value.size() <= 80) return value;
  return str(value.substr(0, 60), "... (", value.size(), " characters)");
}

namespace detail {

std::string cut_message(const std::string& what) {
  if (what.size() <= kMaxMessage) return what;
  const size_t keep = kMaxMessage / 2 - 50;
  return str(what.substr(0, keep), " [... ", what.size() - 2 * keep, " characters cut ...] ",
             what.substr(what.size() - keep));
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(
      str("internal check failed: ", cond, " at ", file, ":", line, msg.empty() ? "" : ": ", msg));
}

}  // namespace detail
}  // namespace tessel
