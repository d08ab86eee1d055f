// DataLoader: global per-epoch shuffle, contiguous rank slices of each global batch, and a
// prefetch thread.
//
// Terms: the *order* of an epoch is a permutation of the dataset's indices; *batch b* is the
// order positions [b * batch, min((b+1) * batch, size)), of length len; the *slice* of rank r of
// n is rows [floor(r * len / n), floor((r+1) * len / n)) of that batch. A rank's slice may be
// empty when len < n.
//
// Threading: one worker per started epoch loads batches first_batch, first_batch + 1, ... into
// queue_, waiting on cv_ while `prefetch` batches are queued; next() waits on the same cv_ while
// the queue is empty. order_ is written only while no worker runs (start_epoch stops the old one
// first), so the worker reads it without the lock. A failed load is stored in worker_error_ and
// rethrown by next() once the batches loaded before it have been handed out.
#include "tessel/data/loader.h"

#include <algorithm>
#include <numeric>

#include "tessel/core/rng.h"
#include "tessel/core/trace.h"

namespace tessel::data {

std::vector<int64_t> epoch_order(int64_t size, uint64_t seed, int64_t epoch, bool shuffle) {
  if (size < 0) throw InvalidArgument(str("data loader: dataset size must be >= 0, got ", size));
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  // Fisher-Yates from the back; step i draws j uniform in [0, i] from 64 random bits by
  // multiply-shift (bias below 2^-32 for any size that fits in memory).
  CounterRng rng(seed, mix_stream(RngPurpose::kShuffle, static_cast<uint64_t>(epoch)));
  for (int64_t i = size - 1; i > 0; --i) {
    uint64_t k = 2 * static_cast<uint64_t>(i);
    uint64_t r = (static_cast<uint64_t>(rng.bits(k)) << 32) | rng.bits(k + 1);
    auto j = static_cast<int64_t>(
        (static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (!dataset_)
    throw InvalidArgument("data loader: dataset is null; build one with make_datasets");
  if (options_.batch < 1)
    throw InvalidArgument(str("data loader: batch must be >= 1, got ", options_.batch,
                              "; set the batch size to a positive number"));
  if (options_.prefetch < 0)
    throw InvalidArgument(str("data loader: prefetch must be >= 0, got ", options_.prefetch,
                              "; use 0 to load synchronously"));
  if (options_.slice_count < 1 || options_.slice_rank < 0 ||
      options_.slice_rank >= options_.slice_count)
    throw InvalidArgument(str("data loader: slice must satisfy 0 <= rank < count, got rank ",
                              options_.slice_rank, " of ", options_.slice_count));
  epoch_ = -1;  // no epoch started yet; next() starts epoch 0
}

DataLoader::~DataLoader() {
  try {
    stop_worker();
  } catch (...) {
    // join() only throws for a thread that is not joinable, which stop_worker rules out.
  }
}

int64_t DataLoader::batches_per_epoch() const {
  const int64_t size = dataset_->size(), batch = options_.batch;
  return options_.drop_last ? size / batch : (size + batch - 1) / batch;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  const int64_t total = batches_per_epoch();
  if (epoch < 0) throw InvalidArgument(str("data loader: epoch must be >= 0, got ", epoch));
  if (first_batch < 0 || first_batch > total)
    throw InvalidArgument(str("data loader: first batch must be in [0, ", total, "], got ",
                              first_batch,
                              "; the checkpoint was made with another batch size or dataset"));
  stop_worker();
  order_ = epoch_order(dataset_->size(), options_.seed, epoch, options_.shuffle);
  epoch_ = epoch;
  next_index_ = first_batch;
  queue_.clear();
  stop_ = false;
  worker_done_ = false;
  worker_error_ = nullptr;
  if (options_.prefetch > 0)
    worker_ = std::thread(&DataLoader::worker_loop, this, epoch, first_batch, scoped_tracer());
}

bool DataLoader::next(Batch& out) {
  if (epoch_ < 0) start_epoch(0);
  if (options_.prefetch == 0) {
    if (next_index_ >= batches_per_epoch()) return false;
    out = load(order_, epoch_, next_index_);
    ++next_index_;
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !queue_.empty() || worker_done_; });
  if (!queue_.empty()) {
    out = std::move(queue_.front());
    queue_.pop_front();
    ++next_index_;
    cv_.notify_all();  // the worker may be waiting for room
    return true;
  }
  if (worker_error_) std::rethrow_exception(worker_error_);
  return false;
}

Batch DataLoader::batch_at(int64_t epoch, int64_t index) {
  if (epoch < 0) throw InvalidArgument(str("data loader: epoch must be >= 0, got ", epoch));
  if (index < 0 || index >= batches_per_epoch())
    throw InvalidArgument(
        str("data loader: batch index must be in [0, ", batches_per_epoch(), "), got ", index));
  if (epoch != random_epoch_) {
    random_order_ = epoch_order(dataset_->size(), options_.seed, epoch, options_.shuffle);
    random_epoch_ = epoch;
  }
  return load(random_order_, epoch, index);
}

Batch DataLoader::load(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const {
  TraceSpan span("load batch", "data");
  if (TraceArgs* args = span.args()) args->num("batch", static_cast<double>(index));
  const int64_t start = index * options_.batch;
  const int64_t len = std::min(options_.batch, dataset_->size() - start);
  const int64_t r = options_.slice_rank, n = options_.slice_count;
  const int64_t lo = r * len / n, hi = (r + 1) * len / n;

  const Shape in_shape = dataset_->input_shape(), label_shape = dataset_->label_shape();
  Shape xs{hi - lo}, ys{hi - lo};
  xs.insert(xs.end(), in_shape.begin(), in_shape.end());
  ys.insert(ys.end(), label_shape.begin(), label_shape.end());
  Batch b;
  b.x = Tensor::empty(std::move(xs), dataset_->input_dtype());
  b.y = Tensor::empty(std::move(ys), dataset_->label_dtype());
  b.epoch = epoch;
  b.index = index;
  b.first_sample = start + lo;
  b.global_size = len;

  const size_t x_bytes = static_cast<size_t>(shape_numel(in_shape)) * dtype_size(b.x.dtype());
  const int64_t y_numel = shape_numel(label_shape);
  char* x = static_cast<char*>(b.x.raw());
  int32_t* y = static_cast<int32_t*>(b.y.raw());  // f32 targets travel as their 4 bytes
  constexpr int64_t kAhead = 8;  // samples prefetched ahead of the one being copied
  const int64_t rows = hi - lo;
  auto sample = [&](int64_t k) { return order[static_cast<size_t>(start + lo + k)]; };
  for (int64_t k = 0; k < std::min(rows, kAhead); ++k) dataset_->prefetch(sample(k));
  for (int64_t k = 0; k < rows; ++k) {
    if (k + kAhead < rows) dataset_->prefetch(sample(k + kAhead));
    dataset_->get(sample(k), x + static_cast<size_t>(k) * x_bytes, y + k * y_numel);
  }
  return b;
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void DataLoader::worker_loop(int64_t epoch, int64_t first_batch, Tracer* tracer) {
  set_trace_thread_name("prefetch");
  TraceScope trace(tracer);  // the rank's tracer, on this thread's own row
  try {
    const int64_t total = batches_per_epoch();
    const size_t room = static_cast<size_t>(options_.prefetch);
    for (int64_t b = first_batch; b < total; ++b) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queue_.size() < room; });
        if (stop_) return;
      }
      Batch batch = load(order_, epoch, b);  // outside the lock: this is the slow part
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(batch));
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    worker_error_ = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(mu_);
  worker_done_ = true;
  cv_.notify_all();
}

}  // namespace tessel::data
