#include "grad_syncs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tessel/core/clock.h"
#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

constexpr size_t kBucketsInFlight = 2;  // ShardSync: reduce-scatters in flight (buffers held)

bool several(const comm::Communicator* c) { return c != nullptr && c->size() > 1; }

Buckets::Spec with_scatter(Buckets::Spec spec, bool scatter) {
  spec.scatter = scatter;
  return spec;
}

// Whether this rank's shards count in the norm: with shard groups, on the first group only.
bool first_group(const Buckets::Spec& spec) {
  return spec.across == nullptr || spec.across->rank() == 0;
}

// Every unit whose last backward pass ended with block b, for each local block from the last
// to the first: the order in which a full backward pass completes them.
template <typename F>
void for_units_in_completion_order(const Units& units, F&& f) {
  for (size_t b = units.used_by_block.size(); b-- > 0;)
    for (int u : units.completed_by(b)) f(u);
}

}  // namespace

double shards_sq_norm(const Units& units, GradSync& sync, comm::Communicator* workers,
                      bool counted) {
  double sq = 0;
  for (const Unit& u : units.list) {
    const nn::Range own = units.own(u);
    if (counted && !own.empty()) sq += sum_squares_counted(units, own, sync.grads(own));
  }
  if (several(workers)) workers->allreduce(&sq, 1, comm::ElemType::kF64);
  return sq;
}

// ---- ArenaSync ----

ArenaSync::ArenaSync(nn::Model& model, const Units& units, Reduction reduction,
                     comm::Communicator* dp, comm::Communicator* workers, Buckets::Spec spec)
    : units_(units),
      dp_(several(dp) ? dp : nullptr),
      workers_(workers),
      counted_(first_group(spec)),
      arena_(flat_zeros(units.span.size(), MemCategory::kGradients)),
      buckets_(model, units, dp_, with_scatter(spec, reduction == Reduction::kReduceScatter)),
      launched_(units.list.size(), 0) {
  model.bind_grads(units.span, arena_);
}

