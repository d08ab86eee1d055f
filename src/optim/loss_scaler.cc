#include "tessel/optim/loss_scaler.h"

#include <cmath>

#include "tessel/core/error.h"

namespace tessel::optim {

LossScaler::LossScaler(const LossScalerSpec& spec) : spec_(spec), scale_(spec.init_scale) {
  TESSEL_CHECK(std::isfinite(spec.init_scale) && spec.init_scale > 0 && spec.growth_factor > 1 &&
                   spec.backoff_factor > 0 && spec.backoff_factor < 1 && spec.growth_interval > 0,
               "loss scaler: needs a finite positive scale, growth > 1, backoff in (0, 1) and a "
               "positive interval, got scale ",
               spec.init_scale, ", growth ", spec.growth_factor, ", backoff ", spec.backoff_factor,
               ", interval ", spec.growth_interval);
}

float LossScaler::inv_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

// torch._amp_update_scale_ (aten/src/ATen/native/cuda/AmpKernels.cu), in f32 as there.
void LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= spec_.backoff_factor;
    tracker_ = 0;
    ++skipped_;
    return;
  }
  const int64_t successful = tracker_ + 1;
  if (successful == spec_.growth_interval) {
    const float grown = scale_ * spec_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    tracker_ = 0;
  } else {
    tracker_ = successful;
  }
}

void LossScaler::restore(float scale, int64_t growth_tracker, int64_t skipped) {
  if (!(std::isfinite(scale) && scale > 0) || growth_tracker < 0 || skipped < 0)
    throw InvalidArgument(
        str("loss scaler: checkpointed state must have a finite positive scale "
            "and counts >= 0, got scale ",
            scale, ", growth tracker ", growth_tracker, ", skipped ", skipped,
            "; resume from an older checkpoint"));
  scale_ = scale;
  tracker_ = growth_tracker;
  skipped_ = skipped;
}

}  // namespace tessel::optim
