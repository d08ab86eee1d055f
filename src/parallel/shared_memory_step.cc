#include "shared_memory_step.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "grad_syncs.h"
#include "tessel/core/clock.h"

namespace tessel::parallel {
namespace {

// A tensor over shared memory p (kept alive by block).
Tensor view(float* p, int64_t n, const std::shared_ptr<void>& block) {
  Tensor t = Tensor::empty({std::max<int64_t>(n, 1)});
  t.storage().rebind(p, block);
  return t;
}

}  // namespace

// ---- SharedGradSync ----

size_t SharedGradSync::arena_bytes(const Units& units) {
  return static_cast<size_t>((units.span.size() + 15) / 16 * 16) * sizeof(float);
}

std::unique_ptr<SharedGradSync> SharedGradSync::make(nn::Model& model, const Units& units,
                                                     comm::Communicator& dp,
                                                     comm::Communicator& workers) {
  std::shared_ptr<void> block =
      dp.shared_memory(arena_bytes(units) * static_cast<size_t>(dp.size()));
  if (!block) return nullptr;  // ranks on several hosts: messages
  return std::unique_ptr<SharedGradSync>(
      new SharedGradSync(model, units, dp, workers, std::move(block), 0, true));
}

SharedGradSync::SharedGradSync(nn::Model& model, const Units& units, comm::Communicator& dp,
                               comm::Communicator& workers, std::shared_ptr<void> block, size_t at,
                               bool whole)
    : units_(units), dp_(dp), workers_(workers), block_(std::move(block)), whole_(whole) {
  const size_t bytes = arena_bytes(units);
  char* base = static_cast<char*>(block_.get()) + at;
  for (int r = 0; r < dp.size(); ++r)
    rank_grads_.push_back(reinterpret_cast<float*>(base + bytes * static_cast<size_t>(r)));
  for (const Unit& u : units.list)
    if (!units.own(u).empty()) shards_.push_back(units.own(u));
  model.bind_grads(units.span,
                   view(rank_grads_[static_cast<size_t>(dp.rank())], units.span.size(), block_));
  if ((ledger_ = current_ledger())) {  // this rank's arena
    charged_grads_ = static_cast<int64_t>(bytes);
    ledger_->charge(MemCategory::kGradients, charged_grads_);
  }
}

SharedGradSync::~SharedGradSync() {
  if (ledger_) ledger_->release(MemCategory::kGradients, charged_grads_);
}

void SharedGradSync::sync_ranks() {
  const double t0 = now_seconds();
  std::atomic_thread_fence(std::memory_order_seq_cst);  // mpi: other processes read our stores
  dp_.barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  barrier_s_ += now_seconds() - t0;
}

void SharedGradSync::reduce() {
  sync_ranks();  // every rank's gradient is complete
  const double t0 = now_seconds();
  const size_t me = static_cast<size_t>(dp_.rank()), n = rank_grads_.size();
  float* own = rank_grads_[me] - units_.span.lo;
  constexpr int64_t kChunk = 4096;  // stays in L1 while every rank's part is added
  for (const nn::Range& shard : shards_)
    for (int64_t lo = shard.lo; lo < shard.hi; lo += kChunk) {
      const int64_t hi = std::min(shard.hi, lo + kChunk);
      for (size_t r = 0; r < n; ++r) {
        if (r == me) continue;
        const float* __restrict src = rank_grads_[r] - units_.span.lo;
        float* __restrict dst = own;
        for (int64_t i = lo; i < hi; ++i) dst[i] += src[i];
      }
      for (size_t r = 0; r < n && whole_; ++r)  // stage 0: the sum into every arena
        if (r != me)
          std::memcpy(rank_grads_[r] - units_.span.lo + lo, own + lo,
                      static_cast<size_t>(hi - lo) * sizeof(float));
      bytes_ +=
          4.0 * static_cast<double>((hi - lo) * static_cast<int64_t>(n - 1) * (whole_ ? 2 : 1));
    }
  reduce_s_ += now_seconds() - t0;
  if (whole_) sync_ranks();  // every shard's sum is in every arena
}

double SharedGradSync::sq_norm() { return shards_sq_norm(units_, *this, &workers_, true); }

float* SharedGradSync::grads(nn::Range r) {
  return rank_grads_[static_cast<size_t>(dp_.rank())] + (r.lo - units_.span.lo);
}

void SharedGradSync::clear() {
  std::memset(rank_grads_[static_cast<size_t>(dp_.rank())], 0,
              static_cast<size_t>(units_.span.size()) * sizeof(float));
}

void SharedGradSync::take_stats(RankStats& s) {
  s.comm_exposed_s += reduce_s_ + barrier_s_;
  s.comm_bytes += bytes_;
  reduce_s_ = barrier_s_ = bytes_ = 0;
}

// ---- SharedMemoryStep ----

std::unique_ptr<SharedMemoryStep> SharedMemoryStep::make(nn::Model& model, const Units& units,
                                                         comm::Communicator& dp,
                                                         comm::Communicator& workers,
                                                         uint64_t seed) {
  // Layout: [parameters][gradients of rank 0]...[gradients of rank n-1].
  std::shared_ptr<void> block =
      dp.shared_memory(arena_bytes(units) * static_cast<size_t>(1 + dp.size()));
  if (!block) return nullptr;  // ranks on several hosts: messages
  // The values' view first: the arena-sized buffer Tensor::empty charges for a moment (freed by
  // the rebind) is then not held on top of this step's gradients and parameters (measured peak
  // at start-up on 4 ranks: 2.25 arenas, above the steps' 1.5 plus activations).
  const Tensor values = view(static_cast<float*>(block.get()), units.span.size(), block);
  auto step = std::unique_ptr<SharedMemoryStep>(
      new SharedMemoryStep(model, units, dp, workers, std::move(block)));
  if (dp.rank() == 0)
    for (const Unit& u : units.list) model.init_values(step->values(u.range), u.range, seed);
  model.bind_values(units.span, values);
  step->sync_ranks();  // rank 0's initial values are in place before anyone reads them
  return step;
}

SharedMemoryStep::SharedMemoryStep(nn::Model& model, const Units& units, comm::Communicator& dp,
                                   comm::Communicator& workers, std::shared_ptr<void> block)
    : SharedGradSync(model, units, dp, workers, block, arena_bytes(units), false),
      params_(static_cast<float*>(block.get())) {
  for (const Unit& u : units.list) held_.push_back(u.range);
  owned_ = update_ = shards_;
  // This rank's share of the parameters, held once by the host's ranks.
  if (ledger_) {
    charged_params_ = static_cast<int64_t>(arena_bytes(units)) / dp.size();
    ledger_->charge(MemCategory::kParameters, charged_params_);
  }
}

SharedMemoryStep::~SharedMemoryStep() {
  if (ledger_) ledger_->release(MemCategory::kParameters, charged_params_);
}

float* SharedMemoryStep::values(nn::Range r) { return params_ + (r.lo - units_.span.lo); }

void SharedMemoryStep::update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
                              int64_t) {
  const double t0 = now_seconds();
  opt.step(segments(sync), lr, grad_scale);
  optimizer_s_ += now_seconds() - t0;
  sync_ranks();  // every shard of the shared parameters is updated
  refresh_working(false);
}

void SharedMemoryStep::copy_values(nn::Range r, float* dst) {
  std::memcpy(dst, values(r), static_cast<size_t>(r.size()) * sizeof(float));
}

void SharedMemoryStep::take_stats(RankStats& s) {
  SharedGradSync::take_stats(s);
  s.optimizer_s += optimizer_s_;
  optimizer_s_ = 0;
}

}  // namespace tessel::parallel
