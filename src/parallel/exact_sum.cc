#include "exact_sum.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/error.h"

namespace tessel::parallel {

ExactSum::ExactSum(nn::Range span, std::vector<nn::Range> scale_buckets, bool overflow_ok)
    : span_(span),
      buckets_(std::move(scale_buckets)),
      max_(buckets_.size(), 0.0f),
      overflow_ok_(overflow_ok) {}

void ExactSum::collect(nn::Range r, float* grad) {
  const int64_t n = span_.size();
  const int64_t s = passes_[r.lo]++;
  if (s >= num_shards_) {
    num_shards_ = s + 1;
    shards_.resize(static_cast<size_t>(num_shards_ * n), 0.0f);
  }
  float* dst = shards_.data() + s * n - span_.lo;
  const float* src = grad;
  // Copy and track each scale bucket's largest |g| in one pass.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t lo = std::max(buckets_[b].lo, r.lo), hi = std::min(buckets_[b].hi, r.hi);
    float m = max_[b];
    bool nan = false;  // std::max passes NaN over: note it apart
    for (int64_t i = lo; i < hi; ++i) {
      dst[i] = src[i - r.lo];
      m = std::max(m, std::fabs(src[i - r.lo]));
      nan |= src[i - r.lo] != src[i - r.lo];
    }
    max_[b] = nan ? std::numeric_limits<float>::infinity() : m;
  }
  std::fill(grad, grad + r.size(), 0.0f);
}

const std::vector<double>& ExactSum::quantise(comm::Communicator& scale_group,
                                              comm::Communicator& sum_group) {
  const int64_t n = span_.size();
  const size_t nb = buckets_.size();
  // 1. Agree on every bucket's largest |g| over all shards, and on the number of shards.
  std::vector<float> maxes = max_;
  std::fill(max_.begin(), max_.end(), 0.0f);
  double shards_total = static_cast<double>(num_shards_);
  scale_group.allreduce(maxes.data(), nb, comm::ElemType::kF32, comm::ReduceOp::kMax);
  sum_group.allreduce(&shards_total, 1, comm::ElemType::kF64);
  // 2. Quantise at scale 2^e with |sum| < 2^62 and sum exactly in int64.
  acc_.assign(static_cast<size_t>(n), 0);
  scales_.assign(nb, 1.0);
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
    const double sc = scales_[b];
    const int64_t lo = std::max(buckets_[b].lo, span_.lo), hi = std::min(buckets_[b].hi, span_.hi);
    for (int64_t s = 0; s < num_shards_; ++s) {
      const float* p = shards_.data() + s * n - span_.lo;
      int64_t* a = acc_.data() - span_.lo;
      // Truncation toward zero: deterministic, vectorises, and loses < 2^-e per shard.
      for (int64_t i = lo; i < hi; ++i)
        a[i] += static_cast<int64_t>(static_cast<double>(p[i]) * sc);
    }
  }
  num_shards_ = 0;
  passes_.clear();
  return scales_;
}

void ExactSum::dequantise(const int64_t* sums, nn::Range span,
                          const std::vector<nn::Range>& buckets, const std::vector<double>& scales,
                          float* out) {
  std::fill(out, out + span.size(), 0.0f);
  for (size_t b = 0; b < buckets.size(); ++b) {
    const int64_t lo = std::max(buckets[b].lo, span.lo), hi = std::min(buckets[b].hi, span.hi);
    if (std::isnan(scales[b])) {
      for (int64_t i = lo; i < hi; ++i) out[i - span.lo] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    for (int64_t i = lo; i < hi; ++i)
      out[i - span.lo] = static_cast<float>(static_cast<double>(sums[i - span.lo]) / scales[b]);
  }
}

double ExactSum::reduce(float* out, const std::vector<nn::Range>& ranges,
                        comm::Communicator& scale_group, comm::Communicator& sum_group) {
  quantise(scale_group, sum_group);
  // 3. All-reduce the integers (associative: any order of ranks gives the same sums).
  double bytes = 0;
  for (const nn::Range& r : ranges) {
    sum_group.allreduce(acc_.data() + (r.lo - span_.lo), static_cast<size_t>(r.size()),
                        comm::ElemType::kI64);
    bytes += 8.0 * static_cast<double>(r.size());
  }
  dequantise(acc_.data(), span_, buckets_, scales_, out);
  return bytes;
}

}  // namespace tessel::parallel
