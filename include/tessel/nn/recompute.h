// train.recompute: what a training forward keeps for the backward (docs/recompute.md).
#pragma once

#include <cstdint>

#include "tessel/core/names.h"

namespace tessel::nn {

enum class Recompute : uint8_t {
  kNone,       // every block's cache
  kFull,       // each block's input only; the backward reruns the block's forward first
  kSelective,  // the caches less what is large and cheap to recompute (Context::selective)
};

}  // namespace tessel::nn

namespace tessel {
TESSEL_NAMES(nn::Recompute, "none", "full", "selective");
}  // namespace tessel
