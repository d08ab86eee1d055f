#include "tessel/train/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "config_suggest.h"
#include "tessel/core/error.h"
#include "tessel/train/run_trace.h"

namespace tessel::train {
namespace {

// One config key: where it lives, how to read it from TOML and how to print it back.
struct Key {
  std::string path;  // "section.key" or "key"
  std::string doc;
  std::function<void(Config&, const toml::node&)> set;
  std::function<std::string(const Config&)> get;
};

std::string type_error(const std::string& path, const char* want, const toml::node& v) {
  std::ostringstream os;
  os << "config: " << path << " must be " << want << ", got ";
  v.visit([&os](auto&& x) { os << x; });
  return os.str();
}

template <typename T>
T read_value(const std::string& path, const toml::node& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw InvalidArgument(type_error(path, "true or false", v));
    return *v.value<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_integer()) throw InvalidArgument(type_error(path, "an integer", v));
    int64_t x = *v.value<int64_t>();
    if (std::is_unsigned_v<T> && x < 0) throw InvalidArgument(type_error(path, "an integer >= 0", v));
    return static_cast<T>(x);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) throw InvalidArgument(type_error(path, "a number", v));
    return static_cast<T>(*v.value<double>());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw InvalidArgument(type_error(path, "a string", v));
    return *v.value<std::string>();
  } else {
    static_assert(std::is_same_v<T, std::vector<int64_t>>);
    const toml::array* a = v.as_array();
    if (a == nullptr) throw InvalidArgument(type_error(path, "an array of integers", v));
    T out;
    for (const toml::node& e : *a) {
      if (!e.is_integer()) throw InvalidArgument(type_error(path, "an array of integers", v));
      out.push_back(*e.value<int64_t>());
    }
    return out;
  }
}

