#include "grad_syncs.h"

#include <algorithm>
#include <cstring>

#include "tessel/core/clock.h"
#include "tessel/ops/cpu.h"
#include "tessel/optim/schedule.h"

namespace tessel::parallel {

namespace {

constexpr size_t kBucketsInFlight = 2;  // ShardSync: reduce-scatters in flight (buffers held)

uint32_t label_of(int unit) { return static_cast<uint32_t>(unit + 1); }

bool several(const comm::Communicator* c) { return c != nullptr && c->size() > 1; }

Tensor gradient_memory(int64_t n, MemCategory category, DType type = DType::kF32) {
  MemoryScope scope(category);
  return Tensor::zeros({std::max<int64_t>(n, 1)}, type);
}

int64_t largest_unit(const Units& units) {
  int64_t n = 0;
  for (const Unit& u : units.list) n = std::max(n, u.range.size());
  return n;
}

// Every unit whose last backward pass ended with block b, for each local block from the last
// to the first: the order in which a full backward pass completes them.
template <typename F>
void for_units_in_completion_order(const Units& units, F&& f) {
  for (size_t b = units.used_by_block.size(); b-- > 0;)
    for (int u : units.completed_by(b)) f(u);
}

}  // namespace

double pieces_sq_norm(const Units& units, GradSync& sync, comm::Communicator* workers) {
  double sq = 0;
  for (const Unit& u : units.list) {
    const nn::Range own = units.own(u);
    if (!own.empty()) sq += sum_squares_counted(units, own, sync.grads(own));
  }
  if (several(workers)) workers->allreduce(&sq, 1, comm::ElemType::kF64);
  return sq;
}

// ---- Messages ----

Tensor Messages::take(const float* src, int64_t n) {
  if (free_.empty()) free_.push_back(gradient_memory(numel_, MemCategory::kComm, type_));
  Tensor t = std::move(free_.back());
  free_.pop_back();
  ops::convert(t.raw(), type_, src, DType::kF32, n);
  return t;
}

// ---- ArenaSync ----

ArenaSync::ArenaSync(nn::Model& model, const Units& units, Reduction reduction,
                     comm::Communicator* dp, comm::Communicator* workers, bool async,
                     DType message)
    : units_(units),
      reduction_(reduction),
      dp_(several(dp) ? dp : nullptr),
      workers_(workers),
      arena_(gradient_memory(units.span.size(), MemCategory::kGradients)),
      buckets_(async),
      launched_(units.list.size(), 0),
      messages_(message, largest_unit(units)) {
  model.bind_grads(units.span, arena_);
}

void ArenaSync::launch(int unit) {
  launched_[static_cast<size_t>(unit)] = 1;
  const Unit& u = units_.list[static_cast<size_t>(unit)];
  float* g = arena_.data<float>() + (u.range.lo - units_.span.lo);
  comm::CallOptions call;
  call.label = label_of(unit);
  const size_t count = static_cast<size_t>(u.range.size());
  if (messages_.used()) {
    launch_message(u, g, call);
    return;
  }
  if (reduction_ == Reduction::kAllReduce) {
    buckets_.launch(
        [this, g, count, call](bool async) {
          if (async) return dp_->allreduce_async(g, count, comm::ElemType::kF32, comm::ReduceOp::kSum, call);
          dp_->allreduce(g, count, comm::ElemType::kF32, comm::ReduceOp::kSum, call);
          return comm::Work();
        },
        4.0 * static_cast<double>(count));
    return;
  }
  // In place: this rank's piece of the bucket becomes the sum of everyone's piece.
  float* own = g + (units_.own(u).lo - u.range.lo);
  buckets_.launch(
      [this, g, own, &u, call](bool async) {
        if (async)
          return dp_->reduce_scatter_async(g, own, u.counts, comm::ElemType::kF32,
                                           comm::ReduceOp::kSum, call);
        dp_->reduce_scatter(g, own, u.counts, comm::ElemType::kF32, comm::ReduceOp::kSum, call);
        return comm::Work();
      },
      4.0 * static_cast<double>(count));
}

// A 16-bit message: the unit's gradient rounded into it, all-reduced (or reduce-scattered in
// place) as the message type, widened back into the arena (this rank's piece only after a
// reduce-scatter).
void ArenaSync::launch_message(const Unit& u, float* g, const comm::CallOptions& call) {
  const int64_t n = u.range.size();
  Tensor msg = messages_.take(g, n);
  const comm::ElemType elem = comm::elem_type(messages_.type());
  const nn::Range own = units_.own(u);
  const bool all = reduction_ == Reduction::kAllReduce;
  void* own_block = msg.view(own.lo - u.range.lo, {own.size()}).raw();
  auto start = [this, msg, own_block, all, elem, n, &u, call](bool async) {
    if (all && async) return dp_->allreduce_async(msg.raw(), static_cast<size_t>(n), elem, comm::ReduceOp::kSum, call);
    if (all) dp_->allreduce(msg.raw(), static_cast<size_t>(n), elem, comm::ReduceOp::kSum, call);
    if (!all && async)
      return dp_->reduce_scatter_async(msg.raw(), own_block, u.counts, elem, comm::ReduceOp::kSum, call);
    if (!all) dp_->reduce_scatter(msg.raw(), own_block, u.counts, elem, comm::ReduceOp::kSum, call);
    return comm::Work();
  };
  auto done = [this, msg, own_block, all, g, n, own, lo = u.range.lo]() mutable {
    if (all)
      ops::convert(g, DType::kF32, msg.raw(), messages_.type(), n);
    else
      ops::convert(g + (own.lo - lo), DType::kF32, own_block, messages_.type(), own.size());
    messages_.give(std::move(msg));
  };
  buckets_.launch(start, static_cast<double>(dtype_size(messages_.type()) * static_cast<size_t>(n)),
                  done);
}

void ArenaSync::on_block(nn::Phase phase, size_t block, bool last) {
  if (!dp_ || phase != nn::Phase::kAfterBackward) return;
  buckets_.poll();
  if (last)
    for (int u : units_.completed_by(block)) launch(u);
}

void ArenaSync::reduce() {
  if (!dp_) return;
  // A rank without rows in this step (a short last batch) still takes part in every bucket.
  for_units_in_completion_order(units_, [this](int u) {
    if (!launched_[static_cast<size_t>(u)]) launch(u);
  });
  buckets_.wait_all();
  std::fill(launched_.begin(), launched_.end(), 0);
}

double ArenaSync::sq_norm() { return pieces_sq_norm(units_, *this, workers_); }

float* ArenaSync::grads(nn::Range r) {
  return arena_.data<float>() + (r.lo - units_.span.lo);
}

void ArenaSync::clear() { arena_.zero_(); }

void ArenaSync::take_stats(RankStats& s) { buckets_.take_stats(s); }

// ---- ShardSync ----

ShardSync::ShardSync(nn::Model& model, const Units& units, comm::Communicator& dp,
                     comm::Communicator* workers, bool async, bool per_pass, DType message)
    : model_(model),
      units_(units),
      dp_(dp),
      workers_(workers),
      shard_(gradient_memory(units.shard_numel, MemCategory::kGradients)),
      open_(units.list.size()),
      launched_(units.list.size(), 0),
      bucket_numel_(largest_unit(units)),
      per_pass_(per_pass),
      buckets_(async),
      messages_(message, bucket_numel_) {}

void ShardSync::open(int unit) {
  Tensor& b = open_[static_cast<size_t>(unit)];
  if (b.defined()) return;  // already open in this pass (several blocks read the unit)
  if (free_.empty()) {
    free_.push_back(gradient_memory(bucket_numel_, MemCategory::kComm));
  } else {
    free_.back().zero_();
  }
  b = std::move(free_.back());
  free_.pop_back();
  model_.bind_grads(units_.list[static_cast<size_t>(unit)].range, b);
}

void ShardSync::launch(int unit) {
  const size_t k = static_cast<size_t>(unit);
  // The step's first reduction of the unit lands straight in the shard; later passes
  // (accumulation) reduce in place and are added to it.
  const bool first = !launched_[k];
  launched_[k] = 1;
  const Unit& u = units_.list[k];
  model_.bind_grads(u.range, Tensor());  // nothing may write the bucket while it travels
  Tensor bucket = std::move(open_[k]);
  const nn::Range own = units_.own(u);
  float* shard = shard_.data<float>() + u.shard_offset;
  // The message: the f32 bucket, or its 16-bit rounding (train.precision). The first
  // reduction of an f32 bucket lands in the shard; the rest reduce in place, this rank's
  // block then widened (16-bit) and added (later passes) into the shard.
  Tensor msg = messages_.used() ? messages_.take(bucket.data<float>(), u.range.size()) : bucket;
  const DType type = msg.dtype();
  const comm::ElemType elem = comm::elem_type(type);
  void* in = msg.raw();
  void* out = first && !messages_.used() ? static_cast<void*>(shard)
                                         : msg.view(own.lo - u.range.lo, {own.size()}).raw();
  comm::CallOptions call;
  call.label = label_of(unit);
  auto start = [this, in, out, elem, &u, call](bool async) {
    if (async) return dp_.reduce_scatter_async(in, out, u.counts, elem, comm::ReduceOp::kSum, call);
    dp_.reduce_scatter(in, out, u.counts, elem, comm::ReduceOp::kSum, call);
    return comm::Work();
  };
  // Done: the piece joins the shard, the buffers go back to their pools.
  auto done = [this, bucket, msg, first, shard, out, type, n = own.size()]() mutable {
    if (out != shard) {
      if (first) {
        ops::convert(shard, DType::kF32, out, type, n);
      } else if (type == DType::kF32) {
        float* __restrict dst = shard;
        const float* __restrict src = static_cast<const float*>(out);
        for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
      } else {
        ops::accumulate(shard, out, n, type);
      }
    }
    if (messages_.used()) messages_.give(std::move(msg));
    free_.push_back(std::move(bucket));
  };
  buckets_.launch(start, static_cast<double>(dtype_size(type)) * static_cast<double>(u.range.size()),
                  done, kBucketsInFlight);
}

void ShardSync::on_block(nn::Phase phase, size_t block, bool last) {
  if (phase == nn::Phase::kBeforeBackward) {
    for (int u : units_.used_by_block[block])
      if (units_.list[static_cast<size_t>(u)].last_user == block) open(u);
  } else if (phase == nn::Phase::kAfterBackward) {
    buckets_.poll();
    if (per_pass_ || last)
      for (int u : units_.completed_by(block)) launch(u);
  }
}

void ShardSync::reduce() {
  for_units_in_completion_order(units_, [this](int u) {
    if (launched_[static_cast<size_t>(u)]) return;
    open(u);  // a rank without rows: a zero bucket, so that every rank takes part
    launch(u);
  });
  buckets_.wait_all();
}

double ShardSync::sq_norm() { return pieces_sq_norm(units_, *this, workers_); }

float* ShardSync::grads(nn::Range r) {
  for (const Unit& u : units_.list) {
    const nn::Range own = units_.own(u);
    if (r.lo >= own.lo && r.hi <= own.hi && !own.empty())
      return shard_.data<float>() + u.shard_offset + (r.lo - own.lo);
  }
  throw Error(str("zero: range [", r.lo, ", ", r.hi, ") is not this rank's gradient shard "
                  "(this is a bug)"));
}

void ShardSync::clear() {  // every unit's first reduction of the next step overwrites its piece
  std::fill(launched_.begin(), launched_.end(), 0);
}

void ShardSync::take_stats(RankStats& s) { buckets_.take_stats(s); }

// ---- ExactSync ----

namespace {
std::vector<nn::Range> ranges_of(const Units& units) {
  std::vector<nn::Range> out;
  for (const Unit& u : units.list) out.push_back(u.range);
  return out;
}
}  // namespace

ExactSync::ExactSync(nn::Model& model, const Units& units, const Units& scale_buckets,
                     comm::Communicator& dp, comm::Communicator& workers, bool overflow_ok)
    : model_(model),
      units_(units),
      dp_(dp),
      workers_(workers),
      arena_(gradient_memory(units.span.size(), MemCategory::kGradients)),
      sum_(units.span, ranges_of(scale_buckets), overflow_ok) {
  model.bind_grads(units.span, arena_);
}

void ExactSync::on_block(nn::Phase phase, size_t block, bool last) {
  (void)last;  // every pass is one micro-shard, kept apart
  if (phase != nn::Phase::kAfterBackward) return;
  for (int k : units_.completed_by(block)) {
    const nn::Range r = units_.list[static_cast<size_t>(k)].range;
    float* g = arena_.data<float>() + (r.lo - units_.span.lo);
    sum_.collect(r, g);
    std::memset(g, 0, static_cast<size_t>(r.size()) * sizeof(float));
  }
}

void ExactSync::reduce() {
  const double t0 = now_seconds();
  bytes_ += sum_.reduce(arena_.data<float>(), ranges_of(units_), workers_, dp_);
  reduce_s_ += now_seconds() - t0;
}

double ExactSync::sq_norm() {
  // Block by block in model order, each block summed whole by one rank (dp rank 0 of its
  // stage): the same additions in the same order in every layout.
  std::vector<double> sums(model_.num_blocks(), 0.0);
  if (dp_.rank() == 0)
    for (size_t b = 0; b < sums.size(); ++b) {
      const nn::Range r = model_.block_range(b);
      if (r.empty() || r.lo < units_.span.lo || r.hi > units_.span.hi) continue;
      bool local = false;
      for (const Unit& u : units_.list) local = local || (r.lo >= u.range.lo && r.hi <= u.range.hi);
      if (local) sums[b] = sum_squares_counted(units_, r, grads(r));
    }
  workers_.allreduce(sums.data(), sums.size(), comm::ElemType::kF64);
  double sq = 0;
  for (double s : sums) sq += s;
  return sq;
}

float* ExactSync::grads(nn::Range r) {
  return arena_.data<float>() + (r.lo - units_.span.lo);
}

void ExactSync::clear() { arena_.zero_(); }

void ExactSync::take_stats(RankStats& s) {
  s.comm_exposed_s += reduce_s_;
  s.comm_bytes += bytes_;
  reduce_s_ = bytes_ = 0;
}

}  // namespace tessel::parallel
