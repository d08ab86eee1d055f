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

#include "tessel/ckpt/model_weights.h"
#include "tessel/comm/threads.h"
#include "tessel/nn/models.h"
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
  ckpt::load_weights(ckpt::CheckpointReader(run_dir), *model);
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

// examples/NAME.toml shortened to 20 steps, with `extra` overrides.
inline train::Config example(const std::string& name, std::vector<std::string> extra) {
  std::vector<std::string> o = {"train.max_steps=20", "train.prefetch=0", "train.log_every=1000",
                                "checkpoint.every_epochs=0", "ddp.bucket_mb=0.25"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::load_config(std::string(TESSEL_SOURCE_DIR) + "/examples/" + name + ".toml", o);
}

// A synthetic MLP in deterministic mode (dropout, AdamW, clipping, micro-shards): its
// params_sha256 is a layout's fingerprint.
inline train::Config det_config(std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"data.kind=synthetic",
                                "data.samples=600",
                                "data.features=12",
                                "data.classes=4",
                                "data.test_fraction=0.2",
                                "train.batch=120",
                                "train.max_steps=20",
                                "train.prefetch=0",
                                "optim.kind=adamw",
                                "optim.lr=0.01",
                                "model.hidden=[32,16]",
                                "model.dropout=0.1",
                                "checkpoint.every_epochs=0",
                                "train.deterministic=true",
                                "ddp.micro_shard=2",
                                "train.drop_last=true",
                                "train.clip_norm=0.5",
                                "ddp.bucket_mb=0.001",
                                "train.epochs=10"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train::parse_config("", "det", o);
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
