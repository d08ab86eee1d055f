#include "tessel/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace tessel {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("TESSEL_LOG");
  if (v == nullptr) return LogLevel::kInfo;
  if (std::strcmp(v, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(v, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(v, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level); }

void log_line(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[tessel %s] %s\n", kNames[static_cast<int>(level)], msg.c_str());
}

}  // namespace tessel
