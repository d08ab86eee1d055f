// Gradient buckets and the exact (deterministic) gradient sum, shared by the strategies.
//
// Buckets: ranges of the gradient arena of about ddp.bucket_mb, filled in reverse block order
// (the last blocks' gradients are ready first); a block is never split, its gradients are all
// ready at the same moment.
//
// ExactSum: deterministic mode. Every fixed micro-shard's gradient is kept apart (collect());
// reduce() agrees a power-of-two scale per bucket from the largest |g| over all shards of all
// ranks, quantises every shard to int64 at that scale, sums exactly (integer addition is
// associative) and all-reduces the integers. The result is independent of how the shards were
// spread over ranks, so any layout gives a single worker's bits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/nn/model.h"

namespace tessel::parallel {

struct GradBucket {
  size_t first_block;  // the lowest block with parameters in the bucket
  int64_t lo, hi;      // element range of the gradient arena
};

std::vector<GradBucket> make_buckets(nn::Model& model, double bucket_mb);

using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // element ranges [lo, hi)

class ExactSum {
 public:
  explicit ExactSum(std::vector<GradBucket> buckets) : buckets_(std::move(buckets)) {}

  // Keeps the gradient arena's current contents (one micro-shard's gradient).
  void collect(const Tensor& grads);
  // Overwrites `grads` with the exact sum of every rank's collected shards and forgets them.
  // scale_group: the ranks that must agree on the scales (every rank whose shards could fall in
  // a bucket); sum_group: the ranks whose shards are summed, over `ranges` of the arena only
  // (empty: all of it). Either group may be null (this rank alone). Returns the bytes
  // all-reduced.
  double reduce(Tensor& grads, comm::Communicator* scale_group, comm::Communicator* sum_group,
                const Ranges& ranges = {});

 private:
  std::vector<GradBucket> buckets_;
  std::vector<float> shards_;     // collected shard gradients, back to back
  std::vector<float> shard_max_;  // per bucket, largest |g| among the collected shards
  int64_t num_shards_ = 0;
};

}  // namespace tessel::parallel
