// Monotonic wall clock and process memory figures for metrics.
#pragma once

#include <cstdint>

namespace tessel {

double now_seconds();       // steady clock, arbitrary origin
int64_t peak_rss_bytes();   // VmHWM of this process, 0 where unknown
int64_t huge_page_bytes();  // anonymous memory on transparent huge pages now, 0 where unknown

}  // namespace tessel
