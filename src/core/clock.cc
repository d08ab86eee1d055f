#include "tessel/core/clock.h"

#include <chrono>
#include <fstream>
#include <string>

namespace tessel {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

namespace {
// The value of `key` (a "Name:" line in kB) in a /proc file of this process, in bytes.
int64_t proc_kb(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string k;
  while (in >> k) {
    if (k == key) {
      int64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 12, '\n');
  }
  return 0;
}
}  // namespace

int64_t peak_rss_bytes() { return proc_kb("/proc/self/status", "VmHWM:"); }

int64_t huge_page_bytes() { return proc_kb("/proc/self/smaps_rollup", "AnonHugePages:"); }

}  // namespace tessel
