// The planner behind `tessel plan`: every layout of N ranks a config could train with (dp x pp x
// tp, ZeRO stage, parameter servers, precision, recompute, micro-batches), each with its
// predicted memory per rank by category and its step time split into compute, exposed
// communication and pipeline bubble, ranked by samples/s. Validity is train's own: a layout
// the engine refuses (Layout::resolve, the pipeline partition, the tensor-parallel cut of the
// model) is never offered. Memory comes from the parameter arena the engine would lay out
// (the model built without memory, cut into units as the engine cuts it) and one table of the
// bytes each allocation site holds per element; activations and compute from a short
// calibration of this machine's kernels on the model's shapes (plan_calibrate.cc, cached);
// the pipeline's bubble from the schedule's bubble_model. plan_scale.h is the same arithmetic
// for a GPT on paper (sizes beyond this machine). Pure functions; nothing here trains.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/config/config.h"
#include "tessel/core/memory.h"
#include "tessel/parallel/spec.h"

namespace tessel::train {

// Bytes one rank holds, by ledger category (parameters .. communication buffers).
struct MemoryBytes {
  std::array<double, kMemCategories> bytes{};
  double& operator[](MemCategory c) { return bytes[static_cast<size_t>(c)]; }
  double operator[](MemCategory c) const { return bytes[static_cast<size_t>(c)]; }
  double total() const;
  // The category holding the most bytes (what to shrink first when a cap is passed).
  MemCategory largest() const;
};

// One step's predicted time on the busiest rank.
struct StepTime {
  double compute = 0;  // forward, backward and optimizer
  double comm = 0;     // communication the computation does not hide
  double bubble = 0;   // pipeline stages idle while the others fill and drain
  // Of comm, the group's measured waits (Calibration's dp_step_s and handoff_s): on a crowded
  // host the waits no other rank's work fills.
  double sync = 0;
  double total() const { return compute + comm + bubble; }
};

// What the rows of a model cost on this machine (plan_calibrate.cc), per precision x recompute.
struct Calibration {
  struct Variant {
    std::string precision, recompute;
    int64_t rows = 0;            // rows per timed step (two sizes fitted: a + b x rows)
    double step_s_fixed = 0;     // optimizer and per-step costs over the whole arena
    double step_s_per_row = 0;   // forward + backward
    double act_bytes_fixed = 0;  // peak activation bytes: a + b x rows
    double act_bytes_per_row = 0;
  };
  std::string host;  // hostname and ISA the figures were measured on
  std::vector<Variant> variants;
  std::vector<double> block_flops;      // forward flops of each block per row (stage time)
  std::vector<double> block_act_bytes;  // bytes each block keeps for the backward (stage memory)
  std::vector<double> block_out_width;  // elements per row of each block's output (stage sends)
  // The share of activations and of step time a tensor-parallel group does not divide (from a
  // 2-way group here): x_t = x_1 (whole + (1 - whole) / t).
  double tp_act_whole = 0, tp_time_whole = 0;
  // What a 2-rank run takes beyond the prediction from one rank's figures: per step of a
  // data-parallel group, and per pipeline message (a hand-off between stages on a busy host);
  // and what a run of twice as many ranks as cores takes (dp = 2 cores; dp = cores x pp = 2):
  // the waits every rank shares, which no other rank's work fills.
  double dp_step_s = 0, handoff_s = 0;
  double dp_step_crowded_s = 0, handoff_crowded_s = 0;
  double link_latency_s = 0;  // alpha-beta of this host's threads transport (ring)
  double link_bytes_per_s = 0;
  // A rank's step time with every core busy over its time alone (shared memory bandwidth,
  // whatever else runs here): ranks on one host run at that pace. With twice as many ranks as
  // cores (each at the rows it then runs) the host's pace per core's share of them: their waits
  // for one another leave the cores to the other ranks.
  double contention = 1, contention_crowded = 1;
  int cores = 1;           // hardware threads here: ranks beyond them share cores
  double seconds = 0;      // the calibration's wall time
  double arena_numel = 1;  // the whole model's arena elements (one rank)
  Shape input_shape;       // the dataset's, which shapes the model
  int64_t num_classes = 0;
  const Variant& variant(const std::string& precision, const std::string& recompute) const;
  nlohmann::json to_json() const;
  static Calibration from_json(const nlohmann::json& j);
};

struct PlanOptions {
  int workers = 1;              // ranks to lay out
  int64_t memory_per_rank = 0;  // bytes each rank may hold (0: no cap)
  int hosts = 1;                // hosts the ranks are spread over (dp crosses hosts first)
  double bandwidth = 0;         // bytes/s between hosts (0: this host's measured link)
  double latency = 0;           // seconds per message between hosts
  std::vector<std::string> precisions = {"fp32", "bf16"};  // train.precision values to try
};

struct Candidate {
  std::vector<std::string> sets;  // the --set overrides that select this layout
  std::string layout;             // Layout::str(), e.g. "dp=2 pp=2"
  parallel::ParallelSpec spec;
  MemoryBytes memory;  // the fullest rank's
  StepTime time;
  double samples_per_s = 0;
  std::string overflow;  // the largest category when past memory_per_rank ("": fits)
};

// Throws InvalidArgument naming the flag for options that lay out nothing (workers < 1, hosts
// that do not divide them, several hosts without --bandwidth).
void check_options(const PlanOptions& options);

// Calibrates `config`'s model on this machine (char_gpt, fashion_mlp, fashion_cnn 25-40 s each on
// 2 cores at load average 8-9, each figure the median of 3 rounds; logs the time) or reads the
// figures from cache_dir/<host>-<isa>-<model hash>.json; writes them there after measuring.
Calibration calibrate(const Config& config, const std::string& cache_dir);
// ~/.cache/tessel/plan (XDG_CACHE_HOME/tessel/plan when set).
std::string default_cache_dir();
// The median of repeated measurements (the mean of the middle two for an even count): how the
// calibration keeps each time figure of its rounds, so that a burst of load during one round
// does not move it. Throws for no values.
double median_of(std::vector<double> values);

// Every valid layout of options.workers ranks, predicted: the feasible ones by samples/s, then
// the others by total memory. Throws InvalidArgument for options that lay out nothing.
std::vector<Candidate> plan_layouts(const Config& config, const PlanOptions& options,
                                    const Calibration& calibration);

// Model-state bytes per element of the arena by category, and the ZeRO stage from which each
// part is sharded over the dp group: one table for the engine's allocation sites (precision
// and optimizer given) and for published accountings (plan_scale.h).
struct StateTerm {
  MemCategory category;
  double bytes = 0;            // per element
  int sharded_from = 4;        // zero.stage from which a rank holds only its shard (4: never)
  bool before_stage3 = false;  // held below stage 3 only (the 16-bit working copy)
};
std::vector<StateTerm> engine_state_terms(parallel::Precision precision,
                                          optim::OptimKind optimizer);
// Sums the terms at `stage` for a rank holding `whole` arena elements of which `shard` are its.
MemoryBytes state_bytes(const std::vector<StateTerm>& terms, int stage, double whole, double shard);

// Seconds of a ring over p ranks (alpha per message, beta bytes/s) moving `bytes`, the whole
// buffer, `passes` times over its p - 1 steps: all-reduce 2, reduce-scatter and all-gather 1.
double ring_seconds(double bytes, int p, double passes, double alpha, double beta);

// The bubble of a pipeline's slowest stage (`slowest`, of the stages' compute per step): it idles
// while the others fill and drain the schedule, f / (1 - f) times their mean compute (f:
// bubble_model's idle share for equal stages; equal stages give f / (1 - f) of its own).
double pipeline_bubble(const std::vector<double>& stage_compute, size_t slowest, double f);

// The step of the slowest rank when `ranks_here` ranks share this host's cores: at least the
// host's work (every rank's compute on cores of their own, `host_work` seconds) over its cores
// at the measured pace (Calibration::contention; beyond one rank a core,
// contention_crowded), less what the rank waits through meanwhile (its bubble; with more ranks
// than cores its exposed communication too, but for `sync`, the cores then running other ranks).
StepTime share_host(StepTime slowest, double host_work, int ranks_here, const Calibration& cal);

// Feasible first, fastest first (as fast to 0.1%: the smaller first), then the others
// smallest first.
void rank_candidates(std::vector<Candidate>& plan);

// "z1 bf16 rc=full m=4": the keys beyond the mesh a layout sets (the table's options column).
std::string options_str(const parallel::ParallelSpec& spec);
// Bytes as the table shows them: "2.8M", "33.5G".
std::string size_str(double bytes);

nlohmann::json plan_json(const std::vector<Candidate>& plan, const PlanOptions& options);
std::string plan_table(const std::vector<Candidate>& plan, const PlanOptions& options);

}  // namespace tessel::train
