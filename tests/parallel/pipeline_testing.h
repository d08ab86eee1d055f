// Test-only pipeline blocks with a fixed simulated compute time: forward copies its input and
// sleeps forward_ms, backward copies the gradient and sleeps 2 x forward_ms -- split (zb-h1)
// into forward_ms for B and forward_ms for W. Sleeping instead of
// computing keeps the stages' times independent of how many cores the machine has, so the
// measured pipeline bubble can be compared with the model (P-1)/(m+P-1).
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include "tessel/comm/communicator.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/model.h"

namespace tessel::testing {

class SleepBlock : public nn::Module {
 public:
  explicit SleepBlock(double forward_ms) : forward_ms_(forward_ms) {}
  std::string kind() const override { return "sleep"; }
  Tensor forward(const Tensor& x, const nn::Context&, nn::Cache* cache) override {
    Tensor y = nn::output(cache, 0, x.shape(), x.dtype());
    y.copy_from(x);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(forward_ms_));
    return y;
  }
  Tensor backward(const Tensor& dy, nn::Cache& cache) override {
    Tensor dx = cache.scratch(0, dy.shape(), dy.dtype());
    dx.copy_from(dy);
    std::this_thread::sleep_for(
        std::chrono::duration<double, std::milli>((defer_weights_ ? 1 : 2) * forward_ms_));
    return dx;
  }
  void backward_weights(nn::Cache&) override {
    if (defer_weights_)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(forward_ms_));
  }
  // One unused parameter, so that every stage owns a range to update.
  std::vector<nn::Parameter*> parameters() override { return {&w_}; }
  double forward_flops(int64_t batch) const override { return 1e6 * forward_ms_ * batch; }

 private:
  double forward_ms_;
  nn::Parameter w_{"w", {1}, nn::Init::kZeros, 0, {}, {}, {}};
};

// blocks SleepBlocks of forward_ms each on inputs [rows, width].
inline std::unique_ptr<nn::Model> sleep_model(int blocks, double forward_ms) {
  auto m = std::make_unique<nn::Model>();
  for (int i = 0; i < blocks; ++i)
    m->add("sleep" + std::to_string(i), std::make_unique<SleepBlock>(forward_ms));
  m->finalize();
  return m;
}

}  // namespace tessel::testing
