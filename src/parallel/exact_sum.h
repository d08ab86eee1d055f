// ExactSum: the deterministic gradient sum. Every micro-shard's gradient is kept apart
// (collect()); reduce() agrees a power-of-two scale per scale bucket from the largest |g| over
// all shards of all ranks, quantises every shard to int64 at that scale, sums exactly (integer
// addition is associative) and all-reduces the integers. The result does not depend on how the
// shards were spread over ranks, so any layout gives a single worker's bits as long as the
// scale buckets are the same: they are units of the whole model, whatever this rank runs.
// Internal to the parallel area.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/nn/model.h"

namespace tessel::parallel {

class ExactSum {
 public:
  // span: the arena elements this rank sums (its units); scale_buckets: arena ranges, in order.
  // overflow_ok (fp16's loss scaling skips such steps): a scale bucket holding an inf or NaN
  // sums to NaN instead of failing.
  ExactSum(nn::Range span, std::vector<nn::Range> scale_buckets, bool overflow_ok = false);

  // Keeps `src`, the gradient of arena range r from one micro-shard (one call per range and
  // micro-shard).
  void collect(nn::Range r, const float* src);
  // Writes the exact sum of every rank's collected shards into out (the span's elements) and
  // forgets them. scale_group: every rank whose shards may fall in a scale bucket (their scales
  // must agree); sum_group: the ranks whose shards are summed, over `ranges` (the local units).
  // Returns the bytes all-reduced.
  double reduce(float* out, const std::vector<nn::Range>& ranges, comm::Communicator& scale_group,
                comm::Communicator& sum_group);

 private:
  nn::Range span_;
  std::vector<nn::Range> buckets_;
  std::vector<float> shards_;          // collected shards, each span_.size() long, back to back
  std::vector<float> max_;             // per scale bucket, largest |g| collected
  std::map<int64_t, int64_t> passes_;  // per collected range (by start): shards collected
  int64_t num_shards_ = 0;
  bool overflow_ok_;
};

}  // namespace tessel::parallel
