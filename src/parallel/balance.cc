#include "tessel/parallel/balance.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "tessel/core/error.h"

namespace tessel::parallel {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t h = values.size() / 2;
  return values.size() % 2 ? values[h] : (values[h - 1] + values[h]) / 2;
}

ShardDeal::ShardDeal(BalanceMode mode, int ranks, int64_t shards) : mode_(mode), shards_(shards) {
  for (int64_t r = 0; r < ranks; ++r)
    even_.push_back((r + 1) * shards / ranks - r * shards / ranks);
  counts_ = even_;
}

int64_t ShardDeal::first(int rank) const {
  int64_t f = 0;
  for (int r = 0; r < rank; ++r) f += counts_[static_cast<size_t>(r)];
  return f;
}

bool ShardDeal::measuring() const {
  return mode_ == BalanceMode::kDynamic || (mode_ == BalanceMode::kStatic && steps_ < kWarmupSteps);
}

double ShardDeal::makespan(const std::vector<int64_t>& counts) const {
  double m = 0;
  for (size_t r = 0; r < smoothed_.size(); ++r)
    m = std::max(m, static_cast<double>(counts[r]) * smoothed_[r]);
  return m;
}

double ShardDeal::ideal_s() const {
  double speed_sum = 0;
  for (double t : smoothed_) speed_sum += 1.0 / t;
  return speed_sum > 0 ? static_cast<double>(shards_) / speed_sum : 0;
}

// Proportional to the speeds (at least one each), then shard by shard to the rank it ends
// soonest on (from the rank that ends last while too many are dealt).
std::vector<int64_t> ShardDeal::best_deal() const {
  const double ideal = ideal_s();
  std::vector<int64_t> n;
  int64_t dealt = 0;
  for (double t : smoothed_) {
    n.push_back(std::max<int64_t>(1, static_cast<int64_t>(std::floor(ideal / t))));
    dealt += n.back();
  }
  auto end_with = [&](size_t r, int64_t extra) {
    return static_cast<double>(n[r] + extra) * smoothed_[r];
  };
  for (; dealt > shards_; --dealt) {
    size_t last = 0;
    for (size_t r = 0; r < n.size(); ++r)
      if (n[r] > 1 && (n[last] <= 1 || end_with(r, 0) > end_with(last, 0))) last = r;
    --n[last];
  }
  for (; dealt < shards_; ++dealt) {
    size_t soonest = 0;
    for (size_t r = 1; r < n.size(); ++r)
      if (end_with(r, 1) < end_with(soonest, 1)) soonest = r;
    ++n[soonest];
  }
  return n;
}

bool ShardDeal::update(const std::vector<double>& seconds_per_shard) {
  if (!measuring()) return false;
  if (seconds_per_shard.size() != counts_.size())
    throw Error(tessel::str("ddp.balance: ", seconds_per_shard.size(), " timings for ",
                            counts_.size(), " ranks (this is a bug)"));
  for (double t : seconds_per_shard)
    if (!(t > 0) || !std::isfinite(t)) return false;  // a clock too coarse: nothing learnt
  recent_.resize(seconds_per_shard.size());
  smoothed_.resize(seconds_per_shard.size());
  for (size_t r = 0; r < recent_.size(); ++r) {
    std::vector<double>& window = recent_[r];
    window.push_back(seconds_per_shard[r]);
    if (window.size() > static_cast<size_t>(kWindow)) window.erase(window.begin());
    smoothed_[r] = median(window);
  }
  ++steps_;
  if (mode_ == BalanceMode::kStatic && steps_ < kWarmupSteps) return false;
  const std::vector<int64_t> next = best_deal();
  // Static deals once, at the end of the warm-up; dynamic when the gain passes the hysteresis.
  const bool better =
      mode_ == BalanceMode::kStatic || makespan(next) < (1.0 - kHysteresis) * makespan(counts_);
  if (next == counts_ || !better) return false;
  counts_ = next;
  ++changes_;
  return true;
}

std::string ShardDeal::str() const {
  std::string s;
  for (int64_t c : counts_) {
    if (!s.empty()) s += '/';
    s += std::to_string(c);
  }
  return s;
}

nlohmann::json ShardDeal::save() const {
  return {{"mode", name_of(mode_)},
          {"micro_shards", shards_},
          {"shards_per_rank", counts_},
          {"seconds_per_shard", smoothed_},
          {"recent_seconds_per_shard", recent_},
          {"steps", steps_},
          {"changes", changes_}};
}

bool ShardDeal::load(const nlohmann::json& state) {
  const std::optional<BalanceMode> mode =
      value_of<BalanceMode>(state.at("mode").get<std::string>());
  if (!mode) return false;
  const ShardDeal saved(*mode, static_cast<int>(state.at("shards_per_rank").size()),
                        state.at("micro_shards").get<int64_t>());
  std::vector<int64_t> counts = state.at("shards_per_rank").get<std::vector<int64_t>>();
  std::vector<double> smoothed = state.at("seconds_per_shard").get<std::vector<double>>();
  std::vector<std::vector<double>> recent =
      state.at("recent_seconds_per_shard").get<std::vector<std::vector<double>>>();
  int64_t dealt = 0;
  for (int64_t c : counts) dealt += c < 1 ? shards_ + 1 : c;  // every rank holds one at least
  if (saved.mode_ != mode_ || saved.shards_ != shards_ || counts.size() != counts_.size() ||
      dealt != shards_ || smoothed.size() != recent.size() ||
      (!smoothed.empty() && smoothed.size() != counts.size()))
    return false;
  counts_ = std::move(counts);
  smoothed_ = std::move(smoothed);
  recent_ = std::move(recent);
  steps_ = state.at("steps").get<int64_t>();
  changes_ = state.at("changes").get<int64_t>();
  return true;
}

}  // namespace tessel::parallel
