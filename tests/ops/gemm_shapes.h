// GEMM test shapes shared by gemm_test.cc and gemm_lowp_test.cc.
#pragma once

#include <cstdint>
#include <span>

#include "tessel/core/rng.h"

namespace tessel::ops::testing {

// Every size of `sizes` in every dimension (M, N, K) and transpose combination, the other two
// dimensions drawn from `sizes` by rng (redrawn while M * N * K > max_volume, so the reference
// stays quick): f(trans_a, trans_b, M, N, K, seed), the seed counting the cases from 1.
template <typename F>
void for_each_edge_shape(std::span<const int64_t> sizes, int64_t max_volume, const CounterRng& rng,
                         F&& f) {
  uint64_t draw = 0, seed = 0;
  auto pick = [&] {
    return sizes[static_cast<size_t>(rng.uniform(draw++) * static_cast<double>(sizes.size()))];
  };
  for (int trans = 0; trans < 4; ++trans)
    for (int dim = 0; dim < 3; ++dim)
      for (int64_t v : sizes) {
        int64_t d[3];
        do {
          for (int64_t& x : d) x = pick();
          d[dim] = v;
        } while (d[0] * d[1] * d[2] > max_volume);
        f((trans & 1) != 0, (trans & 2) != 0, d[0], d[1], d[2], ++seed);
      }
}

}  // namespace tessel::ops::testing
