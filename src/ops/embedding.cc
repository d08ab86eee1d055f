// Embedding lookup: a row gather forward (the scatter-add backward, every dtype: lowp_kernels.cc).
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

}  // namespace tessel::ops
