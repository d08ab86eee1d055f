// DataLoader: turns a Dataset into batches for one epoch at a time. The order is a global
// shuffle keyed by (seed, epoch), identical for every rank; batch b of an epoch covers the
// positions [b * batch, min((b+1) * batch, size)) of that order (the last batch may be short
// unless drop_last). A rank reads its contiguous slice [lo, hi) of each global batch, so data
// parallelism never changes which samples form a global batch. A background thread prefetches
// the next batches; it blocks (never spins) while the queue is full.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "tessel/core/trace.h"
#include "tessel/data/dataset.h"

namespace tessel::data {

struct Batch {
  Tensor x;  // [n, input_shape...] of the dataset's input dtype
  Tensor y;  // [n, label_shape...] of the dataset's label dtype (i32, or f32 targets)
  int64_t epoch = 0;
  int64_t index = 0;         // batch index within the epoch
  int64_t first_sample = 0;  // position in the epoch order of row 0 (keys dropout)
  int64_t global_size = 0;   // rows in the whole global batch (all ranks)
};

struct LoaderOptions {
  int64_t batch = 128;  // global batch size
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int prefetch = 2;  // batches queued ahead; 0 reads synchronously
  // This rank's share of each global batch, as a fraction range [slice_lo, slice_hi) of the
  // rows cut contiguously: rank r of n uses [r/n, (r+1)/n). Default: the whole batch.
  int slice_rank = 0;
  int slice_count = 1;
};

// The permutation of [0, size) used in `epoch` (identity when !shuffle).
std::vector<int64_t> epoch_order(int64_t size, uint64_t seed, int64_t epoch, bool shuffle);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  // Starts (or restarts) epoch `epoch` at batch `first_batch` (for resume).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // Next batch of the current epoch; false when the epoch is done.
  bool next(Batch& out);
  // Batch `index` of `epoch` read now (random access, for batches handed out out of order):
  // the rows next() gives for it. Independent of start_epoch()/next(); not thread safe.
  Batch batch_at(int64_t epoch, int64_t index);

 private:
  Batch load(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const;
  void stop_worker();
  void worker_loop(int64_t epoch, int64_t first_batch, Tracer* tracer);  // records into tracer

  std::shared_ptr<const Dataset> dataset_;
  LoaderOptions options_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0;
  int64_t next_index_ = 0;
  std::vector<int64_t> random_order_;  // batch_at()'s epoch order
  int64_t random_epoch_ = -1;

  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> queue_;
  bool stop_ = false;
  bool worker_done_ = false;
  std::exception_ptr worker_error_;
};

}  // namespace tessel::data
