// RankStats: one rank's measurements since they were last taken, as one typed record. Every
// part adds its own fields (the gradient sync its communication, the store its optimizer time,
// the pipeline its schedule), and the Trainer gathers every rank's record in one all-gather.
#pragma once

#include <array>
#include <cstddef>

#include "tessel/core/memory.h"

namespace tessel::parallel {

struct RankStats {
  double step_s = 0;             // time in training steps (the Trainer's clock)
  double comm_exposed_s = 0;     // waiting for communication (and for slower ranks inside it)
  double comm_overlapped_s = 0;  // communication hidden behind the backward pass
  double optimizer_s = 0;        // clipping and the optimizer step
  double comm_bytes = 0;         // bytes of gradients and parameters this rank communicated
  // Pipeline stages (zero elsewhere).
  double stage = 0, forward_s = 0, backward_s = 0, send_s = 0, recv_wait_s = 0;
  double schedule_s = 0, sent_bytes = 0, peak_inflight = 0;
  // Tensor parallelism: time in the tp group's collectives (inside the blocks' compute) and
  // the bytes they moved.
  double tp_comm_s = 0, tp_bytes = 0;
  // Memory per category (core/memory.h): bytes held at the end, and the peak since last taken.
  std::array<double, kMemCategories> mem{}, mem_peak{};
  double mem_peak_total = 0;

  static constexpr size_t kFields = 16 + 2 * kMemCategories;
  double* data() { return &step_s; }
  const double* data() const { return &step_s; }
};
static_assert(sizeof(RankStats) == RankStats::kFields * sizeof(double),
              "RankStats must be a plain array of doubles (it travels in one all-gather)");

}  // namespace tessel::parallel
