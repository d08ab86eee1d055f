// The shortest of `repeats` timed calls of f, in seconds, after one untimed warm-up call: the
// figure a micro-bench reports (the minimum is the one a shared host's noise moves least).
#pragma once

#include <algorithm>

#include "tessel/core/clock.h"

namespace tessel::bench {

template <typename F>
double best_seconds(int repeats, F f) {
  f();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

}  // namespace tessel::bench
