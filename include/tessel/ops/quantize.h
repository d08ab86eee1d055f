// Stochastic int8 quantisation, the math of the int8 gradient codec (compress.kind = int8,
// src/parallel/compress/codecs.h): per chunk of elements one f32 scale (max |x| / 127) and
// int8 values rounded up or down at random, so that their expectation is x. The random numbers
// are Philox4x32-10 (tessel/core/rng.h), a pure function of (seed, stream, element), so every
// ISA level writes the same bytes (its kernel runs 8 Philox blocks at a time under AVX2).
// Stateless; safe to call from several threads on distinct buffers.
#pragma once

#include <cstdint>

namespace tessel::ops {

// Stochastic rounding of x / scale to int8 with a uniform u in [0, 1): floor(x * inv_scale + u),
// clamped to [-127, 127]; unbiased.
int8_t quantize_int8(float x, float inv_scale, float u);

// x[n] in chunks of `chunk` elements (a multiple of 4; the last one may be shorter): chunk c's
// scales[c] = max |x| / 127 over it (NaN ignored), then q[i] = quantize_int8(x[i], 127 / max
// (0 where max is 0), u_i) with u_i the top 24 bits of lane i % 4 of
// CounterRng(seed, stream).block(i / 4), scaled to [0, 1).
void int8_quantize(int8_t* q, float* scales, const float* x, int64_t n, int64_t chunk,
                   uint64_t seed, uint64_t stream);
// acc[i] += q[i] * scales[i / chunk] for i in [0, n): int8_quantize's values added back.
void int8_dequantize_add(float* acc, const int8_t* q, const float* scales, int64_t n,
                         int64_t chunk);

}  // namespace tessel::ops
