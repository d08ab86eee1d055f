// The elementwise steps of deterministic mode's exact gradient sum (src/parallel/exact_sum.h):
// each micro-shard kept and its largest |g| per scale bucket taken, its values quantised at the
// agreed power-of-two scale and added into int64 sums, and the sums turned back into floats. On the
// CPU these are the loops below; inside a DeviceScope they call the device's kernel table
// (device_kernels.h) on the current stream, with the same roundings, so a device's integer
// sums are the CPU's bits. Every pointer is memory of the current device.
#pragma once

#include <cstdint>

namespace tessel::ops {

// kept[i] = g[i] and max[0] = max(max[0], |g[i]|) over n values, in one pass; a NaN among
// them makes the maximum +inf.
void exact_collect(float* kept, float* max, const float* g, int64_t n);
// acc[i] += int64(double(g[i]) * scale), truncated toward zero (scale a power of two, g finite,
// |g| * scale < 2^62).
void exact_quantise(int64_t* acc, const float* g, int64_t n, double scale);
// out[i] = float(double(sums[i]) / scale) (round to nearest); a NaN scale writes NaN.
void exact_dequantise(float* out, const int64_t* sums, int64_t n, double scale);

}  // namespace tessel::ops