// All-reduced, or reduced in place so that this rank's shard of the unit becomes the sum of
// everyone's shard.
void ArenaSync::launch(int unit) {
  launched_[static_cast<size_t>(unit)] = 1;
  const Unit& u = units_.list[static_cast<size_t>(unit)];
  buckets_.launch(unit, arena_.kernel_data<float>() + (u.range.lo - units_.span.lo));
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

double ArenaSync::sq_norm() { return shards_sq_norm(units_, *this, workers_, counted_); }

float* ArenaSync::grads(nn::Range r) {
  return arena_.kernel_data<float>() + (r.lo - units_.span.lo);
}

void ArenaSync::clear() { arena_.zero_(); }

void ArenaSync::take_stats(RankStats& s) { buckets_.take_stats(s); }

// ---- ShardSync ----

ShardSync::ShardSync(nn::Model& model, const Units& units, comm::Communicator& dp,
                     comm::Communicator* workers, bool per_pass, Buckets::Spec spec)
    : model_(model),
      units_(units),
      workers_(workers),
      counted_(first_group(spec)),
      shard_(flat_zeros(units.shard_numel, MemCategory::kGradients)),
      pool_(largest_unit(units)),
      open_(units.list.size()),
      launched_(units.list.size(), 0),
      per_pass_(per_pass),
      buckets_(model, units, &dp, with_scatter(spec, true)) {}

void ShardSync::open(int unit) {
  Tensor& b = open_[static_cast<size_t>(unit)];
  if (b.defined()) return;  // already open in this pass (several blocks read the unit)
  b = pool_.take(DType::kF32);
  b.zero_();
  model_.bind_grads(units_.list[static_cast<size_t>(unit)].range, b);
}

void ShardSync::launch(int unit) {
  const size_t k = static_cast<size_t>(unit);
  // The step's first reduction of the unit lands in the shard; later passes (accumulation)
  // are added to it.
  const bool first = !launched_[k];
  launched_[k] = 1;
  const Unit& u = units_.list[k];
  model_.bind_grads(u.range, Tensor());  // nothing may write the bucket while it travels
  Tensor bucket = std::move(open_[k]);
  const nn::Range own = units_.own(u);
  // Done: this rank's summed shard joins shard_ (on the rank's device: a copy or the
  // accumulate kernel), the buffer goes back to the pool.
  auto done = [this, bucket, first, offset = u.shard_offset, at = own.lo - u.range.lo,
               n = own.size()]() mutable {
    if (n > 0) {
      const Tensor summed = bucket.view(at, {n});
      Tensor kept = shard_.view(offset, {n});
      if (first)
        kept.copy_from(summed);
      else
        ops::accumulate(kept.kernel_data<float>(), summed.kernel_data<float>(), n, DType::kF32);
    }
    pool_.give(std::move(bucket));
  };
  buckets_.launch(unit, bucket.kernel_data<float>(), done, kBucketsInFlight);
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

double ShardSync::sq_norm() { return shards_sq_norm(units_, *this, workers_, counted_); }

float* ShardSync::grads(nn::Range r) {
  for (const Unit& u : units_.list) {
    const nn::Range own = units_.own(u);
    if (r.lo >= own.lo && r.hi <= own.hi && !own.empty())
      return shard_.kernel_data<float>() + u.shard_offset + (r.lo - own.lo);
  }
  throw Error(str("zero: range [", r.lo, ", ", r.hi,
                  ") is not this rank's gradient shard "
                  "(this is a bug)"));
}

void ShardSync::clear() {  // every unit's first reduction of the next step overwrites its shard
  std::fill(launched_.begin(), launched_.end(), 0);
}

void ShardSync::take_stats(RankStats& s) { buckets_.take_stats(s); }

// ---- ExactSync ----

std::vector<nn::Range> ranges_of(const Units& units) {
  std::vector<nn::Range> out;
  for (const Unit& u : units.list) out.push_back(u.range);
  return out;
}

ExactSync::ExactSync(nn::Model& model, const Units& units, const Units& scale_buckets,
                     comm::Communicator& dp, comm::Communicator& workers, bool overflow_ok,
                     comm::DeviceCollectives* device)
    : model_(model),
      units_(units),
      dp_(dp),
      workers_(workers),
      device_(device),
      arena_(flat_zeros(units.span.size(), MemCategory::kGradients)),
      sum_(units.span, ranges_of(scale_buckets), overflow_ok) {
  model.bind_grads(units.span, arena_);
}

void ExactSync::on_block(nn::Phase phase, size_t block, bool last) {
  (void)last;  // every pass is one micro-shard, kept apart
  if (phase != nn::Phase::kAfterBackward) return;
  for (int k : units_.completed_by(block)) {
    const nn::Range r = units_.list[static_cast<size_t>(k)].range;
    sum_.collect(r, grads(r));  // on the arena's device
  }
}

void ExactSync::reduce() {
  const double t0 = now_seconds();
  bytes_ += sum_.reduce(arena_.kernel_data<float>(), ranges_of(units_), workers_, dp_, device_);
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
  return arena_.kernel_data<float>() + (r.lo - units_.span.lo);
}

void ExactSync::clear() { arena_.zero_(); }

void ExactSync::take_stats(RankStats& s) {
  s.comm_exposed_s += reduce_s_;
  s.comm_bytes += bytes_;
  reduce_s_ = bytes_ = 0;
}

// ---- ExactPushSync ----

ExactPushSync::ExactPushSync(nn::Model& model, const Units& units, comm::Communicator& workers,
                             bool overflow_ok)
    : units_(units),
      workers_(workers),
      arena_(flat_zeros(model.arena_numel(), MemCategory::kGradients)),
      sum_({0, model.arena_numel()}, ranges_of(units), overflow_ok) {
  model.bind_grads({0, model.arena_numel()}, arena_);
}

void ExactPushSync::collect(size_t block) {
  for (int u : units_.completed_by(block)) {
    const nn::Range r = units_.list[static_cast<size_t>(u)].range;
    sum_.collect(r, arena_.data<float>() + r.lo);
  }
}

void ExactPushSync::reduce() {
  const double t0 = now_seconds();
  scales_ = sum_.quantise(workers_, workers_);
  reduce_s_ += now_seconds() - t0;
}

double ExactPushSync::sq_norm() {
  const bool overflow =
      std::any_of(scales_.begin(), scales_.end(), [](double s) { return std::isnan(s); });
  return overflow ? std::numeric_limits<double>::infinity() : 0.0;
}

void ExactPushSync::take_stats(RankStats& s) {
  s.comm_exposed_s += reduce_s_;
  reduce_s_ = 0;
}

}  // namespace tessel::parallel
