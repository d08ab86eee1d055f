// Config: the whole description of a training run, read from a TOML file plus --set
// overrides. Every key has a type, a default, a one-line doc and, if it is a number, the range
// it accepts (docs/config.md lists them all; a test keeps the two in step). Unknown keys fail
// naming the nearest valid key; bad values fail naming the key, the value and what is allowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tessel/comm/types.h"
#include "tessel/core/names.h"
#include "tessel/data/dataset.h"
#include "tessel/nn/models.h"
#include "tessel/optim/optimizer.h"
#include "tessel/optim/schedule.h"
#include "tessel/parallel/spec.h"

namespace tessel::train {

struct TrainSpec {
  int64_t epochs = 10;
  int64_t batch = 128;     // global batch size
  int64_t max_steps = 0;   // 0: epochs x batches per epoch; else stop (and end the schedule) here
  float clip_norm = 0.0f;  // global-norm clipping, 0 = off
  int64_t base_batch = 0;  // linear scaling rule: lr x batch / base_batch; 0 = off
  int64_t accumulate = 1;  // micro-batches (of `batch` rows) summed per optimizer step
  bool shuffle = true;
  bool drop_last = false;
  int prefetch = -1;        // batches loaded ahead by a background thread; -1: auto
  int64_t log_every = 50;   // steps between progress lines / metrics records
  bool eval_train = false;  // also evaluate on the training set after each epoch
  int max_restarts = 0;     // ranks as threads: restarts after a rank failure (recovery.h)
};

// What a run records for people to look at besides metrics.jsonl (docs/observability.md).
struct ObserveSpec {
  bool trace = false;                // train.trace: trace.json of the trace.steps window
  std::string trace_steps = "5:25";  // trace.steps: steps A to B - 1
  bool tensorboard = false;          // metrics.tensorboard: TensorBoard event files
};

struct CheckpointSpec {
  int64_t every_epochs = 1;  // 0 = never by epoch
  int64_t every_steps = 0;   // 0 = never by step
  int keep_last = 2;
  int64_t snapshot_steps = 0;  // ranks as threads: in-memory snapshot every N steps (0 = never)
};

// debug.fail_mode: how the injected failure fails (recovery.h).
enum class FailMode : uint8_t { kThrow, kKill, kHang, kStop };

// debug.fail_*: a failure injected at a step boundary, to test recovery (recovery.h).
struct FaultSpec {
  int fail_rank = -1;                     // world rank that fails, -1: none
  int64_t fail_step = 0;                  // right after this step (1-based)
  FailMode fail_mode = FailMode::kThrow;  // throw | kill | hang | stop
};

// runtime.backend: the ranks as threads of this process, or as MPI processes; auto: mpi when an
// MPI launcher started the process (resolve_backend).
enum class BackendChoice : uint8_t { kAuto, kThreads, kMpi };

struct RuntimeSpec {
  int threads = 1;  // BLAS threads for this process (1 per rank when ranks are threads)
  int workers = 1;  // ranks as threads of this process (--workers); 1 under mpirun
  BackendChoice backend = BackendChoice::kAuto;
};

struct CommSpec {
  double timeout_s = 300;                              // deadline of every blocking communication
  comm::Algorithm algorithm = comm::Algorithm::kAuto;  // collective algorithm (comm/types.h)
};

// layout: manual (the layout keys as given) or auto (tessel plan's pick: plan_auto.h).
enum class LayoutMode : uint8_t { kManual, kAuto };

// tessel predict, generation and tessel serve (docs/inference.md).
struct InferSpec {
  int64_t chunk_rows = 1024;    // rows per chunk: the unit handed to a worker and committed
  int64_t batch = 128;          // rows (prompts) per forward pass within a chunk
  int64_t top_k = 5;            // classes listed with their probabilities per output row
  double chunk_timeout_s = 60;  // a worker holding a chunk longer is stalled: others re-run it
  double commit_every_s = 1;    // predict: seconds between commits of the output (--resume point)
  int64_t max_new_tokens = 32;  // gpt: tokens generated per prompt
  float temperature = 0.0f;     // gpt: 0 greedy, else sampling at this temperature
  int64_t sample_top_k = 0;     // gpt: sample among the k most likely tokens (0: all)
  bool kv_cache = true;         // gpt: keep keys and values instead of recomputing the context
  int64_t kill_rank = -1;       // debug.kill_rank: this predict worker dies (-1: none)
  int64_t kill_after = 0;       // debug.kill_after: ... after finishing this many chunks
};

struct ServeSpec {
  std::string host = "127.0.0.1";  // address to listen on (loopback: this machine only)
  int64_t max_batch = 64;          // rows per batch the workers run
  double max_wait_ms = 0;          // a request waits at most this long for others to batch with
  int64_t max_queue = 4096;        // rows waiting; more get 503
  int64_t max_body_kb = 4096;      // larger request bodies get 413
  int64_t connections = 128;       // HTTP connections open at once; more get 503
  int64_t io_threads = 1;          // threads reading and writing HTTP (apart from the workers)
  double timeout_s = 30;           // unanswered: 504; unread: 408; idle connection: closed
  int64_t max_sequences = 32;      // gpt: sequences generating together (continuous batching)
  int64_t max_step_tokens = 256;   // gpt: rows (prompt and new tokens) in one generation step
};

struct Config {
  std::string name;  // run name; default: the config file's stem
  uint64_t seed = 0;
  LayoutMode layout = LayoutMode::kManual;
  nn::ModelSpec model;
  data::DataSpec data;
  optim::OptimSpec optim;
  optim::ScheduleSpec schedule;
  TrainSpec train;
  CheckpointSpec checkpoint;
  ObserveSpec observe;  // keys train.trace, trace.steps, metrics.tensorboard
  RuntimeSpec runtime;
  CommSpec comm;
  InferSpec infer;
  ServeSpec serve;
  parallel::ParallelSpec parallel;  // sections ddp, zero, pp, ps, debug (and train.deterministic,
                                    // runtime.memory_limit_mb)
  FaultSpec fault;                  // debug.fail_*
};

// Reads and validates a config file; overrides are "section.key=value" (value in TOML syntax,
// bare words taken as strings). Throws InvalidArgument / IoError with a message for the user.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The config of a resumed run: the run's own (run_config, its RUN/config.toml) with `overrides`
// (--set and the like) laid over it. `changed` gets a line for each override that changes a
// value, one for each key the file `path` gives another value (the run's stays), and a note
// when the learning-rate schedule's length changes.
Config load_resume_config(const std::string& run_config, const std::string& path,
                          const std::vector<std::string>& overrides,
                          std::vector<std::string>* changed);
Config parse_config(const std::string& toml_text, const std::string& name,
                    const std::vector<std::string>& overrides = {});
// The resolved config (every key, defaults included) as TOML, written into each run folder.
std::string to_toml(const Config& config);
// A config file (and each --set value) larger than this, or whose tables, keys and arrays nest
// deeper than kMaxConfigDepth, is refused before the TOML parser reads it (docs/config.md).
constexpr size_t kMaxConfigBytes = size_t{1} << 20;
constexpr int kMaxConfigDepth = 16;

// One config key as docs/config.md lists it.
struct KeyInfo {
  std::string path;   // "section.key", or "key" for top-level keys
  std::string doc;    // one line
  std::string type;   // boolean, integer, number, string or integer array
  std::string range;  // the values allowed: "[1, 1000000]", "(0, 0.5]", "gpipe, 1f1b"; "" any
};
// Every valid key, in the order of docs/config.md.
std::vector<KeyInfo> config_keys();
// trace.steps "A:B" -> steps [A, B); throws InvalidArgument for anything else.
std::pair<int64_t, int64_t> parse_step_window(const std::string& text);
// train.prefetch as run: `requested` unless -1 (auto), which is 2 when the host's `cores`
// leave one spare beyond its ranks x BLAS threads, else 0 (a loader thread on a busy core
// preempts a rank, and every rank of a step waits for the slowest).
int resolve_prefetch(int requested, int ranks_on_host, int blas_threads, int cores);

// The backend train and predict use for `config`: runtime.backend, where "auto" means mpi when
// an MPI launcher started the process (under_mpi). Throws InvalidArgument for
// runtime.workers > 1 on mpi (ranks are processes there).
comm::Backend resolve_backend(const Config& config, bool under_mpi);

}  // namespace tessel::train

namespace tessel {
TESSEL_NAMES(train::FailMode, "throw", "kill", "hang", "stop");
TESSEL_NAMES(train::BackendChoice, "auto", "threads", "mpi");
TESSEL_NAMES(train::LayoutMode, "manual", "auto");
}  // namespace tessel
