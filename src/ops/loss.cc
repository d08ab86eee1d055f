// Fused softmax + cross-entropy and the accuracy count. The loss is computed from the
// log-sum-exp, not log(prob), so a confidently wrong row gives a large finite loss instead of
// -log(0) = inf.
#include <cmath>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "vec_math.h"

namespace tessel::ops {

float cross_entropy_forward(float* probs, const float* logits, const int32_t* labels, int64_t N,
                            int64_t C) {
  TESSEL_CHECK(N > 0 && C > 0, "cross_entropy_forward: N and C must be > 0, got N=", N, " C=", C);
  // Validate every label first so a bad batch leaves probs untouched.
  for (int64_t r = 0; r < N; ++r) {
    if (labels[r] < 0 || labels[r] >= C) {
      throw InvalidArgument(str("cross_entropy_forward: label of row ", r, " must be in [0, ", C,
                                "), got ", labels[r],
                                "; check the dataset's labels against the model's class count"));
    }
  }
  double total = 0.0;
  for (int64_t r = 0; r < N; ++r) {
    const float* lr = logits + r * C;
    float mx;
    const float log_sum = detail::softmax_row(probs + r * C, lr, C, &mx);
    // -log softmax[label] = log(sum) - (logit[label] - max)
    total += static_cast<double>(log_sum) - static_cast<double>(lr[labels[r]] - mx);
  }
  return static_cast<float>(total / static_cast<double>(N));
}

void cross_entropy_backward(float* dlogits, const float* probs, const int32_t* labels, int64_t N,
                            int64_t C, float dloss) {
  if (dlogits == nullptr) return;
  const float scale = dloss / static_cast<float>(N);
  for (int64_t r = 0; r < N; ++r) {
    const float* pr = probs + r * C;
    float* dr = dlogits + r * C;
    for (int64_t c = 0; c < C; ++c) dr[c] = pr[c] * scale;
    TESSEL_DCHECK(labels[r] >= 0 && labels[r] < C, "cross_entropy_backward: bad label ", labels[r]);
    dr[labels[r]] -= scale;
  }
}

int64_t count_correct(const float* logits, const int32_t* labels, int64_t N, int64_t C) {
  int64_t correct = 0;
  for (int64_t r = 0; r < N; ++r) {
    const float* lr = logits + r * C;
    int64_t best = 0;
    // Strict > keeps the first of tied maxima, as torch.argmax does.
    for (int64_t c = 1; c < C; ++c) {
      if (lr[c] > lr[best]) best = c;
    }
    correct += best == labels[r];
  }
  return correct;
}

}  // namespace tessel::ops
