#include "tessel/infer/metrics.h"

#include <algorithm>
#include <sstream>

namespace tessel::infer {
namespace {

std::vector<double> powers_of_two(int64_t up_to) {
  std::vector<double> b;
  for (int64_t v = 1; v < up_to; v *= 2) b.push_back(static_cast<double>(v));
  b.push_back(static_cast<double>(up_to));
  return b;
}

std::string number(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

void write_histogram(std::ostringstream& os, const std::string& name, const std::string& help,
                     const Histogram& h) {
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    cumulative += h.counts[i];
    os << name << "_bucket{le=\"" << number(h.bounds[i]) << "\"} " << cumulative << "\n";
  }
  os << name << "_bucket{le=\"+Inf\"} " << h.count << "\n";
  os << name << "_sum " << number(h.sum) << "\n" << name << "_count " << h.count << "\n";
}

void write_scalar(std::ostringstream& os, const std::string& name, const char* type,
                  const std::string& help, double value) {
  os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n"
     << name << " " << number(value) << "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}

void Histogram::add(double value) {
  const size_t i =
      static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) - bounds.begin());
  ++counts[i];
  sum += value;
  ++count;
}

ServeMetrics::ServeMetrics(int64_t max_batch, int workers)
    : workers_(workers),
      latency_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}),
      batch_rows_(powers_of_two(max_batch)) {}

void ServeMetrics::request(const std::string& route, int status, double seconds) {
  std::lock_guard lock(mu_);
  ++requests_[{route, status}];
  if (route == "/v1/predict" || route == "/v2/models/{name}/infer") latency_.add(seconds);
}

void ServeMetrics::batch(int64_t rows) {
  std::lock_guard lock(mu_);
  batch_rows_.add(static_cast<double>(rows));
  rows_ += rows;
  ++batches_;
}

void ServeMetrics::queue(int64_t requests, int64_t rows) {
  std::lock_guard lock(mu_);
  queue_requests_ = requests;
  queue_rows_ = rows;
}

std::string ServeMetrics::prometheus() const {
  std::lock_guard lock(mu_);
  std::ostringstream os;
  os << "# HELP tessel_requests_total HTTP requests answered, by route and status code.\n"
        "# TYPE tessel_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    os << "tessel_requests_total{route=\"" << key.first << "\",code=\"" << key.second << "\"} " << n
       << "\n";
  write_histogram(os, "tessel_request_duration_seconds",
                  "Time from reading an infer or predict request to its answer.", latency_);
  write_histogram(os, "tessel_batch_rows", "Rows per batch a worker ran.", batch_rows_);
  write_scalar(os, "tessel_rows_total", "counter", "Rows answered.", static_cast<double>(rows_));
  write_scalar(os, "tessel_batches_total", "counter", "Batches run.",
               static_cast<double>(batches_));
  write_scalar(os, "tessel_queue_requests", "gauge", "Requests waiting for a worker.",
               static_cast<double>(queue_requests_));
  write_scalar(os, "tessel_queue_rows", "gauge", "Rows waiting for a worker.",
               static_cast<double>(queue_rows_));
  write_scalar(os, "tessel_workers", "gauge", "Worker ranks running batches.", workers_);
  return os.str();
}

}  // namespace tessel::infer
