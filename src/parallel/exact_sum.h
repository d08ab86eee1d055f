// ExactSum: the deterministic gradient sum. Every micro-shard's gradient is kept apart
// (collect()); reduce() agrees a power-of-two scale per scale bucket from the largest |g| over
// all shards of all ranks, quantises every shard to int64 at that scale, sums exactly (integer
// addition is associative) and all-reduces the integers. The result does not depend on how the
// shards were spread over ranks, so any layout gives a single worker's bits as long as the
// scale buckets are the same: they are units of the whole model, whatever this rank runs.
// Its memory (the kept shards, the maxima, the integer sums) is the current device's when it is
// made: on a device rank the shards stay there, the maxima and quantisation run as device
// kernels (tessel/ops/exact.h, the CPU's roundings), only the maxima (a float per scale bucket)
// come to the host for the scales, and the integers are all-reduced through the rank's
// DeviceCollectives (NCCL or staged: int64 sums), so the bits are the CPU's.
// A parameter-server worker stops after quantise() and pushes its integer sums; the servers add
// the workers' integers and dequantise() them (parameter_server.cc).
// Internal to the parallel area.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"
#include "tessel/nn/model.h"
#include "tessel/tensor/tensor.h"

namespace tessel::parallel {

class ExactSum {
 public:
  // span: the arena elements this rank sums (its units); scale_buckets: arena ranges, in order.
  // overflow_ok (fp16's loss scaling skips such steps): a scale bucket holding an inf or NaN
  // sums to NaN instead of failing.
  ExactSum(nn::Range span, std::vector<nn::Range> scale_buckets, bool overflow_ok = false);

  // Takes `grad`, the gradient of arena range r from one micro-shard (memory of this sum's
  // device), and zeroes it for the next (one call per range and micro-shard).
  void collect(nn::Range r, float* grad);
  // Writes the exact sum of every rank's collected shards into out (the span's elements, on
  // this sum's device) and forgets them. scale_group: every rank whose shards may fall in a
  // scale bucket (their scales must agree); sum_group: the ranks whose shards are summed, over
  // `ranges` (the local units); on a device, `device` holds sum_group's collectives (null:
  // sum_group has one rank). Returns the bytes all-reduced.
  double reduce(float* out, const std::vector<nn::Range>& ranges, comm::Communicator& scale_group,
                comm::Communicator& sum_group, comm::DeviceCollectives* device = nullptr);
  // reduce() up to the all-reduce: agrees every scale bucket's scale (a power of two; NaN for a
  // bucket holding an inf or NaN, overflow_ok) over scale_group and the shard count over
  // sum_group, then sums this rank's collected shards at those scales into sums() (the span's
  // elements) and forgets them. Returns the scales, one per scale bucket.
  const std::vector<double>& quantise(comm::Communicator& scale_group,
                                      comm::Communicator& sum_group);
  const int64_t* sums() const { return acc_.data<int64_t>(); }  // on the CPU
  // out[i - span.lo] = sums[i - span.lo] / scale of i's bucket, for the elements of span (NaN in
  // a bucket whose scale is NaN), on the current device.
  static void dequantise(const int64_t* sums, nn::Range span, const std::vector<nn::Range>& buckets,
                         const std::vector<double>& scales, float* out);

 private:
  float* shard(int64_t s) const;  // collected shard s, indexed by arena element

  nn::Range span_;
  std::vector<nn::Range> buckets_;
  Device device_;
  Tensor shards_;  // collected shards, each span_.size() long, back to back (grown on demand)
  Tensor max_;     // per scale bucket, largest |g| collected
  Tensor acc_;     // quantise(): the integer sums over the span
  std::vector<double> scales_;         // quantise(): per scale bucket
  std::map<int64_t, int64_t> passes_;  // per collected range (by start): shards collected
  int64_t num_shards_ = 0;
  bool overflow_ok_;
};

}  // namespace tessel::parallel
