// Trainer::rank_metrics: the per-rank part of every epoch record and of summary.json.
#include <algorithm>
#include <vector>

#include "tessel/train/trainer.h"

namespace tessel::train {

using nlohmann::json;

// Per-rank measurements of the epoch, gathered on every rank: compute and communication time,
// bytes, buckets, and load balance (max / mean training-step time and the slowest rank).
json Trainer::rank_metrics(double train_seconds) {
  json m = strategy_->take_metrics();
  const double exposed = m["comm_exposed_seconds"].get<double>();
  std::vector<double> step_time = strategy_->gather(train_seconds);
  std::vector<double> compute = strategy_->gather(train_seconds - exposed);
  std::vector<double> exposed_all = strategy_->gather(exposed);
  std::vector<double> overlapped = strategy_->gather(m["comm_overlapped_seconds"].get<double>());
  std::vector<double> optimizer = strategy_->gather(m["optimizer_seconds"].get<double>());
  double max_t = 0, sum_t = 0, max_compute = 0;
  int slowest = 0;
  for (size_t r = 0; r < step_time.size(); ++r) {
    sum_t += step_time[r];
    if (step_time[r] > max_t) max_t = step_time[r], slowest = static_cast<int>(r);
    max_compute = std::max(max_compute, compute[r]);
  }
  json ranks = json::array();
  for (size_t r = 0; r < step_time.size(); ++r)
    ranks.push_back({{"rank", r}, {"step_seconds", step_time[r]}, {"compute_seconds", compute[r]},
                     {"optimizer_seconds", optimizer[r]},
                     {"comm_exposed_seconds", exposed_all[r]},
                     {"comm_overlapped_seconds", overlapped[r]},
                     // Waiting for the slowest rank shows up as exposed communication time on
                     // the faster ranks: estimated as the compute gap to the slowest.
                     {"wait_for_slowest_seconds", max_compute - compute[r]}});
  json out = {{"per_rank", ranks},
              {"load_balance_max_over_mean", sum_t > 0 ? max_t * step_time.size() / sum_t : 1.0},
              {"slowest_rank", slowest}};
  for (auto& [key, value] : m.items())  // the layout's own measurements
    if (key != "comm_exposed_seconds" && key != "comm_overlapped_seconds" &&
        key != "optimizer_seconds")
      out[key] = value;
  return out;
}

}  // namespace tessel::train
