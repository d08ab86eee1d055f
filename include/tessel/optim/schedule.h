// Learning-rate schedules and gradient clipping.
#pragma once

#include <cstdint>

#include "tessel/core/names.h"

namespace tessel::optim {

enum class ScheduleKind : uint8_t { kConstant, kStep, kCosine };  // schedule.kind

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::kConstant;
  int64_t warmup_steps = 0;  // linear warm-up from lr * warmup_start to lr
  float warmup_start = 0.0f;
  int64_t step_size = 1000;  // step: multiply by gamma every step_size steps
  float gamma = 0.1f;
  float min_lr = 0.0f;  // cosine: floor reached at total_steps
};

// lr at `step` (0-based) of `total_steps`, from the base lr.
float lr_at(const ScheduleSpec& spec, float base_lr, int64_t step, int64_t total_steps);

// The linear scaling rule: lr x global_batch / base_batch (base_batch <= 0 disables it).
float scaled_lr(float lr, int64_t global_batch, int64_t base_batch);

// Global-norm clipping split in two, so a distributed step can all-reduce the sum of squares
// between them: norm = sqrt(sum of sum_squares over all shards). Inside a DeviceScope g is
// device memory, summed by the device's kernel and read back.
double sum_squares(const float* g, int64_t n);
// The factor gradients are multiplied by: max_norm / norm when norm > max_norm > 0, else 1.
// Throws InvalidArgument when the norm is not finite.
float clip_factor(double norm, float max_norm);

}  // namespace tessel::optim

namespace tessel {
TESSEL_NAMES(optim::ScheduleKind, "constant", "step", "cosine");
}  // namespace tessel
