// Dropout whose mask is recomputed, never stored: element (r, c) is kept when
// CounterRng(seed, mix_stream(kDropout, step, sample)).uniform(c) >= p, where sample is the
// row's global sample index. Any split of the rows over ranks or micro-batches therefore draws
// the same mask.
//
// Calling CounterRng once per element costs ~11 ns (ten dependent Philox rounds, out of line).
// The mask here evaluates the same Philox4x32-10 function for a block of columns at once, in
// lane arrays gcc vectorises; the ops tests check it bit for bit against CounterRng.
#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

constexpr int kLanes = 64;

void check_p(const char* who, float p) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw InvalidArgument(
        str(who, ": dropout probability must be in [0, 1), got ", p, "; fix the config"));
  }
}

// uniform(index) of CounterRng(seed, stream) for index = first .. first + kLanes - 1: the first
// word of philox4x32(seed, {index lo, index hi, stream lo, stream hi}), top 24 bits scaled.
void uniform_block(float* out, uint64_t seed, uint64_t stream, uint64_t first) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    const uint64_t index = first + static_cast<uint64_t>(j);
    c0[j] = static_cast<uint32_t>(index);
    c1[j] = static_cast<uint32_t>(index >> 32);
    c2[j] = static_cast<uint32_t>(stream);
    c3[j] = static_cast<uint32_t>(stream >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t p0 = uint64_t{0xD2511F53u} * c0[j];
      const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2[j];
      const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[j] ^ k0;
      const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[j] ^ k1;
      c1[j] = static_cast<uint32_t>(p1);
      c3[j] = static_cast<uint32_t>(p0);
      c0[j] = n0;
      c2[j] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int j = 0; j < kLanes; ++j) {
    out[j] = static_cast<float>(c0[j] >> 8) * (1.0f / 16777216.0f);
  }
}

// out = in * mask / (1 - p); forward and backward differ only in which tensors they pass.
void apply_mask(float* out, const float* in, int64_t rows, int64_t cols, float p, uint64_t seed,
                int64_t step, int64_t first_sample, int64_t first_col) {
  const float scale = 1.0f / (1.0f - p);
  float u[kLanes];
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t stream = mix_stream(RngPurpose::kDropout, static_cast<uint64_t>(step),
                                       static_cast<uint64_t>(first_sample + r));
    const float* ir = in + r * cols;
    float* orow = out + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      uniform_block(u, seed, stream, static_cast<uint64_t>(first_col + c0));
      const int64_t n = std::min<int64_t>(kLanes, cols - c0);
      for (int64_t j = 0; j < n; ++j) orow[c0 + j] = u[j] >= p ? ir[c0 + j] * scale : 0.0f;
    }
  }
}

}  // namespace

void dropout_forward(float* y, const float* x, int64_t rows, int64_t cols, float p, uint64_t seed,
                     int64_t step, int64_t first_sample, int64_t first_col) {
  check_p("dropout_forward", p);
  apply_mask(y, x, rows, cols, p, seed, step, first_sample, first_col);
}

void dropout_backward(float* dx, const float* dy, int64_t rows, int64_t cols, float p,
                      uint64_t seed, int64_t step, int64_t first_sample, int64_t first_col) {
  check_p("dropout_backward", p);
  if (dx == nullptr) return;
  apply_mask(dx, dy, rows, cols, p, seed, step, first_sample, first_col);
}

}  // namespace tessel::ops
