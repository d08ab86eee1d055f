// Learning-rate schedules and global-norm clipping. Schedules are pure functions of the step,
// so a resumed run recomputes the same lr from the saved step count.
#include "tessel/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "tessel/core/error.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"
#include "tessel/tensor/tensor.h"

namespace tessel::optim {
namespace {

void validate(const ScheduleSpec& s, float base_lr, int64_t step) {
  if (s.warmup_steps < 0)
    throw InvalidArgument(str("schedule.warmup_steps must be >= 0, got ", s.warmup_steps,
                              "; use 0 to disable warm-up"));
  if (!(s.warmup_start >= 0.0f && s.warmup_start <= 1.0f))
    throw InvalidArgument(str("schedule.warmup_start must be in [0, 1], got ", s.warmup_start,
                              "; it is the fraction of the lr that warm-up starts from"));
  if (s.kind == ScheduleKind::kStep && s.step_size <= 0)
    throw InvalidArgument(str("schedule.step_size must be > 0, got ", s.step_size,
                              "; it is the number of steps between lr decays"));
  if (s.kind == ScheduleKind::kStep && !(s.gamma > 0.0f && std::isfinite(s.gamma)))
    throw InvalidArgument(
        str("schedule.gamma must be > 0, got ", s.gamma, "; the usual value is 0.1"));
  if (s.kind == ScheduleKind::kCosine && !(s.min_lr >= 0.0f && s.min_lr <= base_lr))
    throw InvalidArgument(str("schedule.min_lr must be in [0, lr = ", base_lr, "], got ", s.min_lr,
                              "; lower min_lr"));
  if (step < 0) throw InvalidArgument(str("schedule: step must be >= 0, got ", step));
}

}  // namespace

float lr_at(const ScheduleSpec& spec, float base_lr, int64_t step, int64_t total_steps) {
  validate(spec, base_lr, step);
  const double base = base_lr;
  if (step < spec.warmup_steps) {
    // Linear ramp: warmup_start x base at step 0, reaching base at step warmup_steps.
    const double frac = static_cast<double>(step) / static_cast<double>(spec.warmup_steps);
    return static_cast<float>(base * (spec.warmup_start + (1.0 - spec.warmup_start) * frac));
  }
  if (spec.kind == ScheduleKind::kStep) {
    // Decays count from step 0, so warm-up does not shift the decay boundaries.
    return static_cast<float>(base * std::pow(static_cast<double>(spec.gamma),
                                              static_cast<double>(step / spec.step_size)));
  }
  if (spec.kind == ScheduleKind::kCosine) {
    // Progress runs over the post-warm-up steps; past total_steps it stays at min_lr.
    const int64_t span = total_steps - spec.warmup_steps;
    double progress = 1.0;
    if (span > 0)
      progress =
          std::min(1.0, static_cast<double>(step - spec.warmup_steps) / static_cast<double>(span));
    const double min_lr = spec.min_lr;
    return static_cast<float>(min_lr + (base - min_lr) * 0.5 *
                                           (1.0 + std::cos(std::numbers::pi * progress)));
  }
  return base_lr;
}

float scaled_lr(float lr, int64_t global_batch, int64_t base_batch) {
  if (base_batch <= 0) return lr;
  if (global_batch <= 0)
    throw InvalidArgument(str("optim: global batch must be > 0 for lr scaling, got ", global_batch,
                              "; check the batch size and worker count"));
  return static_cast<float>(static_cast<double>(lr) * static_cast<double>(global_batch) /
                            static_cast<double>(base_batch));
}

namespace {

// On the current device: its kernel's fixed order, the f64 result read back (kI64 storage
// holds the doubles: the result, then the partial sums).
double device_sum_squares(const float* g, int64_t n) {
  const auto kernel = ops::device_kernel(&ops::DeviceKernels::sum_squares, "sum_squares");
  const Tensor out = Tensor::empty({1 + ops::kSumSquaresParts}, DType::kI64, current_device());
  auto* words = static_cast<double*>(out.raw());
  kernel(words, words + 1, g, n, current_stream());
  const Tensor host = out.view(0, {1}).to_device(Device::kCpu);
  double sum;
  std::memcpy(&sum, host.raw(), sizeof sum);
  return sum;
}

}  // namespace

double sum_squares(const float* g, int64_t n) {
  if (ops::on_device()) return device_sum_squares(g, n);
  // Eight independent double lanes: strict FP forbids reassociating one accumulator, so the
  // lanes are what lets the compiler vectorise; the lane order keeps the result deterministic.
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double x = g[i + j];
      acc[j] += x * x;
    }
  for (; i < n; ++i) {
    const double x = g[i];
    acc[0] += x * x;
  }
  double total = 0.0;
  for (double a : acc) total += a;
  return total;
}

float clip_factor(double norm, float max_norm) {
  if (!(max_norm > 0.0f)) return 1.0f;
  if (!std::isfinite(norm))
    throw InvalidArgument(str("optim: gradient norm is not finite, got ", norm,
                              "; lower the learning rate or check the data for NaN/inf"));
  if (norm <= max_norm) return 1.0f;
  return static_cast<float>(static_cast<double>(max_norm) / norm);
}

}  // namespace tessel::optim
