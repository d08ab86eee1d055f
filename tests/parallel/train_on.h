// Helpers the parallel suites share: train a config on N ranks as threads and read the final
// parameters back from the run's last checkpoint, which every layout writes in the same
// format (so a ZeRO-3 run, whose ranks never hold the whole model, compares like any other).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tessel/comm/threads.h"
#include "tessel/nn/models.h"
#include "tessel/train/checkpointer.h"
#include "tessel/train/trainer.h"

namespace tessel::testing {

struct RunResult {
  std::vector<float> params;  // the whole arena, from the final checkpoint
  nlohmann::json summary;     // rank 0's
};

// A run folder of this process (two runs of a test binary at once never share one).
inline std::string test_run_dir(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
}

// The arena of the checkpoint in run_dir (padding zero), in a fresh model of cfg.
inline std::vector<float> checkpoint_params(const train::Config& cfg, const data::Splits& data,
                                            const std::string& run_dir) {
  nn::ModelSpec spec = cfg.model;
  spec.input_shape = data.train->input_shape();
  spec.num_classes = data.train->num_classes();
  auto model = nn::build_model(spec);
  model->materialize(cfg.seed);
  train::Checkpointer::load_weights(ckpt::CheckpointReader(run_dir), *model);
  const Tensor& v = model->values();
  return {v.data<float>(), v.data<float>() + v.numel()};
}

// Trains `cfg` on `workers` ranks as threads (1: one worker). An empty opts.run_dir becomes
// test_run_dir(<config name>_<workers>); a fresh run (no resume) starts from an empty folder.
// `per_rank` (optional) runs on every rank's Trainer after training.
inline RunResult train_on(const train::Config& cfg, int workers, train::RunOptions opts = {},
                          const data::Splits* data = nullptr,
                          const std::function<void(train::Trainer&)>& per_rank = {}) {
  opts.progress = false;
  if (opts.run_dir.empty()) opts.run_dir = test_run_dir(cfg.name + "_" + std::to_string(workers));
  std::error_code ec;
  if (opts.resume.empty()) std::filesystem::remove_all(opts.run_dir, ec);  // no old checkpoints
  const data::Splits loaded = data ? *data : data::make_datasets(cfg.data);
  RunResult run;
  comm::run_threads(workers, [&](comm::Communicator& c) {
    train::Trainer t(cfg, opts, workers == 1 ? nullptr : &c, &loaded);
    nlohmann::json s = t.run();
    if (per_rank) per_rank(t);
    if (c.rank() == 0) run.summary = s;
  });
  run.params = checkpoint_params(cfg, loaded, opts.run_dir);
  return run;
}

// Largest absolute difference relative to the largest |a|.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return diff / scale;
}

}  // namespace tessel::testing
