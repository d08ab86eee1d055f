// ServeMetrics: what tessel serve counts, rendered in the Prometheus text format (version
// 0.0.4) for GET /metrics: requests answered by route and status code, request latency and
// batch sizes as histograms, rows served, and the queue's depth. Thread safe (one mutex; a
// request touches it twice).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace tessel::infer {

// Cumulative buckets over fixed upper bounds, plus sum and count.
struct Histogram {
  explicit Histogram(std::vector<double> bounds);
  void add(double value);
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // per bound, not cumulative; the last entry: above every bound
  double sum = 0;
  int64_t count = 0;
};

class ServeMetrics {
 public:
  explicit ServeMetrics(int64_t max_batch, int workers);

  void request(const std::string& route, int status, double seconds);
  void batch(int64_t rows);
  void queue(int64_t requests, int64_t rows);
  std::string prometheus() const;

 private:
  mutable std::mutex mu_;
  int workers_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  Histogram latency_, batch_rows_;
  int64_t rows_ = 0, batches_ = 0, queue_requests_ = 0, queue_rows_ = 0;
};

}  // namespace tessel::infer
