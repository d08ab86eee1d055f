// The fixture every device test suite shares (dp, pp, tp, multigpu): fashion_mlp's and
// char_gpt's data loaded once per suite, a run on CPU ranks or on the stand-in device
// (tests/support/fake_device.h; through the mock NCCL when asked, else staged through the host),
// and after each test the mock's rules kept and every communicator closed. Also what every device
// test shares: the configs they train (device_config), the bit-for-bit check (expect_same_run), the
// refusal check (expect_refused), a run's step losses and a rank's ledger peak.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fake_device.h"
#include "nccl_mock.h"
#include "small_images.h"
#include "tessel/comm/nccl_api.h"
#include "train_on.h"

namespace tessel::train {

// A device test's run of examples/<model>.toml, shortened: fashion_mlp in batches of 64 with no
// test split, fashion_cnn in batches of 16 of small_images_dir()'s images (both whole batches
// only), char_gpt as 2 blocks of width 64 over a context of 32 in batches of 8, AdamW after one
// warm-up step.
struct DeviceRun {
  std::string model;               // fashion_mlp, fashion_cnn or char_gpt
  std::string device = "cuda";     // runtime.device
  std::string precision = "fp32";  // train.precision
  int steps = 4;                   // train.max_steps
  std::vector<std::string> extra;  // after the rest: its settings win
};

inline Config device_config(const DeviceRun& run) {
  std::vector<std::string> o = {str("train.max_steps=", run.steps),
                                str("train.precision=", run.precision),
                                str("runtime.device=", run.device)};
  if (run.model == "char_gpt")
    o.insert(o.end(), {"model.layers=2", "model.embed=64", "data.context=32", "train.batch=8",
                       "optim.kind=adamw", "schedule.warmup_steps=1"});
  else if (run.model == "fashion_cnn")
    o.insert(o.end(), {"train.batch=16", "train.drop_last=true",
                       "data.path=" + tessel::testing::small_images_dir()});
  else
    o.insert(o.end(), {"train.batch=64", "train.drop_last=true", "data.test_fraction=0"});
  o.insert(o.end(), run.extra.begin(), run.extra.end());
  return tessel::testing::example(run.model, o);
}

// What the offload tests add to a DeviceRun: every step's loss logged (step_losses), whole
// batches, AdamW after one warm-up step.
inline const std::vector<std::string> kOffloadSettings = {
    "train.log_every=1", "train.drop_last=true", "optim.kind=adamw", "schedule.warmup_steps=1"};

class DeviceRanks : public ::testing::Test {
 public:
  // A suite's SetUpTestSuite: the data of its configurations (a gpt's only when given).
  static void load(const Config& mlp, const std::optional<Config>& gpt = std::nullopt) {
    mlp_data_ = new data::Splits(data::make_datasets(mlp.data));
    if (gpt) gpt_data_ = new data::Splits(data::make_datasets(gpt->data));
  }
  static void TearDownTestSuite() {
    delete mlp_data_;
    delete gpt_data_;
    mlp_data_ = gpt_data_ = nullptr;
  }
  void TearDown() override {
    comm::install_nccl_api(nullptr);
    const comm::testing::MockNcclState s = comm::testing::mock_nccl_state();
    EXPECT_EQ(s.misuses, 0) << s.first_misuse;
    EXPECT_EQ(s.live_comms, 0);  // every rank closed its communicators
    comm::testing::mock_nccl_reset();
  }

  static const data::Splits* data_of(const Config& cfg) {
    return cfg.model.kind == nn::ModelKind::kGpt ? gpt_data_ : mlp_data_;
  }
  static tessel::testing::RunResult run(const Config& cfg, int workers, RunOptions opts = {}) {
    return tessel::testing::train_on(cfg, workers, std::move(opts), data_of(cfg));
  }
  // cfg on `workers` device ranks (the fake device; the mock NCCL when `nccl`).
  static tessel::testing::RunResult run_on_device(const Config& cfg, int workers, bool nccl) {
    comm::install_nccl_api(nccl ? &comm::testing::mock_nccl() : nullptr);
    tessel::testing::RunResult r;
    {
      fakes::FakeDevice fake;
      r = run(cfg, workers);
      EXPECT_GT(fake.runtime().copies, 0);
    }
    comm::install_nccl_api(nullptr);
    return r;
  }

 protected:
  static inline data::Splits* mlp_data_ = nullptr;
  static inline data::Splits* gpt_data_ = nullptr;
};

// Two runs that must be the same bits: the parameters and the summary's hash, losses and steps.
inline void expect_same_run(const tessel::testing::RunResult& got,
                            const tessel::testing::RunResult& want) {
  for (const char* key : {"params_sha256", "train_loss", "train_accuracy", "steps"})
    EXPECT_EQ(got.summary[key], want.summary[key]) << key;
  EXPECT_EQ(got.params, want.params);
}

// cfg on two ranks is refused at start: an InvalidArgument naming `expected` and offering
// train.offload = none, before any step. `settings`: what cfg tried, for a failure's message.
inline void expect_refused(const Config& cfg, const data::Splits& data, const std::string& settings,
                           const std::string& expected) {
  try {
    tessel::testing::train_on(cfg, 2, {}, &data);
    ADD_FAILURE() << settings << " was not refused";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(expected), std::string::npos) << what;
    EXPECT_NE(what.find("or train.offload = none"), std::string::npos) << what;
  }
}

// The training loss of every step in run_dir's metrics.jsonl.
inline std::vector<double> step_losses(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("type", "") == "train") out.push_back(r["loss"].get<double>());
  }
  return out;
}

// Rank `rank`'s ledger peak of `category` in a run's summary.
inline double peak_bytes(const tessel::testing::RunResult& r, const char* category, int rank = 0) {
  return r.summary["ranks"]["per_rank"][rank]["memory"]["peak_bytes"][category].get<double>();
}

}  // namespace tessel::train
