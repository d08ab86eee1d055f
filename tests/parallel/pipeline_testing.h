// Test-only pipeline blocks with a fixed simulated compute time: forward copies its input and
// sleeps forward_ms, backward copies the gradient and sleeps 2 x forward_ms -- split (zb-h1)
// into forward_ms for B and forward_ms for W. Sleeping instead of
// computing keeps the stages' times independent of how many cores the machine has, so the
// measured pipeline bubble can be compared with the model (P-1)/(m+P-1). And the small
// configs the pipeline tests train (config_for).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/config/config.h"
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

// The pipeline tests' configs: `model` (mlp, cnn or gpt) small, 20 steps, then `extra` keys.
inline train::Config config_for(const std::string& model, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"train.max_steps=20", "train.prefetch=0",
                                "checkpoint.every_epochs=0", "model.kind=" + model};
  if (model == "mlp") {
    for (const char* s : {"data.kind=synthetic", "data.samples=600", "data.features=12",
                          "data.classes=4", "data.test_fraction=0.2", "train.batch=24",
                          "optim.lr=0.1", "model.hidden=[32,16]", "model.dropout=0.2"})
      o.push_back(s);
  } else if (model == "cnn") {
    for (const char* s : {"data.kind=synthetic", "train.batch=16", "optim.lr=0.05",
                          "model.channels=[4,8]", "model.kernel=3", "model.fc_hidden=16"})
      o.push_back(s);
  } else {  // gpt: AdamW and clipping, so the global norm and the tied table both matter
    for (const char* s :
         {"data.kind=text", "data.path=/usr/share/games/fortunes/songs-poems", "data.context=16",
          "data.test_fraction=0.1", "train.batch=8", "model.layers=2", "model.heads=2",
          "model.embed=16", "optim.kind=adamw", "optim.lr=0.003", "train.clip_norm=0.5"})
      o.push_back(s);
  }
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "pp_test", o);
}

}  // namespace tessel::testing
