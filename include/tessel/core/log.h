// Minimal leveled logging to stderr. Thread safe (one mutex around each line).
// Level from TESSEL_LOG=debug|info|warn|error (default info).
#pragma once

#include <string>

#include "tessel/core/error.h"

namespace tessel {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_line(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(Args&&... args) {
  if (log_level() <= LogLevel::kInfo) log_line(LogLevel::kInfo, str(std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(Args&&... args) {
  if (log_level() <= LogLevel::kWarn) log_line(LogLevel::kWarn, str(std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(Args&&... args) {
  if (log_level() <= LogLevel::kDebug) log_line(LogLevel::kDebug, str(std::forward<Args>(args)...));
}

}  // namespace tessel
