// Fault injection for studies and tests (the debug.* keys), as decorators around the real parts,
// so that none of it sits in their hot paths:
//   slow_sync      debug.slow_rank sleeps debug.delay_ms before every gradient reduction (a
//                  parameter-server worker: before its push), a straggler to study; the sleeps
//                  count in RankStats::delay_s.
//   slow_blocks    debug.slow_rank's every block forward and backward takes debug.slow_factor
//                  times as long (it sleeps the difference after each) from step
//                  debug.slow_from_step on: a slower processor, whose share of the work
//                  ddp.balance can shrink.
//   overflow_loss  train.precision = fp16: debug.overflow_rank's loss gradient is inf in the
//                  steps debug.overflow_steps lists, an overflow that every rank must skip.
// Internal to the parallel area: the Engine wraps its parts where the spec asks; tests may too.
#pragma once

#include <cstdint>
#include <memory>

#include "tessel/nn/loss.h"
#include "tessel/parallel/grad_sync.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/spec.h"

namespace tessel::parallel {

// `sync` or `loss` wrapped for training rank `rank` where spec asks for it; null elsewhere.
// step: the step of the piece in progress, as the caller keeps it.
std::unique_ptr<GradSync> slow_sync(const ParallelSpec& spec, int rank, GradSync& sync);
std::unique_ptr<BlockHooks> slow_blocks(const ParallelSpec& spec, int rank, const int64_t& step);
std::unique_ptr<nn::Loss> overflow_loss(const ParallelSpec& spec, int rank, nn::Loss& loss,
                                        const int64_t& step);

}  // namespace tessel::parallel
