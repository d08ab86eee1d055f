// The planner: published memory figures reproduced (ZeRO paper, Korthikanti et al. 2022), its
// model-state bytes equal to what the engine allocates (dry run), and every layout it offers
// accepted by train's own set-up.
#include "tessel/train/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "tessel/comm/threads.h"
#include "tessel/core/error.h"
#include "tessel/data/dataset.h"
#include "tessel/nn/models.h"
#include "tessel/parallel/schedule.h"
#include "tessel/train/dry_run.h"
#include "tessel/train/plan_auto.h"
#include "tessel/train/plan_scale.h"
#include "tessel/train/recovery.h"
#include "tessel/train/trainer.h"

namespace tessel::train {
namespace {

// The ZeRO paper's accounting (Rajbhandari et al. 2020, sec. 3-5): 2 bytes of 16-bit
// parameters (sharded at stage 3), 2 of gradients (stage 2), K of optimizer state (stage 1:
// Adam's f32 master copy, momentum and variance, K = 12).
std::vector<StateTerm> zero_paper_terms(double k) {
  return {{MemCategory::kParameters, 2, 3, false},
          {MemCategory::kGradients, 2, 2, false},
          {MemCategory::kOptimizer, k, 1, false}};
}

// ZeRO (Rajbhandari et al. 2020), Figure 1 / Table 1: a 7.5B-parameter model on 64 ranks with
// mixed-precision Adam (K = 12) holds 120 GB, 31.4 GB, 16.6 GB and 1.9 GB of model states per
// rank at stages 0-3 (figures given to three significant digits).
TEST(PlanScale, ZeroPaperModelStates) {
  const double psi = 7.5e9;
  const double paper[] = {120, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const double gb = state_bytes(zero_paper_terms(12), stage, psi, psi / 64).total() / 1e9;
    EXPECT_NEAR(std::round(gb * 10) / 10, paper[stage], 1e-9) << "stage " << stage << ": " << gb;
    EXPECT_NEAR(gb, paper[stage], 0.014 * paper[stage]) << "stage " << stage;
  }
  // stages 0-2 within 1% (stage 3's 1.875 GB is printed 1.9: 1.3% by rounding)
  for (int stage = 0; stage <= 2; ++stage)
    EXPECT_NEAR(state_bytes(zero_paper_terms(12), stage, psi, psi / 64).total() / 1e9, paper[stage],
                0.01 * paper[stage]);
}

// Korthikanti et al. 2022, sec. 4.1: a layer's activations, tensor by tensor (16-bit values,
// 1-byte dropout masks). Attention: QKV input 2sbh, Q and K 4sbh, softmax 2as^2b, its dropout
// mask as^2b and output 2as^2b, V 2sbh, the projection's input 2sbh, dropout mask sbh:
// 11sbh + 5as^2b. MLP: input 2sbh, first GEMM's output 8sbh, GeLU output 8sbh, dropout mask
// sbh: 19sbh. Two LayerNorm inputs: 4sbh. With t-way tensor parallelism the tensors inside the
// cut regions split (24sbh + 5as^2b), the LayerNorm inputs, both dropout masks and the two
// regions' inputs do not (10sbh); sequence parallelism splits those too.
struct Layer {
  double split = 0, whole = 0, attention = 0;  // bytes: split by t, not split, the as^2b terms
};
Layer paper_layer(const GptShape& g, double b) {
  const double s = g.seq, h = g.hidden, a = g.heads, sbh = s * b * h;
  Layer l;
  l.whole = 2 * sbh /*attn input*/ + sbh /*attn dropout mask*/ + 2 * sbh /*mlp input*/ +
            sbh /*mlp dropout mask*/ + 4 * sbh /*layernorms*/;
  l.split = 4 * sbh /*Q, K*/ + 2 * sbh /*V*/ + 2 * sbh /*proj input*/ + 8 * sbh /*fc out*/ +
            8 * sbh /*gelu out*/;
  l.attention = (2 + 1 + 2) * a * s * s * b;  // softmax, its dropout mask, dropout output
  return l;
}

TEST(PlanScale, KorthikantiActivationFormulas) {
  for (const char* size : {"1.5b", "13b", "175b"}) {
    const GptShape g = gpt_preset(size);
    for (int64_t b : {1, 4}) {
      const Layer l = paper_layer(g, static_cast<double>(b));
      EXPECT_NEAR(layer_activation_bytes(g, b, 1, false, "none"), l.whole + l.split + l.attention,
                  1e-9 * l.split)
          << size;
      for (int t : {2, 4, 8}) {
        const double tp = l.whole + (l.split + l.attention) / t;
        const double sp = (l.whole + l.split + l.attention) / t;
        const double tol = 0.01;
        EXPECT_NEAR(layer_activation_bytes(g, b, t, false, "none"), tp, tol * tp) << size << t;
        EXPECT_NEAR(layer_activation_bytes(g, b, t, true, "none"), sp, tol * sp) << size << t;
        const double sel_sp = (l.whole + l.split) / t, sel = l.whole + l.split / t;
        EXPECT_NEAR(layer_activation_bytes(g, b, t, true, "selective"), sel_sp, tol * sel_sp);
        EXPECT_NEAR(layer_activation_bytes(g, b, t, false, "selective"), sel, tol * sel);
      }
    }
  }
  // The paper's headline: for the 175B model at t = 8, sequence parallelism with selective
  // recompute keeps about 5x less than tensor parallelism alone.
  const GptShape g = gpt_preset("175b");
  const double ratio = layer_activation_bytes(g, 1, 8, false, "none") /
                       layer_activation_bytes(g, 1, 8, true, "selective");
  EXPECT_GT(ratio, 5.0);
  EXPECT_LT(ratio, 6.0);
}

TEST(PlanScale, GptParametersAndPlan) {
  EXPECT_NEAR(gpt_parameters(gpt_preset("175b")) / 1e9, 175, 0.01 * 175);
  EXPECT_NEAR(gpt_parameters(gpt_preset("13b")) / 1e9, 12.9, 0.02 * 12.9);
  ScaleOptions o;
  o.workers = 64;
  o.memory_per_rank = int64_t{80} << 30;
  const auto plan = plan_gpt(gpt_preset("13b"), o);
  ASSERT_FALSE(plan.empty());
  EXPECT_TRUE(plan.front().overflow.empty());
  EXPECT_LE(plan.front().memory.total(), 80.0 * (1 << 30));
  // plain data parallelism cannot hold 13B x 18 bytes in 80 GB: refused naming a category
  bool dp_only_refused = false;
  for (const Candidate& c : plan)
    if (c.spec.tp_size == 1 && c.spec.pp_stages == 1 && c.spec.zero_stage == 0)
      dp_only_refused = dp_only_refused || c.overflow == "optimizer_state";
  EXPECT_TRUE(dp_only_refused);
  EXPECT_THROW(gpt_preset("7b"), InvalidArgument);
}

Config tiny_gpt(const std::vector<std::string>& sets = {}) {
  std::vector<std::string> o = {
      "model.kind=gpt",  "data.kind=text", "data.path=/usr/share/games/fortunes/songs-poems",
      "data.context=16", "train.batch=8",  "model.layers=2",
      "model.heads=2",   "model.embed=16", "optim.kind=adamw"};
  o.insert(o.end(), sets.begin(), sets.end());
  return parse_config("", "plan_test", o);
}

// A calibration with no cost measured: the model's shape only (memory of the state is what is
// compared here; activations and time are the bench's).
Calibration shape_only(const Config& c) {
  const data::Splits d = data::make_datasets(c.data);
  Calibration cal;
  cal.input_shape = d.train->input_shape();
  cal.num_classes = d.train->num_classes();
  cal.link_bytes_per_s = 1e9;
  nn::ModelSpec m = c.model;
  m.input_shape = cal.input_shape;
  m.num_classes = cal.num_classes;
  cal.block_out_width.assign(nn::build_model(m)->num_blocks(), 16.0 * 16);  // context x embed
  for (const char* p : {"fp32", "bf16"})
    for (const char* r : {"none", "selective", "full"}) cal.variants.push_back({p, r, 8});
  return cal;
}

double state_of(const nlohmann::json& bytes) {
  return bytes["parameters"].get<double>() + bytes["gradients"].get<double>() +
         bytes["optimizer_state"].get<double>();
}

// Every layout plan offers for 1-4 ranks starts under train's own set-up (the dry run behind
// `tessel config`), and its predicted parameters + gradients + optimizer state on the fullest
// rank are what the engine allocates, within 3% (and a server's receive buffers too).
TEST(Plan, OffersOnlyWhatTrainStartsAndPredictsItsState) {
  const Config base = tiny_gpt();
  const Calibration cal = shape_only(base);
  for (int workers : {1, 2, 4}) {
    PlanOptions o;
    o.workers = workers;
    std::set<std::string> seen;
    int checked = 0;
    for (const Candidate& c : plan_layouts(base, o, cal)) {
      if (c.spec.recompute != nn::Recompute::kNone ||
          !seen.insert(c.layout + c.sets[2] + c.sets[4]).second)
        continue;  // recompute moves no state; one micro-batch count per mesh
      Config cfg = tiny_gpt(c.sets);
      cfg.runtime.workers = workers;
      nlohmann::json run;
      ASSERT_NO_THROW(run = dry_run(cfg, workers)) << workers << " ranks: " << c.layout;
      // With parameter servers (the last ranks) the plan's fullest rank is a server (receive
      // buffers in comm_buffers, which a worker of theirs never holds) or a worker: the ranks of
      // that role.
      const int servers = static_cast<int>(c.spec.ps_servers);
      const bool server = c.memory[MemCategory::kComm] > 0;
      double measured = 0;
      for (int r = 0; r < workers; ++r)
        if (servers == 0 || server == (r >= workers - servers))
          measured = std::max(measured, state_of(run["memory_bytes_per_rank"][r]));
      const double predicted = c.memory[MemCategory::kParameters] +
                               c.memory[MemCategory::kGradients] +
                               c.memory[MemCategory::kOptimizer];
      EXPECT_NEAR(predicted, measured, 0.03 * measured)
          << workers << " ranks, " << c.layout << " " << c.sets[2] << " " << c.sets[4];
      if (servers > 0 && server) {  // a server's receive buffers are built at set-up too
        const double buffers = c.memory[MemCategory::kComm];
        EXPECT_NEAR(buffers, run["memory_bytes_per_rank"][workers - 1]["comm_buffers"],
                    0.03 * buffers)
            << workers << " ranks, " << c.layout;
      }
      ++checked;
    }
    EXPECT_GT(checked, workers == 1 ? 1 : 6) << workers;
  }
}

// The fullest rank's ledger peak of a short run (set-up and 3 steps, as metrics.jsonl records
// it, and the parameter servers' in the summary), the figure the bench checks.
double measured_peak(Config c, int workers) {
  c.runtime.workers = workers;
  c.train.max_steps = 3;
  c.train.log_every = 1;
  c.checkpoint.every_epochs = 0;
  RunOptions opts;
  opts.progress = false;
  opts.overwrite = true;
  // a folder of its own: ctest runs the tests that measure at once, and one run's overwrite
  // would remove the other's metrics
  opts.run_dir = testing::TempDir() + "/plan_memory_run_" +
                 testing::UnitTest::GetInstance()->current_test_info()->name();
  train_threads(c, opts, comm::CommOptions{});
  double peak = 0;
  std::ifstream metrics(opts.run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("type", "") == "train")
      peak = std::max(peak, r.value("memory_peak_bytes_max", 0.0));
  }
  std::ifstream summary(opts.run_dir + "/summary.json");
  for (const nlohmann::json& server :
       nlohmann::json::parse(summary)["ranks"].value("ps_servers", nlohmann::json::array()))
    peak = std::max(peak, server["memory"]["peak_total_bytes"].get<double>());
  return peak;
}

// The candidate of `plan` that `sets` select (no recompute).
const Candidate& candidate(const std::vector<Candidate>& plan, const Config& chosen) {
  const parallel::ParallelSpec& want = chosen.parallel;
  for (const Candidate& c : plan)
    if (c.spec.recompute == nn::Recompute::kNone && c.spec.ps_servers == want.ps_servers &&
        c.spec.tp_size == want.tp_size && c.spec.pp_stages == want.pp_stages &&
        c.spec.zero_stage == want.zero_stage &&
        (c.spec.pp_stages == 1 || c.spec.pp_microbatches == want.pp_microbatches))
      return c;
  throw Error("plan_test: the plan offers no such layout");
}

// ZeRO-1 over 4 ranks in shared memory: its set-up held an arena-sized buffer on top of the
// gradients and the parameters (2.25 arenas, above the steps' 1.5 and the prediction).
TEST(PlanMemory, PredictsTheLedgerPeakOfSharedMemoryZero1) {
  const std::vector<std::string> mlp = {"model.kind=mlp", "model.hidden=[256]",
                                        "data.kind=fashion_mnist", "train.batch=16",
                                        "optim.kind=sgd"};
  const Config base = parse_config("", "plan_test", mlp);
  // a cache of its own: ctest runs the tests that calibrate at once
  const std::string cache = testing::TempDir() + "/plan_memory_cache_" +
                            testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(cache);
  PlanOptions o;
  o.workers = 4;
  o.precisions = {"fp32"};
  const std::vector<Candidate> plan = plan_layouts(base, o, calibrate(base, cache));
  std::vector<std::string> sets = mlp;
  sets.push_back("zero.stage=1");
  const Config chosen = parse_config("", "plan_test", sets);
  const double measured = measured_peak(chosen, o.workers);
  EXPECT_NEAR(candidate(plan, chosen).memory.total(), measured, 0.1 * measured);
}

// A parameter server is the fullest rank of 1 server x 3 workers: its range's values, gradient
// and optimizer state, and a receive buffer for each worker's push (in async also a snapshot of
// the values each is sent).
TEST(PlanMemory, PredictsAParameterServersLedgerPeak) {
  const std::vector<std::string> mlp = {"model.kind=mlp",          "model.hidden=[256]",
                                        "data.kind=fashion_mnist", "train.batch=16",
                                        "optim.kind=sgd",          "ps.servers=1"};
  const std::string cache = testing::TempDir() + "/plan_memory_cache_ps";
  std::filesystem::remove_all(cache);
  const Calibration cal = calibrate(parse_config("", "plan_test", mlp), cache);
  PlanOptions o;
  o.workers = 4;
  o.precisions = {"fp32"};
  for (const char* mode : {"sync", "async"}) {
    std::vector<std::string> sets = mlp;
    sets.push_back(str("ps.mode=", mode));
    const Config chosen = parse_config("", "plan_test", sets);
    const double predicted = candidate(plan_layouts(chosen, o, cal), chosen).memory.total();
    const double measured = measured_peak(chosen, o.workers);
    EXPECT_NEAR(predicted, measured, 0.1 * measured) << mode;
    const double arena = 4.0 * (784 * 256 + 256 + 256 * 10 + 10);
    EXPECT_GT(measured, (std::string(mode) == "sync" ? 5.9 : 8.9) * arena) << mode;
  }
}

// The comm buffers of `sets` on `workers` ranks: predicted for the fullest rank, and the
// largest ledger peak of comm buffers over the ranks' set-up and 3 steps.
std::pair<double, double> comm_buffers(const std::vector<std::string>& sets, int workers,
                                       const std::string& precision) {
  Config chosen = parse_config("", "plan_test", sets);
  // a cache of its own: ctest runs the tests that calibrate at once
  const std::string cache = testing::TempDir() + "/plan_memory_cache_" +
                            testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::remove_all(cache);
  PlanOptions o;
  o.workers = workers;
  o.precisions = {precision};
  const std::vector<Candidate> plan = plan_layouts(chosen, o, calibrate(chosen, cache));
  const double predicted = candidate(plan, chosen).memory[MemCategory::kComm];
  const data::Splits data = data::make_datasets(chosen.data);
  chosen.runtime.workers = workers;
  const int64_t replicas = workers / (chosen.parallel.pp_stages * chosen.parallel.tp_size);
  std::vector<double> comm(static_cast<size_t>(workers));
  comm::run_threads(workers, [&](comm::Communicator& world) {
    RunOptions opts;
    opts.progress = false;
    Trainer trainer(chosen, opts, &world, &data);
    MemoryScope charged(trainer.ledger(), MemCategory::kOther);  // as Trainer::run charges it
    data::LoaderOptions lo;
    lo.batch = chosen.train.batch / replicas;
    data::DataLoader loader(data.train, lo);
    loader.start_epoch(0);
    EvalResult sums;
    for (int i = 0; i < 3; ++i) {
      data::Batch b;
      loader.next(b);
      b.global_size = chosen.train.batch;
      trainer.step({b}, sums);
    }
    comm[static_cast<size_t>(world.rank())] =
        static_cast<double>(trainer.ledger()->peak(MemCategory::kComm));
  });
  return {predicted, *std::max_element(comm.begin(), comm.end())};
}

// A pipeline's comm buffers hold the tensors its stages pass: for a cnn, feature maps (here
// 16 x 14 x 14 per row) far wider than the fc layer they were once sized by.
TEST(PlanMemory, PredictsAPipelinesCommBuffers) {
  const auto [predicted, measured] =
      comm_buffers({"model.kind=cnn", "model.channels=[16, 8]", "model.kernel=3",
                    "model.fc_hidden=8", "data.kind=fashion_mnist", "data.flatten=false",
                    "train.batch=32", "optim.kind=sgd", "pp.stages=2", "pp.microbatches=2"},
                   2, "fp32");
  EXPECT_NEAR(predicted, measured, 0.1 * measured);
  EXPECT_GT(measured, 2 * 16.0 * 16 * 14 * 14 * 4) << "two micro-batches' feature maps";
}

// ZeRO-2 in a pipeline keeps every unit's f32 bucket open through the step and sends them all
// at its end, each with a copy in the message's 16 bits under bf16 (here the first stage's
// 784 x 256 layer: 0.8 MB f32 + 0.4 MB bf16).
TEST(PlanMemory, PredictsZero2CommBuffersOfABf16Pipeline) {
  const auto [predicted, measured] =
      comm_buffers({"model.kind=mlp", "model.hidden=[256, 16]", "data.kind=fashion_mnist",
                    "train.batch=16", "optim.kind=sgd", "pp.stages=2", "pp.microbatches=4",
                    "zero.stage=2", "train.precision=bf16"},
                   4, "bf16");
  EXPECT_NEAR(predicted, measured, 0.1 * measured);
  EXPECT_GT(measured, 6.0 * 784 * 256) << "the first stage's f32 buckets and their bf16 copies";
}

TEST(Plan, CapNamesTheOverflowingCategoryAndRanksFeasibleFirst) {
  const Config base = tiny_gpt();
  const Calibration cal = shape_only(base);
  PlanOptions o;
  o.workers = 2;
  o.memory_per_rank = 1024;  // nothing fits
  for (const Candidate& c : plan_layouts(base, o, cal)) EXPECT_FALSE(c.overflow.empty());
  o.memory_per_rank = 0;
  const auto plan = plan_layouts(base, o, cal);
  for (size_t i = 1; i < plan.size(); ++i)
    EXPECT_GE(plan[i - 1].samples_per_s * 1.001, plan[i].samples_per_s);
  o.hosts = 2;
  EXPECT_THROW(plan_layouts(base, o, cal), InvalidArgument);  // --hosts needs --bandwidth
  o.hosts = 3;
  EXPECT_THROW(plan_layouts(base, o, cal), InvalidArgument);  // 3 does not divide 2
}

// layout = auto takes the plan's first feasible layout in the config's precision, sets its keys
// (layout = manual, so that the run's config.toml keeps the pick) and names the runner-up.
TEST(PlanAuto, PicksTheFastestFeasibleLayoutAndSetsItsKeys) {
  const Config base = tiny_gpt({"layout=auto", "train.recompute=full"});
  const Calibration cal = shape_only(base);
  PlanOptions o;
  o.workers = 4;
  o.precisions = {"fp32"};
  auto plan = plan_layouts(base, o, cal);
  for (const Candidate& c : plan) EXPECT_EQ(c.spec.precision, parallel::Precision::kFp32);
  // a cap between the smallest and the largest layout: the pick is one that fits
  std::vector<double> totals;
  for (const Candidate& c : plan) totals.push_back(c.memory.total());
  std::sort(totals.begin(), totals.end());
  o.memory_per_rank = static_cast<int64_t>(totals[totals.size() / 2]);
  plan = plan_layouts(base, o, cal);
  const LayoutChoice choice = choose_layout(base, plan, o);
  const Candidate& best = plan.front();
  EXPECT_LE(best.memory.total(), static_cast<double>(o.memory_per_rank));
  EXPECT_EQ(choice.config.layout, LayoutMode::kManual);
  EXPECT_EQ(choice.config.parallel.tp_size, best.spec.tp_size);
  EXPECT_EQ(choice.config.parallel.pp_stages, best.spec.pp_stages);
  EXPECT_EQ(choice.config.parallel.zero_stage, best.spec.zero_stage);
  EXPECT_EQ(choice.config.parallel.recompute, best.spec.recompute);
  EXPECT_EQ(choice.record["chosen"]["layout"], best.layout + " " + options_str(best.spec));
  EXPECT_EQ(choice.record["set"], nlohmann::json(best.sets));
  ASSERT_FALSE(choice.record["runner_up"].is_null());
  EXPECT_EQ(choice.record["runner_up"]["layout"], plan[1].layout + " " + options_str(plan[1].spec));
  EXPECT_GE(choice.record["margin"].get<double>(), 0.0);
  ASSERT_GE(choice.notes.size(), 2u);
  EXPECT_NE(choice.notes[1].find("runner-up"), std::string::npos) << choice.notes[1];
  // a manual config passes through untouched
  const Config manual = tiny_gpt();
  EXPECT_EQ(to_toml(resolve_layout(manual, 4, nullptr).config), to_toml(manual));
}

// A cap that no layout meets fails before training, naming the category and what to change.
TEST(PlanAuto, ACapNoLayoutMeetsNamesTheCategory) {
  const Config base = tiny_gpt({"layout=auto"});
  const Calibration cal = shape_only(base);
  PlanOptions o;
  o.workers = 2;
  o.memory_per_rank = 1024;
  const auto plan = plan_layouts(base, o, cal);
  try {
    choose_layout(base, plan, o);
    FAIL() << "no layout fits 1 KiB";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no layout of 2 ranks"), std::string::npos) << m;
    EXPECT_NE(m.find(std::string("most of it ") + plan.front().overflow), std::string::npos) << m;
    EXPECT_NE(m.find("raise runtime.memory_limit_mb to 1"), std::string::npos) << m;
  }
}

TEST(Plan, CalibrationRoundTripsThroughJson) {
  Calibration c = shape_only(tiny_gpt());
  c.variants[1].step_s_per_row = 0.25;
  c.contention_crowded = 0.75;
  c.block_flops = {1, 2, 3};
  c.host = "h avx2";
  c.seconds = 12.5;
  const Calibration back = Calibration::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.variant("fp32", "selective").step_s_per_row, 0.25);
  EXPECT_THROW(back.variant("fp64", "none"), InvalidArgument);
}

