#include "tessel/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
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
  int local = world.size();  // ranks as threads: all in this process
  if (std::string(world.backend()) == "mpi") {
    const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    local = v ? std::max(1, std::atoi(v)) : 1;
  }
  return static_cast<int>(std::thread::hardware_concurrency()) >= 2 * local;
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
  if (spec_.bucket_mb <= 0)
    throw InvalidArgument(str("config: ddp.bucket_mb must be > 0, got ", spec_.bucket_mb));
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
  // Buckets in reverse block order: the last blocks' gradients are ready first.
  const int64_t bucket_elems = std::max<int64_t>(1, static_cast<int64_t>(spec_.bucket_mb * (1 << 20) / 4));
  const auto& entries = model.grads().entries();
  Bucket cur{0, -1, -1, {}};
  for (size_t i = model.num_blocks(); i-- > 0;) {
    auto [first, last] = model.block_parameters(i);
    if (first == last) continue;
    int64_t lo = entries[first].offset;
    int64_t hi = entries[last - 1].offset + shape_numel(entries[last - 1].shape);
    // Close the bucket before a block that would overflow it, so the blocks already in it
    // start reducing while this one still runs backward. A block is never split: its
    // gradients are all ready at the same moment.
    if (cur.hi >= 0 && cur.hi - lo > bucket_elems) {
      buckets_.push_back(cur);
      cur = Bucket{0, -1, -1, {}};
    }
    if (cur.hi < 0) cur.hi = hi;
    cur.lo = lo;
    cur.first_block = i;
  }
  if (cur.hi >= 0) buckets_.push_back(cur);
}

DataParallel::~DataParallel() = default;

std::string DataParallel::layout() const {
  return world_ ? str("dp=", world_size()) : std::string("single");
}

void DataParallel::on_start() {
  check_parameters(0);
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

void DataParallel::collect_shard() {
  const Tensor& g = model_.grads().flat();
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
    deterministic_reduce();
    reduce_s_ += now_seconds() - t0;
    return;
  }
  if (!world_) return;
  const double backward_end = now_seconds();
  if (!overlap_) {  // one blocking all-reduce of the whole gradient on this thread
    world_->allreduce(model_.grads().flat().data<float>(),
                      static_cast<size_t>(model_.grads().numel()), comm::ElemType::kF32);
    bytes_ += 4.0 * static_cast<double>(model_.grads().numel());
    exposed_s_ += now_seconds() - backward_end;
    return;
  }
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
  world_->reduce_scatter(g, g + shard_lo_, shard_counts_, comm::ElemType::kF32);
  const double t1 = now_seconds();
  double norm_s = 0;  // the global-norm all-reduce inside update() is communication too
  update(opt, lr, clip_norm, shard_lo_, shard_hi_, [this, &norm_s](double* sq) {
    const double t = now_seconds();
    world_->allreduce(sq, 1, comm::ElemType::kF64);
    norm_s += now_seconds() - t;
  });
  optimizer_seconds_ -= norm_s;
  const double t2 = now_seconds();
  world_->allgather(p + shard_lo_, p, shard_counts_, comm::ElemType::kF32);
  exposed_s_ += (t1 - t0) + norm_s + (now_seconds() - t2);
  bytes_ += 4.0 * static_cast<double>(model_.params().numel());
}

void DataParallel::consolidate(optim::Optimizer& opt) {
  if (!sharded_) return;
  for (auto& [name, t] : opt.state())
    world_->allgather(t.data<float>() + shard_lo_, t.data<float>(), shard_counts_,
                      comm::ElemType::kF32);
}

void DataParallel::deterministic_reduce() {
  Tensor g = model_.grads().flat();
  const size_t n = static_cast<size_t>(g.numel());
  const size_t nb = buckets_.size();
  // 1. Agree on every bucket's largest |g| over all shards of all ranks, and the shard count.
  std::vector<float> maxes = shard_max_;
  maxes.resize(nb, 0.0f);
  shard_max_.assign(nb, 0.0f);
  double shards_total = static_cast<double>(num_shards_);
  if (world_) {
    world_->allreduce(maxes.data(), nb, comm::ElemType::kF32, comm::ReduceOp::kMax);
    world_->allreduce(&shards_total, 1, comm::ElemType::kF64, comm::ReduceOp::kSum);
  }
  // 2. Quantise at scale 2^e with |sum| < 2^62, sum exactly in int64, all-reduce the integers.
  std::vector<int64_t> acc(n, 0);
  std::vector<double> scale(nb, 1.0);
  for (size_t b = 0; b < nb; ++b) {
    if (!(maxes[b] > 0) || !std::isfinite(maxes[b])) {
      if (!std::isfinite(maxes[b]))
        throw Error("data parallel: non-finite gradient in deterministic mode; lower optim.lr");
      continue;
    }
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
  if (world_) {
    world_->allreduce(acc.data(), n, comm::ElemType::kI64, comm::ReduceOp::kSum);
    bytes_ += 8.0 * static_cast<double>(n);
  }
  float* out = g.data<float>();
  std::fill(out, out + n, 0.0f);
  for (size_t b = 0; b < nb; ++b)
    for (int64_t i = buckets_[b].lo; i < buckets_[b].hi; ++i)
      out[i] = static_cast<float>(static_cast<double>(acc[i]) / scale[b]);
  num_shards_ = 0;
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
                      {"overlap", overlap_}};
  exposed_s_ = overlapped_s_ = reduce_s_ = bytes_ = optimizer_seconds_ = 0;
  return m;
}

}  // namespace tessel::parallel
