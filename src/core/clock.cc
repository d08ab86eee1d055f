#include "tessel/core/clock.h"

#include <chrono>
#include <fstream>
#include <string>

namespace tessel {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

}  // namespace tessel
