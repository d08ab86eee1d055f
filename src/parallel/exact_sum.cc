#include "exact_sum.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/error.h"
#include "tessel/core/memory.h"
#include "tessel/ops/exact.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

// n floats of `device`'s memory zeroed (queued on the current stream).
void zero_floats(Device device, float* p, int64_t n) {
  if (device == Device::kCpu) return std::fill(p, p + n, 0.0f);
  device_runtime(device).zero(p, static_cast<size_t>(n) * sizeof(float), current_stream());
}

}  // namespace

ExactSum::ExactSum(nn::Range span, std::vector<nn::Range> scale_buckets, bool overflow_ok)
    : span_(span),
      buckets_(std::move(scale_buckets)),
      device_(current_device()),
      max_(flat_zeros(static_cast<int64_t>(buckets_.size()), MemCategory::kGradients, DType::kF32,
                      device_)),
      acc_(flat_zeros(span.size(), MemCategory::kGradients, DType::kI64, device_)),
      overflow_ok_(overflow_ok) {}

float* ExactSum::shard(int64_t s) const {
  return shards_.kernel_data<float>() + s * span_.size() - span_.lo;
}

void ExactSum::collect(nn::Range r, float* grad) {
  const int64_t n = span_.size();
  const int64_t s = passes_[r.lo]++;
  if (s >= num_shards_) {
    num_shards_ = s + 1;
    if (!shards_.defined() || shards_.numel() < num_shards_ * n) {
      Tensor grown = flat_zeros(num_shards_ * n, MemCategory::kGradients, DType::kF32, device_);
      if (shards_.defined()) grown.view(0, {shards_.numel()}).copy_from(shards_);
      shards_ = std::move(grown);
    }
  }
  // Kept, and each scale bucket's largest |g| taken, in one pass.
  float* dst = shard(s);
  float* max = max_.kernel_data<float>();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t lo = std::max(buckets_[b].lo, r.lo), hi = std::min(buckets_[b].hi, r.hi);
    if (lo < hi) ops::exact_collect(dst + lo, max + b, grad + (lo - r.lo), hi - lo);
  }
  zero_floats(device_, grad, r.size());
}

const std::vector<double>& ExactSum::quantise(comm::Communicator& scale_group,
                                              comm::Communicator& sum_group) {
  const size_t nb = buckets_.size();
  // 1. Agree on every bucket's largest |g| over all shards, and on the number of shards.
  std::vector<float> maxes(nb);
  if (device_ == Device::kCpu) {
    std::copy_n(max_.data<float>(), nb, maxes.begin());
  } else if (nb > 0) {
    device_runtime(device_).copy(maxes.data(), Device::kCpu, max_.raw(), device_,
                                 nb * sizeof(float), current_stream());
  }
  max_.zero_();
  double shards_total = static_cast<double>(num_shards_);
  scale_group.allreduce(maxes.data(), nb, comm::ElemType::kF32, comm::ReduceOp::kMax);
  sum_group.allreduce(&shards_total, 1, comm::ElemType::kF64);
  // 2. Quantise at scale 2^e with |sum| < 2^62 and sum exactly in int64.
  acc_.zero_();
  scales_.assign(nb, 1.0);
  int64_t* acc = acc_.kernel_data<int64_t>() - span_.lo;
  for (size_t b = 0; b < nb; ++b) {
    if (!std::isfinite(maxes[b]) && !overflow_ok_)
      throw Error("deterministic mode: non-finite gradient; lower optim.lr");
    if (!std::isfinite(maxes[b])) {  // an overflow (overflow_ok): the caller skips the step
      scales_[b] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (!(maxes[b] > 0)) continue;
    const int e =
        static_cast<int>(std::floor(std::log2(std::ldexp(1.0, 62) / (shards_total * maxes[b]))));
    scales_[b] = std::ldexp(1.0, std::min(e, 1000));
    const int64_t lo = std::max(buckets_[b].lo, span_.lo), hi = std::min(buckets_[b].hi, span_.hi);
    if (lo < hi)
      for (int64_t s = 0; s < num_shards_; ++s)
        ops::exact_quantise(acc + lo, shard(s) + lo, hi - lo, scales_[b]);
  }
  num_shards_ = 0;
  passes_.clear();
  return scales_;
}

void ExactSum::dequantise(const int64_t* sums, nn::Range span,
                          const std::vector<nn::Range>& buckets, const std::vector<double>& scales,
                          float* out) {
  zero_floats(current_device(), out, span.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t lo = std::max(buckets[b].lo, span.lo), hi = std::min(buckets[b].hi, span.hi);
    if (lo < hi)
      ops::exact_dequantise(out + (lo - span.lo), sums + (lo - span.lo), hi - lo, scales[b]);
  }
}

double ExactSum::reduce(float* out, const std::vector<nn::Range>& ranges,
                        comm::Communicator& scale_group, comm::Communicator& sum_group,
                        comm::DeviceCollectives* device) {
  TESSEL_CHECK(device_ == Device::kCpu || device != nullptr || sum_group.size() == 1,
               "exact sum: a device rank's integer sums need its DeviceCollectives (this is a "
               "bug)");
  quantise(scale_group, sum_group);
  // 3. All-reduce the integers (associative: any order of ranks gives the same sums), on a
  //    device through its collectives, all enqueued before the first wait.
  double bytes = 0;
  std::vector<comm::NcclWork> works;
  int64_t* acc = acc_.kernel_data<int64_t>();
  for (const nn::Range& r : ranges) {
    int64_t* p = acc + (r.lo - span_.lo);
    const size_t count = static_cast<size_t>(r.size());
    if (device != nullptr)
      works.push_back(device->allreduce(p, count, comm::ElemType::kI64, comm::ReduceOp::kSum, {}));
    else if (device_ == Device::kCpu)
      sum_group.allreduce(p, count, comm::ElemType::kI64);
    bytes += 8.0 * static_cast<double>(count);
  }
  for (const comm::NcclWork& w : works) w.wait();
  dequantise(acc, span_, buckets_, scales_, out);
  return bytes;
}

}  // namespace tessel::parallel
