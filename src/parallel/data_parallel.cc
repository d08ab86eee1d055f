#include "tessel/parallel/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::parallel {

namespace {

// Overlap needs a core for each rank's progress thread besides the one computing; on a machine
// without spare cores the progress threads steal time from compute and cost more than they hide
// (measured on 2 cores: 2 workers ran fashion_mlp 20-50% faster without overlap).
bool resolve_overlap(const std::string& mode, const comm::Communicator& world) {
  if (mode == "on") return true;
  if (mode == "off") return false;
  if (mode != "auto")
    throw InvalidArgument(str("config: ddp.overlap must be auto, on or off, got '", mode, "'"));
  return static_cast<int>(std::thread::hardware_concurrency()) >= 2 * world.ranks_on_host();
}

// FNV-1a over the parameter bytes, 8 bytes at a time: cheap enough to run every few hundred
// steps, and any differing bit changes it.
int64_t checksum(const Tensor& t) {
  const auto* p = static_cast<const uint64_t*>(t.raw());
  size_t words = t.nbytes() / 8;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < words; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

}  // namespace

DataParallel::DataParallel(const ParallelSpec& spec, comm::Communicator* world, nn::Model& model)
    : Strategy(model, spec), world_(world && world->size() > 1 ? world : nullptr) {
  if (world_) overlap_ = resolve_overlap(spec_.overlap, *world_);
  sharded_ = world_ && !overlap_ && !spec_.deterministic;
  if (sharded_) {
    // Shard boundaries on 64-byte lines, so neighbouring ranks never share a cache line.
    const int64_t n = model.params().numel(), p = world_size();
    int64_t prev = 0;
    for (int r = 1; r <= p; ++r) {
      int64_t b = r == p ? n : (n * r / p) / 16 * 16;
      shard_counts_.push_back(static_cast<size_t>(b - prev));
      if (r - 1 == rank()) shard_lo_ = prev, shard_hi_ = b;
      prev = b;
    }
  }
  std::vector<GradBucket> buckets = make_buckets(model, spec_.bucket_mb);
  for (const GradBucket& g : buckets) buckets_.push_back(Bucket{g.first_block, g.lo, g.hi, {}});
  if (spec_.deterministic) exact_.emplace(std::move(buckets));
}

DataParallel::~DataParallel() = default;

std::string DataParallel::layout() const {
  return world_ ? str("dp=", world_size()) : std::string("single");
}

void DataParallel::on_start() {
  check_parameters(0);  // before sharing: afterwards every rank would see rank 0's values
  if (sharded_ && spec_.shared_memory) share_memory();
}

void DataParallel::share_memory() {
  const int n = world_size();
  const size_t bytes = static_cast<size_t>(model_.params().numel()) * sizeof(float);
  shared_ = world_->shared_memory(bytes * static_cast<size_t>(1 + n));
  if (!shared_) return;  // ranks on several hosts: messages
  // Layout: [parameters][gradients of rank 0]...[gradients of rank n-1]; arenas are whole
  // 64-byte lines, so every part stays aligned.
  char* base = static_cast<char*>(shared_.get());
  model_.params().rebind(base, shared_, rank() == 0);
  model_.grads().rebind(base + bytes * static_cast<size_t>(1 + rank()), shared_, true);
  for (int r = 0; r < n; ++r)
    rank_grads_.push_back(reinterpret_cast<const float*>(base + bytes * static_cast<size_t>(1 + r)));
  sync_shared();  // rank 0's parameters are in place before anyone reads them
}

void DataParallel::sync_shared() {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // mpi: other processes read our stores
  world_->barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void DataParallel::reduce_shared_shard() {
  float* own = model_.grads().flat().data<float>();
  constexpr int64_t kChunk = 4096;  // stays in L1 while every rank's part is added
  for (int64_t lo = shard_lo_; lo < shard_hi_; lo += kChunk) {
    const int64_t hi = std::min(shard_hi_, lo + kChunk);
    for (int r = 0; r < world_size(); ++r) {
      if (r == rank()) continue;
      const float* __restrict src = rank_grads_[r];
      float* __restrict dst = own;
      for (int64_t i = lo; i < hi; ++i) dst[i] += src[i];
    }
  }
}

void DataParallel::check_parameters(int64_t step) {
  if (!world_) return;
  std::vector<double> sums = gather(static_cast<double>(checksum(model_.params().flat())));
  std::string differ;
  for (int r = 1; r < world_size(); ++r)
    if (sums[r] != sums[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    throw Error(str("data parallel: parameters differ across ranks at step ", step, ": rank(s) ",
                    differ, " differ from rank 0; every rank must start from the same seed and "
                    "checkpoint (this is a bug if they did)"));
}

void DataParallel::begin_backward(bool sync) {
  sync_ = sync;
  for (Bucket& b : buckets_) {
    b.launched = false;
    b.done_time = 0;
  }
}

void DataParallel::launch(Bucket& b) {
  b.launched = true;
  b.launch_time = now_seconds();
  b.work = world_->allreduce_async(model_.grads().flat().data<float>() + b.lo,
                                   static_cast<size_t>(b.hi - b.lo), comm::ElemType::kF32);
  bytes_ += 4.0 * static_cast<double>(b.hi - b.lo);
}

void DataParallel::after_block_backward(size_t block) {
  if (!world_ || !sync_ || !overlap_ || spec_.deterministic) return;
  double now = now_seconds();
  for (Bucket& b : buckets_) {
    if (b.launched && b.done_time == 0 && b.work.done()) b.done_time = now;
    if (!b.launched && b.first_block == block) launch(b);
  }
}

void DataParallel::collect_shard() { exact_->collect(model_.grads().flat()); }

void DataParallel::step(optim::Optimizer& opt, float lr, float clip_norm, int64_t step) {
  if (sharded_) {
    sharded_step(opt, lr, clip_norm);
  } else {
    reduce();
    // Every rank holds the global gradient: each clips and updates all parameters identically.
    update(opt, lr, clip_norm, 0, model_.params().numel(), nullptr);
  }
  if (spec_.check_every > 0 && (step + 1) % spec_.check_every == 0) check_parameters(step + 1);
}

void DataParallel::reduce() {
  if (spec_.deterministic) {
    double t0 = now_seconds();
    Tensor g = model_.grads().flat();
    bytes_ += exact_->reduce(g, world_, world_);
    reduce_s_ += now_seconds() - t0;
    return;
  }
  if (!world_) return;  // without overlap, several ranks take sharded_step() instead
  const double backward_end = now_seconds();
  for (Bucket& b : buckets_) {
    if (!b.launched) launch(b);  // e.g. a backward that skipped the hooks
    if (b.done_time == 0 && b.work.done()) b.done_time = backward_end;
  }
  for (Bucket& b : buckets_) b.work.wait();
  const double end = now_seconds();
  exposed_s_ += end - backward_end;
  for (Bucket& b : buckets_) {
    double done = b.done_time > 0 ? b.done_time : backward_end;
    overlapped_s_ += std::max(0.0, std::min(done, backward_end) - b.launch_time);
  }
}

void DataParallel::sharded_step(optim::Optimizer& opt, float lr, float clip_norm) {
  float* g = model_.grads().flat().data<float>();
  float* p = model_.params().flat().data<float>();
  const double t0 = now_seconds();
  if (shared_) {
    sync_shared();  // every rank's gradient is complete (and nobody reads parameters any more)
    reduce_shared_shard();
  } else {
    world_->reduce_scatter(g, g + shard_lo_, shard_counts_, comm::ElemType::kF32);
  }
  const double t1 = now_seconds();
  double norm_s = 0;  // the global-norm all-reduce inside update() is communication too
  update(opt, lr, clip_norm, shard_lo_, shard_hi_, [this, &norm_s](double* sq) {
    const double t = now_seconds();
    world_->allreduce(sq, 1, comm::ElemType::kF64);
    norm_s += now_seconds() - t;
  });
  optimizer_seconds_ -= norm_s;
  const double t2 = now_seconds();
  if (shared_)
    sync_shared();  // every shard of the shared parameters is updated
  else
    world_->allgather(p + shard_lo_, p, shard_counts_, comm::ElemType::kF32);
  exposed_s_ += (t1 - t0) + norm_s + (now_seconds() - t2);
  // Messages: one all-reduce's worth; shared memory: the shards read from other ranks.
  bytes_ += shared_ ? 4.0 * static_cast<double>((shard_hi_ - shard_lo_) * (world_size() - 1))
                    : 4.0 * static_cast<double>(model_.params().numel());
}

void DataParallel::consolidate(optim::Optimizer& opt) {
  if (!sharded_) return;
  for (auto& [name, t] : opt.state())
    world_->allgather(t.data<float>() + shard_lo_, t.data<float>(), shard_counts_,
                      comm::ElemType::kF32);
}

void DataParallel::sum(double* values, int n) {
  if (world_) world_->allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64);
}

void DataParallel::max(double* values, int n) {
  if (world_)
    world_->allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64, comm::ReduceOp::kMax);
}

std::vector<double> DataParallel::gather(double value) {
  std::vector<double> all(static_cast<size_t>(world_size()), value);
  if (world_) world_->allgather(&value, all.data(), 1, comm::ElemType::kF64);
  return all;
}

nlohmann::json DataParallel::take_metrics() {
  nlohmann::json m = {{"comm_exposed_seconds", exposed_s_ + reduce_s_},
                      {"comm_overlapped_seconds", overlapped_s_},
                      {"optimizer_seconds", optimizer_seconds_},
                      {"allreduce_bytes_per_rank", bytes_},
                      {"buckets", buckets_.size()},
                      {"shared_memory", shared_ != nullptr},
                      {"overlap", overlap_}};
  exposed_s_ = overlapped_s_ = reduce_s_ = bytes_ = optimizer_seconds_ = 0;
  return m;
}

}  // namespace tessel::parallel
