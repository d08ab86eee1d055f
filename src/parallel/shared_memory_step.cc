#include "shared_memory_step.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "grad_syncs.h"
#include "tessel/core/clock.h"

namespace tessel::parallel {

std::unique_ptr<SharedMemoryStep> SharedMemoryStep::make(nn::Model& model, const Units& units,
                                                         comm::Communicator& dp,
                                                         comm::Communicator& workers,
                                                         uint64_t seed) {
  // Each part a whole number of 64-byte lines, so every part stays aligned.
  const size_t bytes = static_cast<size_t>((units.span.size() + 15) / 16 * 16) * sizeof(float);
  std::shared_ptr<void> block = dp.shared_memory(bytes * static_cast<size_t>(1 + dp.size()));
  if (!block) return nullptr;  // ranks on several hosts: messages
  auto step = std::unique_ptr<SharedMemoryStep>(new SharedMemoryStep(units, dp, workers, block));
  // Layout: [parameters][gradients of rank 0]...[gradients of rank n-1].
  char* base = static_cast<char*>(block.get());
  step->params_ = reinterpret_cast<float*>(base);
  for (int r = 0; r < dp.size(); ++r)
    step->rank_grads_.push_back(reinterpret_cast<float*>(base + bytes * static_cast<size_t>(1 + r)));
  if (dp.rank() == 0)
    for (const Unit& u : units.list) model.init_values(step->values(u.range), u.range, seed);
  auto view = [&](float* p) {  // a tensor over the block's memory
    Tensor t = Tensor::empty({std::max<int64_t>(units.span.size(), 1)});
    t.storage().rebind(p, block);
    return t;
  };
  model.bind_values(units.span, view(step->params_));
  model.bind_grads(units.span, view(step->rank_grads_[static_cast<size_t>(dp.rank())]));
  // This rank's share of the block: the parameters are held once by the host's ranks.
  if ((step->ledger_ = current_ledger())) {
    step->charged_params_ = static_cast<int64_t>(bytes) / dp.size();
    step->charged_grads_ = static_cast<int64_t>(bytes);
    step->ledger_->charge(MemCategory::kParameters, step->charged_params_);
    step->ledger_->charge(MemCategory::kGradients, step->charged_grads_);
  }
  step->sync_ranks();  // rank 0's initial values are in place before anyone reads them
  return step;
}

SharedMemoryStep::SharedMemoryStep(const Units& units, comm::Communicator& dp,
                                   comm::Communicator& workers, std::shared_ptr<void> block)
    : units_(units), dp_(dp), workers_(workers), block_(std::move(block)) {
  for (const Unit& u : units.list) {
    held_.push_back(u.range);
    if (!units.own(u).empty()) owned_.push_back(units.own(u));
  }
  update_ = owned_;
}

SharedMemoryStep::~SharedMemoryStep() {
  if (ledger_) {
    ledger_->release(MemCategory::kParameters, charged_params_);
    ledger_->release(MemCategory::kGradients, charged_grads_);
  }
}

void SharedMemoryStep::sync_ranks() {
  const double t0 = now_seconds();
  std::atomic_thread_fence(std::memory_order_seq_cst);  // mpi: other processes read our stores
  dp_.barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  barrier_s_ += now_seconds() - t0;
}

void SharedMemoryStep::reduce() {
  sync_ranks();  // every rank's gradient is complete (and nobody reads parameters any more)
  const double t0 = now_seconds();
  float* own = rank_grads_[static_cast<size_t>(dp_.rank())] - units_.span.lo;
  constexpr int64_t kChunk = 4096;  // stays in L1 while every rank's part is added
  for (const nn::Range& piece : owned_)
    for (int64_t lo = piece.lo; lo < piece.hi; lo += kChunk) {
      const int64_t hi = std::min(piece.hi, lo + kChunk);
      for (int r = 0; r < dp_.size(); ++r) {
        if (r == dp_.rank()) continue;
        const float* __restrict src = rank_grads_[static_cast<size_t>(r)] - units_.span.lo;
        float* __restrict dst = own;
        for (int64_t i = lo; i < hi; ++i) dst[i] += src[i];
      }
      bytes_ += 4.0 * static_cast<double>((hi - lo) * (dp_.size() - 1));
    }
  reduce_s_ += now_seconds() - t0;
}

double SharedMemoryStep::sq_norm() { return pieces_sq_norm(units_, *this, &workers_); }

float* SharedMemoryStep::grads(nn::Range r) {
  return rank_grads_[static_cast<size_t>(dp_.rank())] + (r.lo - units_.span.lo);
}

void SharedMemoryStep::clear() {
  std::memset(rank_grads_[static_cast<size_t>(dp_.rank())], 0,
              static_cast<size_t>(units_.span.size()) * sizeof(float));
}

float* SharedMemoryStep::values(nn::Range r) { return params_ + (r.lo - units_.span.lo); }

void SharedMemoryStep::update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync) {
  const double t0 = now_seconds();
  opt.step(segments(sync), lr, grad_scale);
  optimizer_s_ += now_seconds() - t0;
  sync_ranks();  // every piece of the shared parameters is updated
  refresh_working(false);
}

void SharedMemoryStep::copy_values(nn::Range r, float* dst) {
  std::memcpy(dst, values(r), static_cast<size_t>(r.size()) * sizeof(float));
}

void SharedMemoryStep::take_stats(RankStats& s) {
  s.comm_exposed_s += reduce_s_ + barrier_s_;
  s.optimizer_s += optimizer_s_;
  s.comm_bytes += bytes_;
  reduce_s_ = barrier_s_ = optimizer_s_ = bytes_ = 0;
}

}  // namespace tessel::parallel
