// The exact sum's elementwise steps (tessel/ops/exact.h): the CPU loops, or the device's slots.
#include "tessel/ops/exact.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::ops {

void exact_collect(float* kept, float* max, const float* g, int64_t n) {
  if (on_device())
    return device_kernel(&DeviceKernels::exact_collect, "exact_collect")(kept, max, g, n,
                                                                         current_stream());
  float m = max[0];
  bool nan = false;  // std::max passes NaN over: note it apart
  for (int64_t i = 0; i < n; ++i) {
    kept[i] = g[i];
    m = std::max(m, std::fabs(g[i]));
    nan |= g[i] != g[i];
  }
  max[0] = nan ? std::numeric_limits<float>::infinity() : m;
}

void exact_quantise(int64_t* acc, const float* g, int64_t n, double scale) {
  if (on_device())
    return device_kernel(&DeviceKernels::exact_quantise, "exact_quantise")(acc, g, n, scale,
                                                                           current_stream());
  // Truncation toward zero: deterministic, vectorises, and loses < 1 / scale per shard.
  for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<int64_t>(static_cast<double>(g[i]) * scale);
}

void exact_dequantise(float* out, const int64_t* sums, int64_t n, double scale) {
  if (on_device())
    return device_kernel(&DeviceKernels::exact_dequantise, "exact_dequantise")(out, sums, n, scale,
                                                                               current_stream());
  if (std::isnan(scale)) {
    std::fill(out, out + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(sums[i]) / scale);
}

}  // namespace tessel::ops