// The calibration keeps each time figure as the median of its rounds: a round a burst of load
// slowed (or a lucky one) does not move it, as it would a mean.
TEST(Plan, MedianOfRoundsIgnoresOneOutlyingRound) {
  EXPECT_EQ(median_of({0.010, 0.031, 0.011}), 0.011);
  EXPECT_EQ(median_of({0.56, 1.10, 1.08}), 1.08);
  EXPECT_DOUBLE_EQ(median_of({4, 1, 3, 2}), 2.5);  // an even count: the middle two's mean
  EXPECT_EQ(median_of({7}), 7);
  EXPECT_THROW(median_of({}), Error);
}

// A pipeline's slowest stage idles while the others fill and drain: f / (1 - f) of their mean
// compute, which for equal stages is its own (bubble_model's share of the step).
TEST(PlanTime, BubbleIsTheOtherStagesFill) {
  const double f = parallel::bubble_model(parallel::PpSchedule::k1f1b, 4, 8, 1);  // 3 / 11
  EXPECT_NEAR(pipeline_bubble({2, 2, 2, 2}, 1, f), 2 * 3.0 / 8, 1e-12);
  // fashion_mlp's first stage holds most of the flops: the others' short micro-batches fill it
  EXPECT_NEAR(pipeline_bubble({3, 0.5, 1, 0.5}, 0, f), 3.0 / 8 * (2.0 / 3), 1e-12);
  EXPECT_EQ(pipeline_bubble({3}, 0, 0.5), 0);
}