template <typename T>
std::string write_value(const T& x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(x);
  } else if constexpr (std::is_floating_point_v<T>) {
    // The shortest text that reads back as the same T: a float key set to 0.1 prints 0.1.
    char buf[64];
    std::string s(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
    return s;
  } else if constexpr (std::is_same_v<T, std::string>) {
    std::ostringstream os;
    os << toml::value<std::string>(x);
    return os.str();
  } else {
    std::string s = "[";
    for (size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + std::to_string(x[i]);
    return s + "]";
  }
}

template <typename Access>
Key make_key(std::string path, std::string doc, Access access) {
  using T = std::remove_reference_t<decltype(access(std::declval<Config&>()))>;
  return Key{path, std::move(doc),
             [path, access](Config& c, const toml::node& v) { access(c) = read_value<T>(path, v); },
             [access](const Config& c) { return write_value(access(const_cast<Config&>(c))); }};
}

#define TESSEL_KEY(path, member, doc) \
  make_key(path, doc, [](Config& c) -> auto& { return c.member; })

const std::vector<Key>& registry() {
  static const std::vector<Key> keys = {
      TESSEL_KEY("name", name, "run name; default: the config file name without .toml"),
      TESSEL_KEY("seed", seed, "seed of parameter init, data shuffle and dropout"),
      TESSEL_KEY("model.kind", model.kind, "mlp | cnn | gpt"),
      TESSEL_KEY("model.hidden", model.hidden, "mlp: hidden layer widths"),
      TESSEL_KEY("model.activation", model.activation, "mlp: relu | gelu"),
      TESSEL_KEY("model.dropout", model.dropout, "mlp/cnn: dropout after hidden activations"),
      TESSEL_KEY("model.channels", model.channels, "cnn: output channels of each conv block"),
      TESSEL_KEY("model.kernel", model.kernel, "cnn: convolution kernel size (padding k/2)"),
      TESSEL_KEY("model.fc_hidden", model.fc_hidden, "cnn: width of the hidden fully connected layer"),
      TESSEL_KEY("model.layers", model.layers, "gpt: transformer blocks"),
      TESSEL_KEY("model.heads", model.heads, "gpt: attention heads (must divide embed)"),
      TESSEL_KEY("model.embed", model.embed, "gpt: embedding width"),
      TESSEL_KEY("data.kind", data.kind, "fashion_mnist | mnist_idx | spiral | text | synthetic"),
      TESSEL_KEY("data.path", data.path, "IDX folder (fashion_mnist, mnist_idx) or text file (text)"),
      TESSEL_KEY("data.flatten", data.flatten, "idx: images as [784] (true) or [1,28,28] (false)"),
      TESSEL_KEY("data.mean", data.mean, "idx: input normalisation x = (pixel/255 - mean) / std"),
      TESSEL_KEY("data.std", data.std, "idx: input normalisation scale"),
      TESSEL_KEY("data.classes", data.classes, "spiral/synthetic: number of classes"),
      TESSEL_KEY("data.points_per_class", data.points_per_class, "spiral: points per class"),
      TESSEL_KEY("data.noise", data.noise, "spiral: angular noise"),
      TESSEL_KEY("data.context", data.context, "text: tokens per sample (GPT context length)"),
      TESSEL_KEY("data.test_fraction", data.test_fraction, "text/spiral/synthetic: share held out for test"),
      TESSEL_KEY("data.samples", data.samples, "synthetic: number of samples"),
      TESSEL_KEY("data.features", data.features, "synthetic: features per sample"),
      TESSEL_KEY("data.seed", data.seed, "spiral/synthetic: seed of the generated data"),
      TESSEL_KEY("optim.kind", optim.kind, "sgd | adamw"),
      TESSEL_KEY("optim.lr", optim.lr, "base learning rate (> 0)"),
      TESSEL_KEY("optim.weight_decay", optim.weight_decay, "sgd: L2 penalty; adamw: decoupled decay"),
      TESSEL_KEY("optim.momentum", optim.momentum, "sgd: momentum in [0, 1)"),
      TESSEL_KEY("optim.nesterov", optim.nesterov, "sgd: Nesterov momentum"),
      TESSEL_KEY("optim.beta1", optim.beta1, "adamw: first moment decay"),
      TESSEL_KEY("optim.beta2", optim.beta2, "adamw: second moment decay"),
      TESSEL_KEY("optim.eps", optim.eps, "adamw: denominator epsilon"),
      TESSEL_KEY("schedule.kind", schedule.kind, "constant | step | cosine"),
      TESSEL_KEY("schedule.warmup_steps", schedule.warmup_steps, "linear warm-up steps"),
      TESSEL_KEY("schedule.warmup_start", schedule.warmup_start, "warm-up starts at lr x this"),
      TESSEL_KEY("schedule.step_size", schedule.step_size, "step: steps between decays"),
      TESSEL_KEY("schedule.gamma", schedule.gamma, "step: decay factor"),
      TESSEL_KEY("schedule.min_lr", schedule.min_lr, "cosine: final learning rate"),
      TESSEL_KEY("train.epochs", train.epochs, "passes over the training set"),
      TESSEL_KEY("train.batch", train.batch, "global batch size"),
      TESSEL_KEY("train.max_steps", train.max_steps, "stop after this many steps (0: epochs decide); with ps.mode async or ssp a step is workers x worker batches, whoever trains them"),
      TESSEL_KEY("train.clip_norm", train.clip_norm, "global gradient-norm clipping (0: off)"),
      TESSEL_KEY("train.base_batch", train.base_batch, "linear scaling rule: lr x batch / base_batch (0: off)"),
      TESSEL_KEY("train.accumulate", train.accumulate, "micro-batches summed per optimizer step (gradient accumulation); must be 1 with ps.mode async or ssp"),
      TESSEL_KEY("train.deterministic", parallel.deterministic, "bit-identical results for any worker count (fixed micro-shards, exact integer reduction)"),
      TESSEL_KEY("train.shuffle", train.shuffle, "shuffle the training set each epoch"),
      TESSEL_KEY("train.drop_last", train.drop_last, "drop a short last batch"),
      TESSEL_KEY("train.prefetch", train.prefetch, "batches loaded ahead by a background thread (0: none; -1: 2 when this host has a spare core for it, else 0)"),
      TESSEL_KEY("train.log_every", train.log_every, "steps between progress lines and metrics records"),
      TESSEL_KEY("train.eval_train", train.eval_train, "also evaluate on the training set each epoch"),
      TESSEL_KEY("train.max_restarts", train.max_restarts, "ranks as threads: after a rank fails (an error, an injected fault, a rank stalled past comm.timeout_s), restart every rank from the newest in-memory snapshot or checkpoint, up to this many times (0: the run fails); under MPI use tessel launch --max-restarts"),
      TESSEL_KEY("train.precision", parallel.precision, "fp32, bf16 or fp16: the type of activations, activation gradients, the parameter copy the blocks read and gradient messages; GEMMs in it with f32 sums; master weights, optimizer state, losses and norms f32; fp16 adds dynamic loss scaling (docs/mixed_precision.md)"),
      TESSEL_KEY("train.recompute", parallel.recompute, "none, full or selective: full keeps only each block's input and reruns its forward during the backward; selective drops the large cheap tensors (attention probabilities, GELU outputs) and recomputes them (docs/recompute.md)"),
      TESSEL_KEY("train.trace", observe.trace, "write trace.json, a per-rank timeline of the trace.steps window in Trace Event Format (Perfetto, chrome://tracing), into the run folder (also --trace)"),
      TESSEL_KEY("checkpoint.every_epochs", checkpoint.every_epochs, "save every N epochs (0: off)"),
      TESSEL_KEY("checkpoint.every_steps", checkpoint.every_steps, "save every N steps (0: off); not with ps.mode async or ssp, whose workers meet only at epoch ends"),
      TESSEL_KEY("checkpoint.keep_last", checkpoint.keep_last, "checkpoints kept in the run folder"),
      TESSEL_KEY("checkpoint.snapshot_steps", checkpoint.snapshot_steps, "ranks as threads with train.max_restarts > 0: every N steps each rank copies its state into an in-memory snapshot, so that a rank failure loses at most N steps and reads no disk (0: off; restarts then use the newest checkpoint)"),
      TESSEL_KEY("trace.steps", observe.trace_steps, "steps traced with train.trace: \"A:B\" traces steps A to B - 1"),
      TESSEL_KEY("metrics.tensorboard", observe.tensorboard, "also write the metrics as TensorBoard scalars (event files in tensorboard/ of the run folder)"),
      TESSEL_KEY("runtime.threads", runtime.threads, "BLAS threads of this process"),
      TESSEL_KEY("runtime.workers", runtime.workers, "ranks run as threads of this process (same as --workers)"),
      TESSEL_KEY("runtime.backend", runtime.backend, "auto, threads or mpi (auto: mpi when started by an MPI launcher)"),
      TESSEL_KEY("runtime.memory_limit_mb", parallel.memory_limit_mb, "per-rank memory limit in MiB for tensors (parameters, gradients, optimizer state, activations, communication buffers); a rank that would pass it fails naming the category and the ZeRO stage that shards it (0: none)"),
      TESSEL_KEY("comm.timeout_s", comm.timeout_s, "deadline in seconds of every blocking communication"),
      TESSEL_KEY("comm.algorithm", comm.algorithm, "collective algorithm: auto, ring, halving_doubling, tree, direct, native"),
      TESSEL_KEY("ddp.bucket_mb", parallel.bucket_mb, "gradient bucket size in MiB; buckets are all-reduced while backward runs"),
      TESSEL_KEY("ddp.overlap", parallel.overlap, "auto, on or off: on runs each gradient bucket's collective (and ZeRO-3 prefetches) on a progress thread while the backward pass computes; off runs it on the compute thread as soon as the bucket is complete; auto: on only with a spare core per rank"),
      TESSEL_KEY("ddp.shared_memory", parallel.shared_memory, "among ranks of one host, sum gradients straight from each other's memory instead of sending messages: zero.stage = 0 (without ddp.overlap) writes each piece's sum into every rank's arena, zero.stage = 1 also keeps one parameter copy in shared memory; false: messages, as between hosts"),
      TESSEL_KEY("ddp.check_every", parallel.check_every, "steps between cross-rank parameter checksums (0: off)"),
      TESSEL_KEY("ddp.micro_shard", parallel.micro_shard, "deterministic mode: rows per fixed micro-shard"),
      TESSEL_KEY("compress.kind", parallel.compress.kind, "what data-parallel gradient buckets (zero.stage = 0) and parameter-server pushes travel as: none (f32), fp16, bf16, int8 (per-chunk scales, stochastic rounding), topk (largest |g| as index/value pairs, all-gathered) or powersgd (rank-r factors P and Q, all-reduced); 1-D tensors and tensors it would not shrink stay f32 (docs/compression.md)"),
      TESSEL_KEY("compress.ratio", parallel.compress.ratio, "topk: the share of each bucket's compressed elements sent per step, in (0, 0.5]"),
      TESSEL_KEY("compress.rank", parallel.compress.rank, "powersgd: the rank r of each matrix's approximation (m x n sends r (m + n) values)"),
      TESSEL_KEY("compress.start_step", parallel.compress.start_step, "steps sent uncompressed (f32) before compression starts"),
      TESSEL_KEY("compress.error_feedback", parallel.compress.error_feedback, "topk and powersgd: keep what a step did not send (the residual, per bucket and rank) and add it to the next step's gradient"),
      TESSEL_KEY("zero.stage", parallel.zero_stage, "sharded data parallelism over the dp ranks: 0 replicated, 1 optimizer state sharded (allocated 1/N per rank), 2 gradients too (buckets reduce-scattered during backward), 3 parameters too (gathered per block before forward and backward, released after)"),
      TESSEL_KEY("zero.prefetch", parallel.zero_prefetch, "zero.stage = 3: gather the next block's parameters on a progress thread while this block computes (the order is recorded on the first step)"),
      TESSEL_KEY("tp.size", parallel.tp_size, "tensor parallelism: ranks each layer of an mlp or gpt is cut across (1: none); the world is dp x pp x tp ranks, tp fastest (a tp group is consecutive ranks)"),
      TESSEL_KEY("tp.sequence_parallel", parallel.tp_sequence, "tp.size > 1 with a gpt: activations outside the cut layers (layer norms, residuals) are split along the sequence, and the tp all-reduces become all-gathers and reduce-scatters"),
      TESSEL_KEY("pp.stages", parallel.pp_stages, "pipeline stages: the model's blocks cut into this many contiguous stages (1: no pipeline); the world is dp x pp x tp ranks"),
      TESSEL_KEY("pp.microbatches", parallel.pp_microbatches, "micro-batches each rank's batch is cut into for the pipeline schedule"),
      TESSEL_KEY("pp.schedule", parallel.pp_schedule, "gpipe (all forwards, then all backwards) or 1f1b (one forward, one backward after warm-up)"),
      TESSEL_KEY("pp.partition", parallel.pp_partition, "balanced (by estimated compute), uniform (same block count) or round_robin (block l on stage l mod P)"),
      TESSEL_KEY("pp.cuts", parallel.pp_cuts, "explicit first block of stages 1..P-1, e.g. [3, 7] (overrides pp.partition)"),
      TESSEL_KEY("ps.servers", parallel.ps_servers, "parameter-server ranks (the last ones; 0: no parameter server)"),
      TESSEL_KEY("ps.mode", parallel.ps_mode, "sync (lockstep slices, one summed update per step: equals data parallel), async (workers claim worker batches of train.batch / workers rows one at a time, each push applied at once) or ssp (async, no claim more than ps.staleness steps ahead of a batch still in progress)"),
      TESSEL_KEY("ps.staleness", parallel.ps_staleness, "ssp: a claim at step c waits until every batch in progress is at step c - staleness or later (W claimed batches make a step)"),
      TESSEL_KEY("ps.stale_lr", parallel.ps_stale_lr, "async/ssp: inverse applies an update computed on parameters s versions old at lr / (1 + s); none at lr"),
      TESSEL_KEY("infer.chunk_rows", infer.chunk_rows, "predict: rows per chunk, the unit handed to a worker, written in order and resumed from (the same output for any worker count)"),
      TESSEL_KEY("infer.batch", infer.batch, "predict: rows (gpt: prompts) per forward pass within a chunk"),
      TESSEL_KEY("infer.top_k", infer.top_k, "predict and serve: classes listed with their probabilities per row"),
      TESSEL_KEY("infer.chunk_timeout_s", infer.chunk_timeout_s, "predict with threads: a worker holding a chunk this long is stalled and another worker re-runs the chunk"),
      TESSEL_KEY("infer.commit_every_s", infer.commit_every_s, "predict: seconds between commits of the output (fsync + progress file); a killed job resumes from the last one (0: after every chunk)"),
      TESSEL_KEY("infer.max_new_tokens", infer.max_new_tokens, "gpt: tokens generated per prompt (prompt + these must fit the context)"),
      TESSEL_KEY("infer.temperature", infer.temperature, "gpt: 0 greedy (the most likely token), else sample at this temperature, seeded by seed and the row"),
      TESSEL_KEY("infer.sample_top_k", infer.sample_top_k, "gpt: sample among the k most likely tokens (0: all)"),
      TESSEL_KEY("infer.kv_cache", infer.kv_cache, "gpt: keep each block's keys and values while generating (false: recompute the whole context for every token)"),
      TESSEL_KEY("serve.host", serve.host, "address tessel serve listens on (127.0.0.1: this machine only; 0.0.0.0: every interface)"),
      TESSEL_KEY("serve.max_batch", serve.max_batch, "rows per batch a serve worker runs (requests are batched up to it); also the most rows one request may carry"),
      TESSEL_KEY("serve.max_wait_ms", serve.max_wait_ms, "longest a request waits for others to fill a batch"),
      TESSEL_KEY("serve.max_queue", serve.max_queue, "rows waiting for a worker; requests beyond it get 503"),
      TESSEL_KEY("serve.max_body_kb", serve.max_body_kb, "largest request body in KiB; larger ones get 413"),
      TESSEL_KEY("serve.connections", serve.connections, "HTTP connections served at once (one thread each); more wait to be accepted"),
      TESSEL_KEY("serve.timeout_s", serve.timeout_s, "a request not answered in this many seconds gets 504"),
      TESSEL_KEY("debug.slow_rank", parallel.slow_rank, "rank that sleeps debug.delay_ms in every step (a parameter-server worker: before its push; otherwise before the gradient reduction) or before every chunk (predict), to study stragglers (-1: none)"),
      TESSEL_KEY("debug.delay_ms", parallel.delay_ms, "milliseconds debug.slow_rank sleeps in every step or chunk"),
      TESSEL_KEY("debug.fail_rank", fault.fail_rank, "inject a failure on this world rank (-1: none), to test recovery; restarts (train.max_restarts, tessel launch) run without it"),
      TESSEL_KEY("debug.fail_step", fault.fail_step, "the injected failure happens right after this step (1-based)"),
      TESSEL_KEY("debug.fail_mode", fault.fail_mode, "throw (an error), kill (SIGKILL of the process), hang (the rank stops making progress) or stop (SIGSTOP of the process; MPI only)"),
      TESSEL_KEY("debug.overflow_steps", parallel.overflow_steps, "train.precision = fp16: steps at which debug.overflow_rank's loss gradient is made inf, an injected overflow that every rank must skip"),
      TESSEL_KEY("debug.overflow_rank", parallel.overflow_rank, "the worker rank that injects debug.overflow_steps"),
      TESSEL_KEY("debug.kill_rank", infer.kill_rank, "predict worker that dies after debug.kill_after chunks, to test re-runs and --resume (threads: its thread fails; mpi: its process is killed; -1: none)"),
      TESSEL_KEY("debug.kill_after", infer.kill_after, "chunks debug.kill_rank finishes before it dies"),
  };
  return keys;
}

#undef TESSEL_KEY

const Key* find_key(const std::string& path) {
  for (const Key& k : registry())
    if (k.path == path) return &k;
  return nullptr;
}

// Applies "section.key=value" to the parsed table before the keys are read.
void apply_override(toml::table& root, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InvalidArgument(str("config: --set expects section.key=value, got '", assignment, "'"));
  std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  if (find_key(path) == nullptr)
    throw InvalidArgument(unknown_key_message(path, " in --set"));
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", text);  // a bare word: take it as a string
  }
  size_t dot = path.find('.');
  toml::table* target = &root;
  if (dot != std::string::npos) {
    std::string section = path.substr(0, dot);
    if (!root[section].is_table()) root.insert_or_assign(section, toml::table{});
    target = root[section].as_table();
    path = path.substr(dot + 1);
  }
  target->insert_or_assign(path, *parsed.get("v"));
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw InvalidArgument("config: " + msg);
}

