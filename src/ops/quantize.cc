// ops::int8_quantize and int8_dequantize_add: the checks, and the portable kernels, element by
// element. They are the reference: the AVX2 kernels (quantize_avx2.cc) give the same bytes.
#include "tessel/ops/quantize.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels.h"
#include "tessel/core/error.h"
#include "tessel/core/rng.h"

namespace tessel::ops {

int8_t quantize_int8(float x, float inv_scale, float u) {
  const float v = std::floor(x * inv_scale + u);
  return static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
}

void portable::int8_quantize(int8_t* q, float* scales, const float* x, int64_t n, int64_t chunk,
                             uint64_t seed, uint64_t stream) {
  const CounterRng rng(seed, stream);
  for (int64_t c = 0, lo = 0; lo < n; ++c, lo += chunk) {
    const int64_t hi = std::min(n, lo + chunk);
    float amax = 0;
    for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    scales[c] = amax / 127.0f;
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    std::array<uint32_t, 4> u{};  // element i takes lane i % 4 of Philox block i / 4
    for (int64_t i = lo; i < hi; ++i) {
      if (i % 4 == 0) u = rng.block(static_cast<uint64_t>(i / 4));
      q[i] = quantize_int8(x[i], inv, static_cast<float>(u[i % 4] >> 8) * (1.0f / 16777216.0f));
    }
  }
}

void portable::int8_dequantize_add(float* acc, const int8_t* q, const float* scales, int64_t n,
                                   int64_t chunk) {
  for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<float>(q[i]) * scales[i / chunk];
}

void int8_quantize(int8_t* q, float* scales, const float* x, int64_t n, int64_t chunk,
                   uint64_t seed, uint64_t stream) {
  TESSEL_CHECK(chunk > 0 && chunk % 4 == 0 && n >= 0,
               "int8_quantize: chunk must be a positive multiple of 4 and n >= 0, got chunk ",
               chunk, ", n ", n);
  kernels().int8_quantize(q, scales, x, n, chunk, seed, stream);
}

void int8_dequantize_add(float* acc, const int8_t* q, const float* scales, int64_t n,
                         int64_t chunk) {
  TESSEL_CHECK(chunk > 0 && n >= 0,
               "int8_dequantize_add: chunk must be positive and n >= 0, got chunk ", chunk, ", n ",
               n);
  kernels().int8_dequantize_add(acc, q, scales, n, chunk);
}

}  // namespace tessel::ops
