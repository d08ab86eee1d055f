#include "tessel/parallel/exact_sum.h"

#include <algorithm>
#include <cmath>

#include "tessel/core/error.h"

namespace tessel::parallel {

std::vector<GradBucket> make_buckets(nn::Model& model, double bucket_mb) {
  if (!(bucket_mb > 0))
    throw InvalidArgument(str("config: ddp.bucket_mb must be > 0, got ", bucket_mb));
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20) / 4));
  const auto& entries = model.grads().entries();
  std::vector<GradBucket> buckets;
  GradBucket cur{0, -1, -1};
  for (size_t i = model.num_blocks(); i-- > 0;) {
    auto [first, last] = model.block_parameters(i);
    if (first == last) continue;
    const int64_t lo = entries[first].offset;
    const int64_t hi = entries[last - 1].offset + shape_numel(entries[last - 1].shape);
    // Close the bucket before a block that would overflow it, so the blocks already in it can
    // start reducing while this one still runs backward.
    if (cur.hi >= 0 && cur.hi - lo > bucket_elems) {
      buckets.push_back(cur);
      cur = GradBucket{0, -1, -1};
    }
    if (cur.hi < 0) cur.hi = hi;
    cur.lo = lo;
    cur.first_block = i;
  }
  if (cur.hi >= 0) buckets.push_back(cur);
  return buckets;
}

void ExactSum::collect(const Tensor& g) {
  const size_t n = static_cast<size_t>(g.numel());
  shards_.resize((static_cast<size_t>(num_shards_) + 1) * n);
  if (shard_max_.size() != buckets_.size()) shard_max_.assign(buckets_.size(), 0.0f);
  const float* src = g.data<float>();
  float* dst = shards_.data() + num_shards_ * n;
  // Copy and track each bucket's largest |g| in one pass.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    float m = shard_max_[b];
    for (int64_t i = buckets_[b].lo; i < buckets_[b].hi; ++i) {
      dst[i] = src[i];
      m = std::max(m, std::fabs(src[i]));
    }
    shard_max_[b] = m;
  }
  ++num_shards_;
}

double ExactSum::reduce(Tensor& g, comm::Communicator* scale_group, comm::Communicator* sum_group,
                        const Ranges& ranges) {
  const size_t n = static_cast<size_t>(g.numel());
  const size_t nb = buckets_.size();
  // 1. Agree on every bucket's largest |g| over all shards, and on the number of shards.
  std::vector<float> maxes = shard_max_;
  maxes.resize(nb, 0.0f);
  shard_max_.assign(nb, 0.0f);
  double shards_total = static_cast<double>(num_shards_);
  if (scale_group) scale_group->allreduce(maxes.data(), nb, comm::ElemType::kF32, comm::ReduceOp::kMax);
  if (sum_group) sum_group->allreduce(&shards_total, 1, comm::ElemType::kF64);
  // 2. Quantise at scale 2^e with |sum| < 2^62, sum exactly in int64, all-reduce the integers.
  std::vector<int64_t> acc(n, 0);
  std::vector<double> scale(nb, 1.0);
  for (size_t b = 0; b < nb; ++b) {
    if (!std::isfinite(maxes[b]))
      throw Error("deterministic mode: non-finite gradient; lower optim.lr");
    if (!(maxes[b] > 0)) continue;
    int e = static_cast<int>(std::floor(std::log2(std::ldexp(1.0, 62) / (shards_total * maxes[b]))));
    scale[b] = std::ldexp(1.0, std::min(e, 1000));
    const double sc = scale[b];
    for (int64_t s = 0; s < num_shards_; ++s) {
      const float* p = shards_.data() + s * n;
      // Truncation toward zero: deterministic, vectorises, and loses < 2^-e per shard.
      for (int64_t i = buckets_[b].lo; i < buckets_[b].hi; ++i)
        acc[i] += static_cast<int64_t>(static_cast<double>(p[i]) * sc);
    }
  }
  double bytes = 0;
  if (sum_group) {
    const Ranges all = {{0, static_cast<int64_t>(n)}};
    for (auto [lo, hi] : ranges.empty() ? all : ranges) {
      sum_group->allreduce(acc.data() + lo, static_cast<size_t>(hi - lo), comm::ElemType::kI64);
      bytes += 8.0 * static_cast<double>(hi - lo);
    }
  }
  float* out = g.data<float>();
  std::fill(out, out + n, 0.0f);
  for (size_t b = 0; b < nb; ++b)
    for (int64_t i = buckets_[b].lo; i < buckets_[b].hi; ++i)
      out[i] = static_cast<float>(static_cast<double>(acc[i]) / scale[b]);
  num_shards_ = 0;
  return bytes;
}

}  // namespace tessel::parallel
