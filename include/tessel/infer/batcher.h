// Batcher: dynamic batching for tessel serve. Requests (one or more rows each) wait in one
// queue in arrival order; each worker thread takes the oldest requests, up to max_batch rows,
// once that many rows wait or the oldest request has waited max_wait (what waits is shared
// among the idle workers, so that every core works while requests wait), runs them as one batch
// and answers each request with its own rows' results. A request is never split across
// batches. submit() refuses a request when max_queue rows wait already. A request's answer goes
// to its callback on the worker's thread, so no thread waits for it. close() stops taking
// requests, lets the workers answer every one already queued, and joins them. Thread safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/infer/generate.h"
#include "tessel/infer/metrics.h"
#include "tessel/tensor/tensor.h"

namespace tessel::infer {

// One request's rows: x [n, ...] for a classifier, or n prompts for a gpt model.
struct Request {
  Tensor x;
  std::vector<Prompt> prompts;
  int64_t rows() const { return x.defined() ? x.dim(0) : static_cast<int64_t>(prompts.size()); }
};

// A batch's outputs, row by row in the order of its requests: a classifier's outputs [rows, C]
// (logits; a regression's value), or a gpt's texts.
struct BatchOutput {
  Tensor values;
  std::vector<std::string> texts;
  int64_t rows() const {
    return values.defined() ? values.dim(0) : static_cast<int64_t>(texts.size());
  }
};

// One request's rows of its batch's outputs, [first, first + count): values, not JSON records
// (a record per row, as a document, made of tens of allocations, was the cost of an answer).
struct BatchRows {
  const BatchOutput* batch = nullptr;
  int64_t first = 0, count = 0;
  int64_t width() const { return batch->values.dim(1); }
  const float* values(int64_t i) const {
    return batch->values.data<float>() + (first + i) * width();
  }
  const std::string& text(int64_t i) const { return batch->texts[static_cast<size_t>(first + i)]; }
};

using RunBatch = std::function<BatchOutput(int worker, const std::vector<const Request*>&)>;

// A request's answer: its rows (valid during the call), or the exception its batch threw (then
// no rows).
using Answer = std::function<void(const BatchRows& rows, std::exception_ptr error)>;

struct BatchOptions {
  int64_t max_batch = 64;
  double max_wait_s = 0;
  int64_t max_queue = 4096;
};

class Batcher {
 public:
  // Starts `workers` threads; run(w, batch) runs on worker w's thread.
  Batcher(const BatchOptions& options, int workers, RunBatch run, ServeMetrics& metrics);
  ~Batcher();  // close()
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues the request; `answer` gets its rows' records once its batch has run. Returns false
  // (and never calls `answer`) when the queue is full or the batcher is closed.
  bool submit(Request request, Answer answer);
  void close();

 private:
  struct Pending {
    Request request;
    Answer answer;
    double arrival = 0;
  };
  void work(int worker);
  std::vector<Pending> take_batch(std::unique_lock<std::mutex>& lock);

  BatchOptions options_;
  RunBatch run_;
  ServeMetrics& metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  int64_t queued_rows_ = 0;
  int idle_ = 0;         // workers in take_batch
  bool handed_ = false;  // a worker left waiting rows to an idle one: take them at once
  bool closed_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tessel::infer