void validate(const Config& c) {
  require(c.train.epochs >= 1, str("train.epochs must be >= 1, got ", c.train.epochs));
  require(c.train.batch >= 1, str("train.batch must be >= 1, got ", c.train.batch));
  require(c.train.max_steps >= 0, str("train.max_steps must be >= 0, got ", c.train.max_steps));
  require(c.train.clip_norm >= 0, str("train.clip_norm must be >= 0 (0 = off), got ", c.train.clip_norm));
  require(c.train.base_batch >= 0, str("train.base_batch must be >= 0 (0 = off), got ", c.train.base_batch));
  require(c.train.prefetch >= -1,
          str("train.prefetch must be >= 0, or -1 for auto, got ", c.train.prefetch));
  require(c.train.log_every >= 1, str("train.log_every must be >= 1, got ", c.train.log_every));
  require(std::isfinite(c.optim.lr) && c.optim.lr > 0,
          str("optim.lr must be a number > 0, got ", c.optim.lr, "; try 0.05 for sgd, 1e-3 for adamw"));
  require(c.checkpoint.every_epochs >= 0,
          str("checkpoint.every_epochs must be >= 0, got ", c.checkpoint.every_epochs));
  require(c.checkpoint.every_steps >= 0,
          str("checkpoint.every_steps must be >= 0, got ", c.checkpoint.every_steps));
  require(c.checkpoint.keep_last >= 1, str("checkpoint.keep_last must be >= 1, got ", c.checkpoint.keep_last));
  require(c.train.accumulate >= 1, str("train.accumulate must be >= 1, got ", c.train.accumulate));
  require(c.runtime.workers >= 1 && c.runtime.workers <= 1024,
          str("runtime.workers must be in [1, 1024], got ", c.runtime.workers));
  require(c.runtime.backend == "auto" || c.runtime.backend == "threads" || c.runtime.backend == "mpi",
          str("runtime.backend must be auto, threads or mpi, got '", c.runtime.backend, "'"));
  require(c.comm.timeout_s > 0, str("comm.timeout_s must be > 0, got ", c.comm.timeout_s));
  require(c.parallel.bucket_mb > 0, str("ddp.bucket_mb must be > 0, got ", c.parallel.bucket_mb));
  require(c.parallel.overlap == "auto" || c.parallel.overlap == "on" || c.parallel.overlap == "off",
          str("ddp.overlap must be auto, on or off, got '", c.parallel.overlap, "'"));
  require(c.parallel.check_every >= 0, str("ddp.check_every must be >= 0 (0 = off), got ", c.parallel.check_every));
  require(c.parallel.micro_shard >= 1, str("ddp.micro_shard must be >= 1, got ", c.parallel.micro_shard));
  require(c.parallel.zero_stage >= 0 && c.parallel.zero_stage <= 3,
          str("zero.stage must be 0, 1, 2 or 3, got ", c.parallel.zero_stage));
  require(c.parallel.memory_limit_mb >= 0,
          str("runtime.memory_limit_mb must be >= 0 (0 = no limit), got ", c.parallel.memory_limit_mb));
  require(!c.parallel.deterministic || c.train.batch % c.parallel.micro_shard == 0,
          str("train.deterministic needs train.batch (", c.train.batch,
              ") to be a multiple of ddp.micro_shard (", c.parallel.micro_shard, ")"));
  require(c.parallel.precision == "fp32" || c.parallel.precision == "bf16" ||
              c.parallel.precision == "fp16",
          str("train.precision must be fp32, bf16 or fp16, got '", c.parallel.precision, "'"));
  parallel::validate_compress(c.parallel.compress);
  require(c.parallel.recompute == "none" || c.parallel.recompute == "full" ||
              c.parallel.recompute == "selective",
          str("train.recompute must be none, full or selective, got '", c.parallel.recompute, "'"));
  require(c.parallel.overflow_steps.empty() || c.parallel.precision == "fp16",
          str("debug.overflow_steps injects fp16 overflows, got train.precision = ",
              c.parallel.precision, "; set train.precision = fp16 or clear debug.overflow_steps"));
  require(c.parallel.overflow_rank >= 0,
          str("debug.overflow_rank must be a worker rank >= 0, got ", c.parallel.overflow_rank));
  require(c.parallel.pp_stages >= 1, str("pp.stages must be >= 1, got ", c.parallel.pp_stages));
  require(c.parallel.tp_size >= 1, str("tp.size must be >= 1, got ", c.parallel.tp_size));
  require(c.parallel.pp_microbatches >= 1,
          str("pp.microbatches must be >= 1, got ", c.parallel.pp_microbatches));
  require(c.parallel.pp_schedule == "gpipe" || c.parallel.pp_schedule == "1f1b",
          str("pp.schedule must be gpipe or 1f1b, got '", c.parallel.pp_schedule, "'"));
  require(c.parallel.pp_partition == "balanced" || c.parallel.pp_partition == "uniform" ||
              c.parallel.pp_partition == "round_robin",
          str("pp.partition must be balanced, uniform or round_robin, got '",
              c.parallel.pp_partition, "'"));
  require(c.parallel.ps_servers >= 0,
          str("ps.servers must be >= 0 (0 = no parameter server), got ", c.parallel.ps_servers));
  require(c.parallel.ps_mode == "sync" || c.parallel.ps_mode == "async" || c.parallel.ps_mode == "ssp",
          str("ps.mode must be sync, async or ssp, got '", c.parallel.ps_mode, "'"));
  require(c.parallel.ps_staleness >= 0,
          str("ps.staleness must be >= 0, got ", c.parallel.ps_staleness));
  require(c.parallel.ps_stale_lr == "none" || c.parallel.ps_stale_lr == "inverse",
          str("ps.stale_lr must be none or inverse, got '", c.parallel.ps_stale_lr, "'"));
  require(c.parallel.delay_ms >= 0, str("debug.delay_ms must be >= 0, got ", c.parallel.delay_ms));
  require(c.parallel.slow_rank >= -1,
          str("debug.slow_rank must be a worker rank or -1 (none), got ", c.parallel.slow_rank));
  require(c.infer.chunk_rows >= 1, str("infer.chunk_rows must be >= 1, got ", c.infer.chunk_rows));
  require(c.infer.batch >= 1, str("infer.batch must be >= 1, got ", c.infer.batch));
  require(c.infer.top_k >= 1, str("infer.top_k must be >= 1, got ", c.infer.top_k));
  require(c.infer.chunk_timeout_s > 0,
          str("infer.chunk_timeout_s must be > 0, got ", c.infer.chunk_timeout_s));
  require(c.infer.commit_every_s >= 0,
          str("infer.commit_every_s must be >= 0, got ", c.infer.commit_every_s));
  require(c.infer.max_new_tokens >= 1,
          str("infer.max_new_tokens must be >= 1, got ", c.infer.max_new_tokens));
  require(c.infer.temperature >= 0 && std::isfinite(c.infer.temperature),
          str("infer.temperature must be >= 0 (0 = greedy), got ", c.infer.temperature));
  require(c.infer.sample_top_k >= 0,
          str("infer.sample_top_k must be >= 0 (0 = all), got ", c.infer.sample_top_k));
  require(c.infer.kill_rank >= -1,
          str("debug.kill_rank must be a worker rank or -1 (none), got ", c.infer.kill_rank));
  require(c.infer.kill_after >= 0, str("debug.kill_after must be >= 0, got ", c.infer.kill_after));
  require(c.serve.max_batch >= 1, str("serve.max_batch must be >= 1, got ", c.serve.max_batch));
  require(c.serve.max_wait_ms >= 0, str("serve.max_wait_ms must be >= 0, got ", c.serve.max_wait_ms));
  require(c.serve.max_queue >= c.serve.max_batch,
          str("serve.max_queue must be >= serve.max_batch (", c.serve.max_batch, "), got ",
              c.serve.max_queue));
  require(c.serve.max_body_kb >= 1, str("serve.max_body_kb must be >= 1, got ", c.serve.max_body_kb));
  require(c.serve.connections >= 1 && c.serve.connections <= 4096,
          str("serve.connections must be in [1, 4096], got ", c.serve.connections));
  require(c.serve.timeout_s > 0, str("serve.timeout_s must be > 0, got ", c.serve.timeout_s));
  require(c.runtime.threads >= 1 && c.runtime.threads <= 256,
          str("runtime.threads must be in [1, 256], got ", c.runtime.threads));
  parse_step_window(c.observe.trace_steps);  // throws naming trace.steps
  require(c.data.test_fraction >= 0 && c.data.test_fraction < 1,
          str("data.test_fraction must be in [0, 1), got ", c.data.test_fraction));
  require(c.train.max_restarts >= 0,
          str("train.max_restarts must be >= 0, got ", c.train.max_restarts));
  require(c.checkpoint.snapshot_steps >= 0,
          str("checkpoint.snapshot_steps must be >= 0 (0 = off), got ", c.checkpoint.snapshot_steps));
  require(c.checkpoint.snapshot_steps == 0 || c.parallel.ps_servers == 0,
          "checkpoint.snapshot_steps needs every rank to train steps, but parameter servers only "
          "serve; use checkpoint.every_steps with ps.servers > 0");
  require(c.fault.fail_rank >= -1,
          str("debug.fail_rank must be a rank or -1 (none), got ", c.fault.fail_rank));
  require(c.fault.fail_rank < 0 || c.fault.fail_step >= 1,
          str("debug.fail_step must be >= 1 with debug.fail_rank set, got ", c.fault.fail_step));
  require(c.fault.fail_mode == "throw" || c.fault.fail_mode == "kill" ||
              c.fault.fail_mode == "hang" || c.fault.fail_mode == "stop",
          str("debug.fail_mode must be throw, kill, hang or stop, got '", excerpt(c.fault.fail_mode),
              "'"));
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& name,
                    const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(toml_text, name);
  } catch (const toml::parse_error& e) {
    throw InvalidArgument(str("config: ", name, ":", e.source().begin.line, ":",
                              e.source().begin.column, ": ", e.description()));
  }
  for (const std::string& o : overrides) apply_override(root, o);

  Config c;
  c.name = name;
  auto visit = [&](const std::string& path, const toml::node& v) {
    const Key* k = find_key(path);
    if (k == nullptr)
      throw InvalidArgument(unknown_key_message(path, ""));
    k->set(c, v);
  };
  for (auto&& [key, node] : root) {
    std::string top(key.str());
    if (const toml::table* section = node.as_table()) {
      for (auto&& [sub, v] : *section) visit(top + "." + std::string(sub.str()), v);
    } else {
      visit(top, node);
    }
  }
  validate(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(str("config: cannot read '", path, "'; check the path (examples/ has configs)"));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), std::filesystem::path(path).stem().string(), overrides);
}

std::string to_toml(const Config& c) {
  std::string out = "# resolved tessel config: every key, defaults included\n";
  std::string section;
  for (const Key& k : registry()) {
    size_t dot = k.path.find('.');
    std::string sec = dot == std::string::npos ? "" : k.path.substr(0, dot);
    if (sec != section) {
      out += "\n[" + sec + "]\n";
      section = sec;
    }
    out += k.path.substr(dot == std::string::npos ? 0 : dot + 1) + " = " + k.get(c) + "\n";
  }
  return out;
}

int resolve_prefetch(int requested, int ranks_on_host, int blas_threads, int cores) {
  if (requested >= 0) return requested;
  return cores > ranks_on_host * std::max(1, blas_threads) ? 2 : 0;
}

std::vector<std::pair<std::string, std::string>> config_keys() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Key& k : registry()) out.emplace_back(k.path, k.doc);
  return out;
}

}  // namespace tessel::train
