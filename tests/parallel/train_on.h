// Helpers the parallel suites share: train a config on N ranks as threads and compare the
// parameters with another layout's.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tessel/comm/threads.h"
#include "tessel/train/trainer.h"

namespace tessel::testing {

struct RunResult {
  std::vector<float> params;            // rank 0's, after consolidation
  std::vector<std::vector<float>> all;  // every rank's own arena
  nlohmann::json summary;               // rank 0's
};

// A run folder of this process (two runs of a test binary at once never share one).
inline std::string test_run_dir(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
}

// Trains `cfg` on `workers` ranks as threads (1: one worker, no communicator). An empty
// opts.run_dir becomes test_run_dir(<config name>_<workers>); a fresh run (no resume) starts
// from an empty folder.
inline RunResult train_on(const train::Config& cfg, int workers, train::RunOptions opts = {},
                          const data::Splits* data = nullptr) {
  opts.progress = false;
  if (opts.run_dir.empty()) opts.run_dir = test_run_dir(cfg.name + "_" + std::to_string(workers));
  std::error_code ec;
  if (opts.resume.empty()) std::filesystem::remove_all(opts.run_dir, ec);  // no old checkpoints
  RunResult run;
  run.all.resize(static_cast<size_t>(workers));
  auto body = [&](comm::Communicator* world) {
    train::Trainer t(cfg, opts, world, data);
    nlohmann::json s = t.run();
    const Tensor& p = t.model().params().flat();
    const int r = world ? world->rank() : 0;
    run.all[static_cast<size_t>(r)].assign(p.data<float>(), p.data<float>() + p.numel());
    if (r == 0) {
      run.params = run.all[0];
      run.summary = s;
    }
  };
  if (workers == 1)
    body(nullptr);
  else
    comm::run_threads(workers, [&](comm::Communicator& c) { body(&c); });
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