// Ranks on one host: the step lasts at least the host's work over its cores at the measured
// pace; with more ranks than cores the slowest rank's communication waits are filled by the
// others (the pace then is contention_crowded's) but for those every rank shares (sync), with
// at most one rank a core they add.
TEST(PlanTime, CrowdedHostFillsTheWaits) {
  Calibration cal;
  cal.cores = 2;
  cal.contention = 1.2;
  cal.contention_crowded = 0.9;
  StepTime path;
  path.compute = 1;
  path.comm = 0.5;
  path.bubble = 0.25;
  path.sync = 0.125;                                               // of comm
  EXPECT_EQ(share_host(path, 100, 1, cal).total(), path.total());  // one rank: its own path
  const StepTime two = share_host(path, 4, 2, cal);                // 4 s of work at 1.2 on 2 cores
  EXPECT_NEAR(two.compute, 4 * 1.2 / 2 - 0.25, 1e-12);
  EXPECT_NEAR(two.total(), 4 * 1.2 / 2 + 0.5, 1e-12);  // its comm waits on top
  // 4 ranks: the host's work and the waits every rank shares; the rest filled
  EXPECT_NEAR(share_host(path, 4, 4, cal).total(), 4 * 0.9 / 2 + 0.125, 1e-12);
  EXPECT_EQ(share_host(path, 1, 4, cal).total(), path.total());  // its own path is longer
}

