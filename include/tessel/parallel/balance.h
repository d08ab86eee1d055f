// ShardDeal (ddp.balance): which of a step's shards each data-parallel rank computes. In
// deterministic mode a shard is a micro-shard: the exact sum (exact_sum.h) gives the same bits
// whoever computes it. Otherwise a shard is one row: every rank's loss gradient weighs its rows
// over the global batch's, so the all-reduced sum is the global mean's gradient whatever the
// split (the sum reordered: equal within rounding). Either way the deal may follow the ranks'
// speeds: every step each rank's seconds per shard are all-gathered and every rank feeds the
// same numbers to its own ShardDeal, which therefore deals the same everywhere. Rank r
// computes the consecutive shards [first(r), first(r) + counts()[r]) of every batch of the step.
//   off      the even deal (rank r of n: shards [r S / n, (r + 1) S / n)), never measured;
//   static   the even deal for kWarmupSteps measured steps, then the deal of their speeds, kept;
//   dynamic  re-dealt whenever the smoothed speeds promise a step kHysteresis shorter.
// A deal gives every rank at least one shard (it keeps being measured) and otherwise
// minimises the predicted compute time of the step: max over ranks of shards x smoothed
// seconds per shard. Smoothing (the median of the last kWindow steps: a rank descheduled for
// one step moves nothing, a lasting change counts after kWindow / 2 + 1 steps) and the
// hysteresis keep noise from moving shards back and forth.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/parallel/layout.h"
#include "tessel/parallel/spec.h"

namespace tessel::parallel {

// The median of values (not empty).
double median(std::vector<double> values);

class ShardDeal {
 public:
  static constexpr int kWarmupSteps = 10;      // static: steps measured before the deal is kept
  static constexpr int kWindow = 5;            // steps whose median time a rank's speed is
  static constexpr double kHysteresis = 0.10;  // a new deal must predict a step this much shorter

  // An even deal of `shards` shards per batch over `ranks` ranks (shards >= ranks unless
  // mode is off).
  ShardDeal(BalanceMode mode, int ranks, int64_t shards);

  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t first(int rank) const;
  // Whether this step's timings are to be gathered and fed to update().
  bool measuring() const;
  // Every rank's seconds per shard in the last step (the same numbers on every rank).
  // Returns whether the deal changed.
  bool update(const std::vector<double>& seconds_per_shard);
  // The smoothed seconds per shard by rank: the median of the last kWindow steps' (empty
  // before the first update).
  const std::vector<double>& seconds_per_shard() const { return smoothed_; }
  // The step's predicted compute seconds with this deal and with the even one (0 unmeasured).
  double predicted_s() const { return makespan(counts_); }
  double even_s() const { return makespan(even_); }
  // ... and with the ideal split, shards divided like a fluid so that every rank ends at once.
  double ideal_s() const;
  int64_t changes() const { return changes_; }  // deals made after the first
  std::string str() const;                      // the counts, "11/5"

  // The agreed state for a checkpoint; load() restores it and returns false (keeping the even
  // deal) when it was saved for another mode, rank count or shard count.
  nlohmann::json save() const;
  bool load(const nlohmann::json& state);

 private:
  double makespan(const std::vector<int64_t>& counts) const;
  std::vector<int64_t> best_deal() const;

  BalanceMode mode_;
  int64_t shards_;
  std::vector<int64_t> even_, counts_;
  std::vector<double> smoothed_;
  std::vector<std::vector<double>> recent_;  // per rank, the last kWindow steps' times
  int64_t steps_ = 0, changes_ = 0;
};

}  // namespace tessel::parallel
