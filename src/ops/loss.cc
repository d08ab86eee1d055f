// Fused softmax + cross-entropy and the accuracy count. The loss is computed from the
// log-sum-exp, not log(prob), so a confidently wrong row gives a large finite loss instead of
// -log(0) = inf. The *_device pair runs the current device's fused kernels (device_kernels.h).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"
#include "tessel/tensor/tensor.h"
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
                            int64_t C, float dloss, int64_t lo) {
  if (dlogits == nullptr) return;
  const float scale = dloss / static_cast<float>(N);
  for (int64_t r = 0; r < N; ++r) {
    const float* pr = probs + r * C;
    float* dr = dlogits + r * C;
    for (int64_t c = 0; c < C; ++c) dr[c] = pr[c] * scale;
    // The forward checked the labels; one outside [lo, lo + C) belongs to another rank's slice
    // (tensor parallel, also on the rank whose slice starts at 0).
    const int64_t label = labels[r] - lo;
    if (label >= 0 && label < C) dr[label] -= scale;
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

void sliced_row_max(float* row_max, const float* logits, int64_t N, int64_t C, int64_t valid) {
  for (int64_t r = 0; r < N; ++r) {
    float mx = -INFINITY;
    // std::max, not a libm std::fmax call per value (the same bits: softmax_row says why).
    for (int64_t c = 0; c < valid; ++c) mx = std::max(mx, logits[r * C + c]);
    row_max[r] = mx;
  }
}

void sliced_exp(float* probs, float* sums, float* target, const float* logits,
                const int32_t* labels, const float* row_max, int64_t N, int64_t C, int64_t valid,
                int64_t lo) {
  for (int64_t r = 0; r < N; ++r) {
    const float* lr = logits + r * C;
    float* pr = probs + r * C;
    for (int64_t c = 0; c < valid; ++c) pr[c] = detail::exp(lr[c] - row_max[r]);
    for (int64_t c = valid; c < C; ++c) pr[c] = 0.0f;
    sums[r] = detail::sum(pr, valid);
    const int64_t label = labels[r] - lo;
    target[r] = label >= 0 && label < valid ? lr[label] : 0.0f;
  }
}

void sliced_normalize(float* probs, const float* sums, int64_t N, int64_t C, int64_t valid) {
  for (int64_t r = 0; r < N; ++r) {
    const float inv = 1.0f / sums[r];
    for (int64_t c = 0; c < valid; ++c) probs[r * C + c] *= inv;
  }
}

float sliced_loss(const float* sums, const float* target, const float* row_max, int64_t N,
                  int64_t* correct) {
  double total = 0.0;
  *correct = 0;
  for (int64_t r = 0; r < N; ++r) {
    total += static_cast<double>(std::log(sums[r])) - static_cast<double>(target[r] - row_max[r]);
    *correct += target[r] >= row_max[r];
  }
  return static_cast<float>(total / static_cast<double>(N));
}

float cross_entropy_forward_device(float* lse, int64_t* correct, const void* logits,
                                   const int32_t* labels, int64_t N, int64_t C, DType t) {
  TESSEL_CHECK(N > 0 && C > 0, "cross_entropy_forward: N and C must be > 0, got N=", N, " C=", C);
  const DeviceKernels& k = current_device_kernels("cross_entropy_forward");
  if (k.cross_entropy_forward == nullptr) throw_no_device_kernel("cross_entropy_forward");
  if (k.count_correct == nullptr) throw_no_device_kernel("count_correct");
  const Device device = current_device();
  // The mean loss (f32) and the count (i64) side by side: one read back.
  Tensor out = Tensor::empty({2}, DType::kI64, device),
         losses = Tensor::empty({N}, DType::kF32, device);
  k.cross_entropy_forward(static_cast<float*>(out.raw()), static_cast<float*>(losses.raw()), lse,
                          logits, labels, N, C, t, current_stream());
  k.count_correct(static_cast<int64_t*>(out.raw()) + 1, logits, labels, N, C, t, current_stream());
  const Tensor host = out.to_device(Device::kCpu);
  *correct = host.data<int64_t>()[1];
  float loss;
  std::memcpy(&loss, host.raw(), sizeof loss);
  return loss;
}

void cross_entropy_backward_device(void* dlogits, const void* logits, const float* lse,
                                   const int32_t* labels, int64_t N, int64_t C, float dloss,
                                   int64_t lo, DType t) {
  device_kernel(&DeviceKernels::cross_entropy_backward, "cross_entropy_backward")(
      dlogits, logits, lse, labels, N, C, dloss, lo, t, current_stream());
}

}  // namespace tessel::ops
