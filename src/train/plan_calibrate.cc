// The planner's calibration: what a config's model costs on this machine, measured by the
// Trainer itself on one rank (every precision x recompute the planner offers, at two batch
// sizes, fitted a + b x rows), and the alpha-beta of this host's threads transport. Cached per
// host, ISA and model (plan.h), so that `tessel plan` answers at once after the first time.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/core/sha256.h"
#include "tessel/nn/models.h"
#include "tessel/ops/isa.h"
#include "tessel/train/plan.h"
#include "tessel/train/run_folder.h"
#include "tessel/train/trainer.h"

namespace tessel::train {

using nlohmann::json;

namespace {

// The most cores a host may have for the calibration to measure more ranks than cores.
constexpr int kCrowdedCoresMax = 8;

// Steps timed after one untimed step (the median is kept): at least kTimedSteps, and as many
// more as fill kTimedSeconds, so that a model of 3 ms steps is timed over more than 9 ms (one
// scheduler tick of another process on the host moved such a figure by 30%).
constexpr int kTimedSteps = 3, kMaxTimedSteps = 200;
constexpr double kTimedSeconds = 0.15;
// Each time figure is the median of kRounds such runs, the rounds spread over the calibration
// (a burst of load on a shared host lasts longer than one run: one figure in 0.15 s measured
// a pace of 0.56, two ranks to a core faster than one).
constexpr int kRounds = 3;

// Steps to time at `step_s` a step: as many as fill kTimedSeconds, within the bounds above.
int steps_for(double step_s) {
  return static_cast<int>(std::clamp(std::ceil(kTimedSeconds / std::max(1e-6, step_s)),
                                     double{kTimedSteps}, double{kMaxTimedSteps}));
}

// What the figures depend on: the model, its input, the batch, the optimizer, BLAS threads.
std::string model_key(const Config& c) {
  const nn::ModelSpec& m = c.model;
  const json key = {{"model",
                     {name_of(m.kind), m.hidden, name_of(m.activation), m.dropout, m.channels,
                      m.kernel, m.fc_hidden, m.layers, m.heads, m.embed, name_of(m.norm),
                      name_of(m.position), name_of(m.mlp), nn::stack_toml(m.stack)}},
                    {"data",
                     {name_of(c.data.kind), c.data.path, c.data.context, c.data.features,
                      c.data.classes, c.data.flatten}},
                    {"batch", c.train.batch},
                    {"optim", name_of(c.optim.kind)},
                    {"threads", c.runtime.threads},
                    {"version", 10}};
  return sha256_hex(key.dump().data(), key.dump().size()).substr(0, 16);
}

// The CPU time of the calling thread: a one-rank step's work without the time other processes
// on a shared host took its core from it (on a quiet host its wall time).
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Measured {
  double step_s = 0, cpu_s = 0, act_bytes = 0;  // median wall and thread CPU time of a step
};

// config laid out on one rank in `precision` x `recompute`, as the calibration measures it.
Config one_rank(const Config& base, const std::string& precision, const std::string& recompute) {
  Config c = base;
  c.parallel.tp_size = c.parallel.pp_stages = c.parallel.pp_microbatches = 1;
  c.parallel.zero_stage = 0;
  c.parallel.ps_servers = 0;
  c.parallel.precision = *value_of<parallel::Precision>(precision);
  c.parallel.recompute = *value_of<nn::Recompute>(recompute);
  c.parallel.memory_limit_mb = 0;  // measured whole: the cap is what the plan checks
  return c;
}

// Steps of `rows` rows on `ranks` threads in c's layout (one rank, a tp group, a pipeline, a
// dp pair: each replica reads its share of the rows): rank 0's median step time (wall, and its
// thread's CPU) and peak activation bytes. `steps` timed steps, or (0, one rank only: the ranks of
// a group must agree on the count) as many as kTimedSeconds takes. With `start`, the steps begin
// once every trainer arrived there (copies measured at once start together, not as each is built).
Measured measure(Config c, const data::Splits& data, int64_t rows, int ranks = 1, int steps = 0,
                 std::barrier<>* start = nullptr) {
  TESSEL_CHECK(steps > 0 || ranks == 1, "plan: a group's timed steps must be given");
  c.train.batch = rows;
  c.train.accumulate = 1;
  c.runtime.workers = ranks;
  const int64_t replica_rows = rows / (ranks / (c.parallel.tp_size * c.parallel.pp_stages));
  RunOptions opts;
  opts.progress = false;
  Measured out;
  comm::run_threads(ranks, [&](comm::Communicator& world) {
    Trainer trainer(c, opts, ranks == 1 ? nullptr : &world, &data);
    MemoryScope charged(trainer.ledger(), MemCategory::kOther);  // as Trainer::run charges it
    data::LoaderOptions lo;
    lo.batch = replica_rows;
    lo.drop_last = true;
    data::DataLoader loader(data.train, lo);
    loader.start_epoch(0);
    if (start) start->arrive_and_wait();
    std::vector<double> times, cpus;
    EvalResult sums;
    double timed = 0;
    for (int i = 0; steps > 0 ? i <= steps
                              : i <= kTimedSteps || (timed < kTimedSeconds && i <= kMaxTimedSteps);
         ++i) {
      data::Batch b;
      if (!loader.next(b)) loader.start_epoch(i), loader.next(b);
      b.global_size = rows;
      if (i == 1) trainer.ledger()->reset_peaks();
      const double t0 = now_seconds(), c0 = thread_cpu_seconds();
      trainer.step({b}, sums);
      if (i > 0) {
        times.push_back(now_seconds() - t0), timed += times.back();
        cpus.push_back(thread_cpu_seconds() - c0);
      }
    }
    if (world.rank() == 0)
      out = {median_of(times), median_of(cpus),
             static_cast<double>(trainer.ledger()->peak(MemCategory::kActivations))};
  });
  return out;
}

// Timed steps for a group of ranks at `rows` rows: as many as fill kTimedSeconds at half the
// one-rank time of those rows (measured before: fp32 without recompute; the groups measured run
// on 2 or more cores).
int group_steps(const Calibration& cal, int64_t rows) {
  const Calibration::Variant& v = cal.variant("fp32", "none");
  return steps_for((v.step_s_fixed + v.step_s_per_row * static_cast<double>(rows)) / 2);
}

// The same one-rank steps run by `copies` independent trainers at once (copies >= cores: every
// core busy, as ranks as threads keep them): the median thread CPU time of their steps over the
// lone one's. CPU time, not wall time: the copies' share of the cores is the planner's to divide
// (two copies to a core take twice as long at the same pace), what it needs is the pace, which
// a wall time would take from other processes' load (the copies' threads take a larger share of
// a loaded host than one: fashion_mlp's crowded pace measured 0.46-0.64 in wall time at load
// average 7). Each round times one alone, then the copies, started together, for as many steps
// each as fill kTimedSeconds at the pace of one (so that they end together too); the median of
// the rounds.
double pace_of(const Config& config, const data::Splits& data, int64_t rows, int copies,
               int cores) {
  const Config one = one_rank(config, "fp32", "none");
  std::vector<double> paces;
  for (int round = 0; round < kRounds; ++round) {
    const Measured alone = measure(one, data, rows);
    const int steps = steps_for(alone.step_s * copies / cores);
    std::barrier<> start(copies);
    std::vector<double> together(static_cast<size_t>(copies));
    std::vector<std::thread> threads;
    for (int k = 0; k < copies; ++k)
      threads.emplace_back([&, k] {
        together[static_cast<size_t>(k)] = measure(one, data, rows, 1, steps, &start).cpu_s;
      });
    for (std::thread& t : threads) t.join();
    paces.push_back(median_of(together) / std::max(1e-9, alone.cpu_s));
  }
  return median_of(paces);
}

// The bytes each block's forward keeps for the backward (fp32, no recompute), at `rows` rows:
// how a pipeline's stages share the activations; and the elements per row of each block's
// output (what a stage ending at it sends).
void block_activations(const nn::ModelSpec& spec, const data::Splits& data, int64_t rows,
                       Calibration& cal) {
  auto model = nn::build_model(spec);
  model->materialize(1);
  auto ledger = std::make_shared<MemoryLedger>();
  MemoryScope scope(ledger, MemCategory::kActivations);
  data::LoaderOptions lo;
  lo.batch = rows;
  data::DataLoader loader(data.train, lo);
  loader.start_epoch(0);
  data::Batch b;
  loader.next(b);
  nn::Activations acts;
  double before = 0;
  model->forward(b.x, nn::Context{}, &acts, [&](nn::Phase p, size_t) {
    if (p != nn::Phase::kAfterForward) return;
    const double now = static_cast<double>(ledger->current(MemCategory::kActivations));
    cal.block_act_bytes.push_back(now - before);
    before = now;
  });
  Tensor h = b.x;
  for (size_t i = 0; i < model->num_blocks(); ++i) {
    h = model->forward(h, nn::Context{}, nullptr, {}, i, i + 1);
    cal.block_out_width.push_back(static_cast<double>(h.numel()) / static_cast<double>(rows));
  }
}

// A ring all-reduce between two threads of this process at two sizes: alpha and beta.
std::pair<double, double> measure_link() {
  const size_t small = 1024, large = 1 << 20;  // floats
  std::vector<double> t_small, t_large;
  comm::run_threads(2, [&](comm::Communicator& c) {
    std::vector<float> buf(large, 1.0f);
    for (int i = 0; i < 12; ++i)
      for (size_t n : {small, large}) {
        c.barrier();
        const double t0 = now_seconds();
        c.allreduce(buf.data(), n, comm::ElemType::kF32);
        if (c.rank() == 0 && i >= 2) (n == small ? t_small : t_large).push_back(now_seconds() - t0);
      }
  });
  // ring_s(bytes, 2, 2, a, b) = 2 (a + bytes / (2 b))
  const double ts = median_of(t_small), tl = median_of(t_large);
  const double beta = static_cast<double>((large - small) * 4) / std::max(1e-9, tl - ts);
  return {std::max(0.0, ts / 2 - static_cast<double>(small * 4) / (2 * beta)), beta};
}

// What one rank does not show: a data-parallel group's fixed cost per step (the gradient
// exchange's start, barriers, the loader) and a pipeline hand-off's (a stage waiting for its
// peer's micro-batch). Each is what a run of `workers` ranks (dp = workers; dp = workers / 2 x
// pp = 2 with the most micro-batches plan offers) measures beyond the plan's prediction of it
// without them, that prediction scaled by the host's load of the moment (a one-rank run just
// before over the one-rank figures), so that load which came or went since those were measured
// does not count; the median over kRounds such pairs. Fitted on 2 ranks (cal.dp_step_s, handoff_s)
// and on twice as many ranks as cores (the _crowded ones: there a rank's waits leave its core to
// another rank, and what remains are the waits every rank shares).
void fit_group_costs(const Config& config, const data::Splits& data, int workers,
                     Calibration& cal) {
  const bool crowded = workers > cal.cores;
  double& dp_step_s = crowded ? cal.dp_step_crowded_s : cal.dp_step_s;
  double& handoff_s = crowded ? cal.handoff_crowded_s : cal.handoff_s;
  PlanOptions o;
  o.workers = workers;
  o.precisions = {"fp32"};
  const Config base = one_rank(config, "fp32", "none");
  // the layout of `pp` stages over all the ranks plan predicts for `base` now
  const auto find = [&](int pp) -> std::optional<Candidate> {
    std::optional<Candidate> out;
    for (Candidate& c : plan_layouts(base, o, cal)) {
      const parallel::ParallelSpec& s = c.spec;
      if (s.recompute != nn::Recompute::kNone || s.ps_servers > 0 || s.tp_size > 1 ||
          s.zero_stage > 0 || s.pp_stages != pp)
        continue;
      if (!out || s.pp_microbatches > out->spec.pp_microbatches) out = std::move(c);
    }
    return out;
  };
  const int64_t rows = config.train.batch;
  const Calibration::Variant& alone = cal.variant("fp32", "none");
  // the one-rank time of the moment over the figures, and the group's measured step
  const auto load = [&] {
    const double figures = alone.step_s_fixed + alone.step_s_per_row * static_cast<double>(rows);
    return measure(base, data, rows).step_s / std::max(1e-9, figures);
  };
  const auto run = [&](const Candidate& c) {
    Config group = base;
    group.parallel.pp_stages = c.spec.pp_stages;
    group.parallel.pp_microbatches = c.spec.pp_microbatches;
    return measure(group, data, rows, workers, group_steps(cal, rows)).step_s;
  };
  // what the group measures beyond its prediction at the load of the moment
  const auto beyond = [&](const Candidate& c) {
    std::vector<double> rounds;
    for (int round = 0; round < kRounds; ++round) {
      const double now = load();
      rounds.push_back(run(c) - c.time.total() * now);
    }
    return std::max(0.0, median_of(rounds));
  };
  if (const std::optional<Candidate> dp = find(1)) dp_step_s = beyond(*dp);
  if (const std::optional<Candidate> pp = find(2))  // predicted with dp_step_s just fitted
    handoff_s = beyond(*pp) / (2.0 * static_cast<double>(pp->spec.pp_microbatches));
}

// What a 2-way tensor-parallel group does not divide (replicated activations, the collectives'
// time): x at t = 2 is x1 (r + (1 - r) / 2). Its two ranks ran at once, at the pace of a busy
// host, so their time is first taken back to a core each. The time's share is the median of
// kRounds pairs of runs (one rank, then the group).
void fit_tp_shares(const Config& config, const data::Splits& data, int64_t rows, Calibration& cal) {
  try {
    const Config one = one_rank(config, "fp32", "none");
    Config pair = one;
    pair.parallel.tp_size = 2;
    const double shared = std::max(1.0, 2 * cal.contention / cal.cores);
    std::vector<double> shares;
    for (int round = 0; round < kRounds; ++round) {
      const Measured alone = measure(one, data, rows);
      const Measured two = measure(pair, data, rows, 2, group_steps(cal, rows));
      cal.tp_act_whole =
          std::clamp(2 * two.act_bytes / std::max(1.0, alone.act_bytes) - 1, 0.0, 1.0);
      shares.push_back(2 * two.step_s / shared / std::max(1e-9, alone.step_s) - 1);
    }
    cal.tp_time_whole = std::clamp(median_of(shares), 0.0, 1.0);
  } catch (const InvalidArgument&) {
    // a model tensor parallelism does not cut (a cnn): plan offers no tp layout for it
  }
}

// Every precision x recompute on one rank at `big` and `little` rows, fitted a + b x rows to
// the step's thread CPU time: its wall time on a quiet host, and what other processes' load
// moves far less (char_gpt's 32 rows: 30.6, 31.3 and 31.0 ms of CPU in three rounds at load
// average 7, while the wall time was 30.7, 63.0 and 77.2 ms). Load still moves it through the
// caches and memory it shares (fashion_mlp's 128 rows: 4.5 and 6.3 ms of CPU in two
// calibrations at load average 8), so each is the median of kRounds rounds, each round over all
// the variants (a burst of load falls on one round of several variants, not every round of one).
void fit_variants(const Config& config, const data::Splits& data, int64_t big, int64_t little,
                  Calibration& cal) {
  struct Runs {
    std::string precision, recompute;
    std::vector<double> big_s, little_s;
    Measured big, little;  // the last round's (activation bytes are the same every round)
  };
  std::vector<Runs> runs;
  for (const std::string precision : {"fp32", "bf16"})
    for (const std::string recompute : {"none", "selective", "full"})
      runs.push_back({precision, recompute, {}, {}, {}, {}});
  for (int round = 0; round < kRounds; ++round)
    for (Runs& r : runs) {
      const Config one = one_rank(config, r.precision, r.recompute);
      r.big = measure(one, data, big);
      r.little = measure(one, data, little);
      r.big_s.push_back(r.big.cpu_s);
      r.little_s.push_back(r.little.cpu_s);
      log_debug("plan: ", r.precision, " ", r.recompute, " at ", big, " rows: wall ",
                1e3 * r.big.step_s, " ms, thread CPU ", 1e3 * r.big.cpu_s, " ms");
    }
  const double span = static_cast<double>(std::max<int64_t>(1, big - little));
  for (const Runs& r : runs) {
    Calibration::Variant v{r.precision, r.recompute, big};
    const double at_big = median_of(r.big_s), at_little = median_of(r.little_s);
    v.step_s_per_row = std::max(0.0, (at_big - at_little) / span);
    v.step_s_fixed = std::max(0.0, at_big - v.step_s_per_row * static_cast<double>(big));
    v.act_bytes_per_row = std::max(0.0, (r.big.act_bytes - r.little.act_bytes) / span);
    v.act_bytes_fixed =
        std::max(0.0, r.big.act_bytes - v.act_bytes_per_row * static_cast<double>(big));
    cal.variants.push_back(v);
  }
}

Calibration measure_all(const Config& config, const data::Splits& data) {
  Calibration cal;
  cal.host = host_name() + " " + ops::isa_description();
  cal.cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  nn::ModelSpec spec = config.model;
  spec.input_shape = data.train->input_shape();
  spec.num_classes = data.train->num_classes();
  cal.input_shape = spec.input_shape;
  cal.num_classes = spec.num_classes;
  const auto model = nn::build_model(spec);
  cal.arena_numel = static_cast<double>(model->arena_numel());
  for (size_t b = 0; b < model->num_blocks(); ++b)
    cal.block_flops.push_back(model->block(b).forward_flops(1));
  const int64_t big = config.train.batch, little = std::max<int64_t>(1, big / 4);
  double since = now_seconds();  // each part's wall time, for TESSEL_LOG=debug
  const auto took = [&](const char* part) {
    log_debug("plan: calibrated ", part, " in ", now_seconds() - since, " s");
    since = now_seconds();
  };
  block_activations(spec, data, big, cal);
  fit_variants(config, data, big, little, cal);
  took("the one-rank variants");
  // Recompute reruns forwards: a variant measured faster than its precision without recompute
  // measured noise (a busy host), so it costs at least as much.
  for (Calibration::Variant& v : cal.variants) {
    const Calibration::Variant& none = cal.variant(v.precision, "none");
    v.step_s_per_row = std::max(v.step_s_per_row, none.step_s_per_row);
    v.step_s_fixed = std::max(v.step_s_fixed, none.step_s_fixed);
  }
  std::vector<double> alphas, betas;  // kRounds of the link, each figure's median
  for (int round = 0; round < kRounds; ++round) {
    const auto [alpha, beta] = measure_link();
    alphas.push_back(alpha);
    betas.push_back(beta);
  }
  cal.link_latency_s = median_of(alphas);
  cal.link_bytes_per_s = median_of(betas);
  if (cal.cores > 1)
    cal.contention = std::max(1.0, pace_of(config, data, big, cal.cores, cal.cores));
  // Twice as many ranks as cores, at the rows each then runs: a rank waiting for a peer leaves
  // its core to another (the host's pace with its waits filled). Measured on small hosts only
  // (kCrowdedCoresMax), where layouts of more ranks than cores are the common case; a larger
  // one takes its uncrowded figures rather than run 2 x cores replicas of the model.
  const int crowd = 2 * cal.cores;
  const bool small_host = cal.cores <= kCrowdedCoresMax;
  cal.contention_crowded =
      small_host ? pace_of(config, data, std::max<int64_t>(1, big / crowd), crowd, cal.cores)
                 : cal.contention;
  took("the link and the paces");
  fit_tp_shares(config, data, big, cal);
  took("the tensor-parallel shares");
  for (int workers : {2, 2 * cal.cores}) {
    if (workers > 2 && !small_host) break;
    try {
      fit_group_costs(config, data, workers, cal);
    } catch (const InvalidArgument&) {
      // no layout of that many ranks runs this config (a batch of fewer rows): none to fit
    }
  }
  took("the group costs");
  if (!small_host) {
    cal.dp_step_crowded_s = cal.dp_step_s;
    cal.handoff_crowded_s = cal.handoff_s;
  }
  return cal;
}

}  // namespace

double median_of(std::vector<double> values) {
  TESSEL_CHECK(!values.empty(), "plan: the median of no measurement");
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid)) +
          upper) /
         2;
}

