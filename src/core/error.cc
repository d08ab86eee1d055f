#include "tessel/core/error.h"

namespace tessel::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(str("internal check failed: ", cond, " at ", file, ":", line,
                  msg.empty() ? "" : ": ", msg));
}

}  // namespace tessel::detail
