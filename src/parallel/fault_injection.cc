#include "fault_injection.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/trace.h"

namespace tessel::parallel {

namespace {

class SlowSync final : public GradSync {
 public:
  SlowSync(GradSync& inner, double delay_ms) : inner_(inner), delay_ms_(delay_ms) {}

  void reduce() override {
    {
      TraceSpan span("debug.delay_ms", "debug");
      const double t0 = now_seconds();
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
      slept_s_ += now_seconds() - t0;
    }
    inner_.reduce();
  }
  double sq_norm() override { return inner_.sq_norm(); }
  float* grads(nn::Range r) override { return inner_.grads(r); }
  void clear() override { inner_.clear(); }
  void take_stats(RankStats& s) override {
    s.delay_s += slept_s_;
    slept_s_ = 0;
    inner_.take_stats(s);
  }
  std::vector<float> save_state() override { return inner_.save_state(); }
  void load_state(const std::vector<float>& state) override { inner_.load_state(state); }

 private:
  GradSync& inner_;
  double delay_ms_;
  double slept_s_ = 0;  // since the last take_stats()
};

// Last among the engine's hooks: each block's time is measured after the other hooks' work
// before it, and the sleep follows their work after it.
class SlowBlocks final : public BlockHooks {
 public:
  SlowBlocks(double factor, int64_t from_step, const int64_t& step)
      : factor_(factor), from_step_(from_step), step_(step) {}

  void on_block(nn::Phase phase, size_t block, bool last) override {
    (void)block, (void)last;
    if (step_ < from_step_) return;
    if (phase == nn::Phase::kBeforeForward || phase == nn::Phase::kBeforeBackward) {
      start_ = now_seconds();
      return;
    }
    TraceSpan span("debug.slow_factor", "debug");
    std::this_thread::sleep_for(
        std::chrono::duration<double>((factor_ - 1) * (now_seconds() - start_)));
  }

 private:
  double factor_;
  int64_t from_step_;
  const int64_t& step_;
  double start_ = 0;
};

class OverflowLoss final : public nn::Loss {
 public:
  OverflowLoss(nn::Loss& inner, std::vector<int64_t> steps, const int64_t& step)
      : inner_(inner), steps_(std::move(steps)), step_(step) {}

  nn::LossValue forward(const Tensor& output, const Tensor& targets) override {
    return inner_.forward(output, targets);
  }
  Tensor backward(float dloss) override {
    const bool inject = std::find(steps_.begin(), steps_.end(), step_) != steps_.end();
    return inner_.backward(inject ? std::numeric_limits<float>::infinity() : dloss);
  }

 private:
  nn::Loss& inner_;
  std::vector<int64_t> steps_;
  const int64_t& step_;
};

}  // namespace

std::unique_ptr<GradSync> slow_sync(const ParallelSpec& spec, int rank, GradSync& sync) {
  if (spec.slow_rank != rank || spec.delay_ms <= 0) return nullptr;
  return std::make_unique<SlowSync>(sync, spec.delay_ms);
}

std::unique_ptr<BlockHooks> slow_blocks(const ParallelSpec& spec, int rank, const int64_t& step) {
  if (spec.slow_rank != rank || spec.slow_factor <= 1) return nullptr;
  return std::make_unique<SlowBlocks>(spec.slow_factor, spec.slow_from_step, step);
}

std::unique_ptr<nn::Loss> overflow_loss(const ParallelSpec& spec, int rank, nn::Loss& loss,
                                        const int64_t& step) {
  if (spec.overflow_steps.empty() || spec.overflow_rank != rank ||
      spec.precision != Precision::kFp16)
    return nullptr;
  return std::make_unique<OverflowLoss>(loss, spec.overflow_steps, step);
}

}  // namespace tessel::parallel
