// LossScaler: dynamic loss scaling for train.precision = fp16, with the rules of PyTorch's
// torch.cuda.amp.GradScaler: the loss gradient is multiplied by scale() so that small activation
// gradients stay above fp16's smallest normal; the optimizer reads the gradients divided by it
// (Optimizer::step's grad_scale). A step whose gradient holds an inf or NaN anywhere (the caller
// checks globally, over every rank and shard) is skipped and the scale multiplied by
// backoff_factor; after growth_interval overflow-free steps in a row it is multiplied by
// growth_factor (kept when that would overflow f32). Pure bookkeeping, no communication; one per
// rank, and every rank sees the same overflows, so the scales agree.
#pragma once

#include <cstdint>

namespace tessel::optim {

struct LossScalerSpec {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerSpec& spec = {});

  float scale() const { return scale_; }
  // Overflow-free steps since the last change of the scale (GradScaler's growth tracker).
  int64_t growth_tracker() const { return tracker_; }
  // 1 / scale(), rounded to f32 as GradScaler computes it.
  float inv_scale() const;
  // The step's gradients were checked: found_inf skips it (the caller does not update).
  void update(bool found_inf);
  int64_t skipped() const { return skipped_; }  // steps skipped so far
  // For checkpoints: the state update() continues from. Throws InvalidArgument for a scale
  // that is not finite and positive or a negative tracker.
  void restore(float scale, int64_t growth_tracker, int64_t skipped);

 private:
  LossScalerSpec spec_;
  float scale_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace tessel::optim
