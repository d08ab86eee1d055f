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
  double steps = 0;              // steps (parameter server async/ssp: worker batches) trained
  double comm_exposed_s = 0;     // waiting for communication (and for slower ranks inside it)
  double comm_overlapped_s = 0;  // communication hidden behind the backward pass
  double optimizer_s = 0;        // clipping and the optimizer step
  double comm_bytes = 0;         // bytes of gradients and parameters this rank communicated
  // Of comm_bytes, those of the all-reduces across shard groups (zero.shard_size); the rest
  // stayed inside this rank's group.
  double comm_across_bytes = 0;
  // Pipeline stages (zero elsewhere).
  double stage = 0, forward_s = 0, backward_s = 0, send_s = 0, recv_wait_s = 0;
  double schedule_s = 0, sent_bytes = 0, peak_inflight = 0;
  // Tensor parallelism: time in the tp group's collectives (inside the blocks' compute) and
  // the bytes they moved.
  double tp_comm_s = 0, tp_bytes = 0;
  // Gradient compression (compress.kind != none): bytes the gradient exchanges sent (the
  // transport's counter), the codecs' formula for them, what f32 all-reduces of the same
  // buckets would send, and the time encoding and decoding.
  double compress_bytes = 0, compress_formula_bytes = 0, compress_f32_bytes = 0;
  double encode_s = 0, decode_s = 0;
  double delay_s = 0;  // debug.delay_ms sleeps (fault_injection.h)
  // Memory per category (core/memory.h): bytes held at the end, and the peak since last taken.
  std::array<double, kMemCategories> mem{}, mem_peak{};
  double mem_peak_total = 0;

  static constexpr size_t kFields = 24 + 2 * kMemCategories;
  double* data() { return &step_s; }
  const double* data() const { return &step_s; }

  // Adds a later record's measurements: times, bytes and steps add up, memory held is the later
  // figure, peaks the larger.
  void add(const RankStats& later);
};
inline void RankStats::add(const RankStats& later) {
  const double inflight = peak_inflight > later.peak_inflight ? peak_inflight : later.peak_inflight;
  const std::array<double, kMemCategories> peak = mem_peak;
  const double peak_total = mem_peak_total;
  for (size_t i = 0; i < kFields; ++i) data()[i] += later.data()[i];
  stage = later.stage;
  peak_inflight = inflight;
  mem = later.mem;
  for (size_t k = 0; k < peak.size(); ++k)
    mem_peak[k] = peak[k] > later.mem_peak[k] ? peak[k] : later.mem_peak[k];
  mem_peak_total = peak_total > later.mem_peak_total ? peak_total : later.mem_peak_total;
}

static_assert(sizeof(RankStats) == RankStats::kFields * sizeof(double),
              "RankStats must be a plain array of doubles (it travels in one all-gather)");

}  // namespace tessel::parallel