// The same through plan_layouts: a data-parallel group's per-step cost measured on 2 ranks
// (dp_step_s) adds to dp = 2 on 2 cores, the one measured on 4 (dp_step_crowded_s) to the
// host's work for dp = 4, its ring's time filled by the other ranks' work.
TEST(PlanTime, DataParallelOnACrowdedHostIsTheHostsWork) {
  const Config base = tiny_gpt();
  Calibration cal = shape_only(base);
  for (Calibration::Variant& v : cal.variants) v.step_s_per_row = 1e-3;
  cal.arena_numel = 1;
  cal.cores = 2;
  cal.contention = cal.contention_crowded = 1;
  cal.dp_step_s = 1e-3;  // less than the host's work: dp = 4's own path is 3 ms
  cal.dp_step_crowded_s = 0.5e-3;
  cal.link_latency_s = 1e-4;  // 3 steps of the ring each way for dp = 4: 0.6 ms, filled
  cal.link_bytes_per_s = 1e15;
  PlanOptions o;
  o.precisions = {"fp32"};
  const auto dp_time = [&](int workers) {
    o.workers = workers;
    for (const Candidate& c : plan_layouts(base, o, cal))
      if (c.layout == str("dp=", workers) && c.spec.zero_stage == 1 &&
          c.spec.recompute == nn::Recompute::kNone)
        return c.time.total();
    return 0.0;
  };
  const double host = 8 * 1e-3 / 2;  // train.batch = 8 rows on 2 cores
  EXPECT_NEAR(dp_time(2), host + cal.dp_step_s + 2 * 1e-4, 1e-9);  // ZeRO-1: 2 x 1 step
  EXPECT_NEAR(dp_time(4), host + cal.dp_step_crowded_s, 1e-9);
}

}  // namespace
}  // namespace tessel::train
