// Dropout whose mask is recomputed, never stored: element (r, c) is kept when the uniform draw
// of CounterRng(seed, mix_stream(kDropout, step, sample)) at index c is >= p, where sample is the
// row's global sample index. Any split of the rows over ranks or micro-batches therefore draws
// the same mask.
#include "tessel/core/error.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {
namespace {

void check_p(const char* who, float p) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw InvalidArgument(
        str(who, ": dropout probability must be in [0, 1), got ", p, "; fix the config"));
  }
}

// out = in * mask / (1 - p); forward and backward differ only in which tensors they pass.
void apply_mask(float* out, const float* in, int64_t rows, int64_t cols, float p, uint64_t seed,
                int64_t step, int64_t first_sample) {
  const float scale = 1.0f / (1.0f - p);
  for (int64_t r = 0; r < rows; ++r) {
    CounterRng rng(seed, mix_stream(RngPurpose::kDropout, static_cast<uint64_t>(step),
                                    static_cast<uint64_t>(first_sample + r)));
    const float* ir = in + r * cols;
    float* orow = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      orow[c] = rng.uniform(static_cast<uint64_t>(c)) >= p ? ir[c] * scale : 0.0f;
    }
  }
}

}  // namespace

void dropout_forward(float* y, const float* x, int64_t rows, int64_t cols, float p,
                     uint64_t seed, int64_t step, int64_t first_sample) {
  check_p("dropout_forward", p);
  apply_mask(y, x, rows, cols, p, seed, step, first_sample);
}

void dropout_backward(float* dx, const float* dy, int64_t rows, int64_t cols, float p,
                      uint64_t seed, int64_t step, int64_t first_sample) {
  check_p("dropout_backward", p);
  if (dx == nullptr) return;
  apply_mask(dx, dy, rows, cols, p, seed, step, first_sample);
}

}  // namespace tessel::ops