const Calibration::Variant& Calibration::variant(const std::string& precision,
                                                 const std::string& recompute) const {
  // fp16 computes through the same 16-bit kernels as bf16 (docs/mixed_precision.md)
  const std::string p = precision == "fp16" ? "bf16" : precision;
  for (const Variant& v : variants)
    if (v.precision == p && v.recompute == recompute) return v;
  throw InvalidArgument(str("plan: no calibration for train.precision = ", precision,
                            " with train.recompute = ", recompute,
                            "; delete the cached calibration to measure again"));
}

// Every field under its own name (the cache file's format).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Calibration::Variant, precision, recompute, rows, step_s_fixed,
                                   step_s_per_row, act_bytes_fixed, act_bytes_per_row)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Calibration, host, variants, block_flops, block_act_bytes,
                                   block_out_width, tp_act_whole, tp_time_whole, dp_step_s,
                                   handoff_s, dp_step_crowded_s, handoff_crowded_s, link_latency_s,
                                   link_bytes_per_s, contention, contention_crowded, cores, seconds,
                                   arena_numel, input_shape, num_classes)

json Calibration::to_json() const { return *this; }

Calibration Calibration::from_json(const json& j) { return j.get<Calibration>(); }

std::string default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (std::filesystem::path(x) / "tessel" / "plan").string();
  const char* home = std::getenv("HOME");
  return (std::filesystem::path(home && *home ? home : ".") / ".cache" / "tessel" / "plan")
      .string();
}

Calibration calibrate(const Config& config, const std::string& cache_dir) {
  std::string isa = ops::isa_name(ops::isa());
  const std::filesystem::path path = std::filesystem::path(cache_dir) /
                                     str(host_name(), "-", isa, "-", model_key(config), ".json");
  if (std::ifstream f(path); f) {
    try {
      return Calibration::from_json(json::parse(f));
    } catch (const std::exception&) {
      // unreadable (an older format, cut short): measured again below and rewritten
    }
  }
  const double start = now_seconds();
  Calibration cal = measure_all(config, data::make_datasets(config.data));
  cal.seconds = now_seconds() - start;
  log_info("plan: calibrated ", name_of(config.model.kind), " on this machine in ",
           std::round(cal.seconds * 10) / 10, " s (", kRounds, " rounds a figure), cached in ",
           path.string());
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  if (ec)
    throw IoError(str("plan: cannot create the calibration cache ", cache_dir, ": ", ec.message(),
                      "; pass --cache-dir with a writable folder"));
  ckpt::write_file_atomic(path.string(), cal.to_json().dump(2));
  return cal;
}

}  // namespace tessel::train
