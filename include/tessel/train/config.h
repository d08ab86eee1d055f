// Config: the whole description of a training run, read from a TOML file plus --set
// overrides. Every key has a type, a default and a one-line doc (docs/config.md lists them all;
// a test keeps the two in step). Unknown keys fail naming the nearest valid key; bad values
// fail naming the key, the value and what is allowed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/data/dataset.h"
#include "tessel/nn/models.h"
#include "tessel/optim/optimizer.h"
#include "tessel/optim/schedule.h"
#include "tessel/parallel/spec.h"

namespace tessel::train {

struct TrainSpec {
  int64_t epochs = 10;
  int64_t batch = 128;        // global batch size
  int64_t max_steps = 0;      // 0: epochs x batches per epoch; else stop (and end the schedule) here
  float clip_norm = 0.0f;     // global-norm clipping, 0 = off
  int64_t base_batch = 0;     // linear scaling rule: lr x batch / base_batch; 0 = off
  int64_t accumulate = 1;     // micro-batches (of `batch` rows) summed per optimizer step
  bool shuffle = true;
  bool drop_last = false;
  int prefetch = -1;          // batches loaded ahead by a background thread; -1: auto
  int64_t log_every = 50;     // steps between progress lines / metrics records
  bool eval_train = false;    // also evaluate on the training set after each epoch
};

// What a run records for people to look at besides metrics.jsonl (docs/observability.md).
struct ObserveSpec {
  bool trace = false;                // train.trace: trace.json of the trace.steps window
  std::string trace_steps = "5:25";  // trace.steps: steps A to B - 1
  bool tensorboard = false;          // metrics.tensorboard: TensorBoard event files
};

struct CheckpointSpec {
  int64_t every_epochs = 1;   // 0 = never by epoch
  int64_t every_steps = 0;    // 0 = never by step
  int keep_last = 2;
};

struct RuntimeSpec {
  int threads = 1;            // BLAS threads for this process (1 per rank when ranks are threads)
  int workers = 1;            // ranks as threads of this process (--workers); 1 under mpirun
  std::string backend = "auto";  // auto | threads | mpi (auto: mpi when started by mpirun)
};

struct CommSpec {
  double timeout_s = 300;     // deadline of every blocking communication
  std::string algorithm = "auto";  // collective algorithm: auto | ring | halving_doubling | tree | direct | native
};

struct Config {
  std::string name;           // run name; default: the config file's stem
  uint64_t seed = 0;
  nn::ModelSpec model;
  data::DataSpec data;
  optim::OptimSpec optim;
  optim::ScheduleSpec schedule;
  TrainSpec train;
  CheckpointSpec checkpoint;
  ObserveSpec observe;  // keys train.trace, trace.steps, metrics.tensorboard
  RuntimeSpec runtime;
  CommSpec comm;
  parallel::ParallelSpec parallel;  // sections ddp, zero, pp, ps, debug (and train.deterministic,
                                    // runtime.memory_limit_mb)
};

// Reads and validates a config file; overrides are "section.key=value" (value in TOML syntax,
// bare words taken as strings). Throws InvalidArgument / IoError with a message for the user.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
Config parse_config(const std::string& toml_text, const std::string& name,
                    const std::vector<std::string>& overrides = {});
// The resolved config (every key, defaults included) as TOML, written into each run folder.
std::string to_toml(const Config& config);
// Every valid key, "section.key" (top-level keys without a section), with its one-line doc.
std::vector<std::pair<std::string, std::string>> config_keys();
// train.prefetch as run: `requested` unless -1 (auto), which is 2 when the host's `cores`
// leave one spare beyond its ranks x BLAS threads, else 0 (a loader thread on a busy core
// preempts a rank, and every rank of a step waits for the slowest).
int resolve_prefetch(int requested, int ranks_on_host, int blas_threads, int cores);

}  // namespace tessel::train
