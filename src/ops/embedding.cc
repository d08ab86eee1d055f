// Embedding lookup: a row gather forward, a scatter-add backward (repeated ids add up).
#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::ops {

void embedding_forward(float* y, const int32_t* ids, const float* table, int64_t N, int64_t V,
                       int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V) {
      throw InvalidArgument(
          str("embedding_forward: id at position ", n, " must be in [0, ", V, "), got ", ids[n],
              "; check the tokenizer's vocabulary against the model's vocab_size"));
    }
    const float* row = table + static_cast<int64_t>(ids[n]) * C;
    std::copy(row, row + C, y + n * C);
  }
}

void embedding_backward(float* dtable, const float* dy, const int32_t* ids, int64_t N, int64_t C) {
  for (int64_t n = 0; n < N; ++n) {
    float* row = dtable + static_cast<int64_t>(ids[n]) * C;
    const float* g = dy + n * C;
    for (int64_t c = 0; c < C; ++c) row[c] += g[c];
  }
}

}  // namespace tessel::ops
