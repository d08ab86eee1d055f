// Embedding lookup: a row gather forward, a scatter-add backward (repeated ids add up).
#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {

void embedding_forward(float* y, const int32_t* ids, const float* table, int64_t N, int64_t V,
                       int64_t C, int64_t lo, int64_t rows) {
  if (rows < 0) rows = V;
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V) {
      throw InvalidArgument(
          str("embedding_forward: id at position ", n, " must be in [0, ", V, "), got ", ids[n],
              "; check the tokenizer's vocabulary against the model's vocab_size"));
    }
    const int64_t r = ids[n] - lo;
    if (r < 0 || r >= rows) {
      std::fill(y + n * C, y + (n + 1) * C, 0.0f);
      continue;
    }
    const float* row = table + r * C;
    std::copy(row, row + C, y + n * C);
  }
}

void embedding_backward(float* dtable, const float* dy, const int32_t* ids, int64_t N, int64_t C,
                        int64_t lo, int64_t rows) {
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = ids[n] - lo;
    if (r < 0 || r >= rows) continue;
    float* row = dtable + r * C;
    const float* g = dy + n * C;
    for (int64_t c = 0; c < C; ++c) row[c] += g[c];
  }
}

}  // namespace tessel::ops
