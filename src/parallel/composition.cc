#include "tessel/parallel/composition.h"

#include <functional>

#include "tessel/core/error.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

// What the rules read: the spec, its layout and the values parsed once.
struct In {
  const ParallelSpec& s;
  const Layout& l;
  CompressKind kind;
  DType type;
};

// A refused combination: when it applies, and the message (after "config: ") naming the keys
// and what to change.
struct Rule {
  const char* when;
  std::function<bool(const In&)> applies;
  std::function<std::string(const In&)> why;
};

bool compressing(const In& in) { return in.kind != CompressKind::kNone; }

std::string compress_refusal(const In& in, const std::string& why) {
  return str("compress.kind = ", name_of(in.kind), " ", why,
             "; set compress.kind = none or change that (docs/compression.md)");
}

std::string shard_refusal(const In& in, const std::string& why) {
  return str("zero.shard_size = ", in.s.zero_shard_size, " ", why,
             "; set zero.shard_size = 0 to shard over the whole dp group (docs/zero.md)");
}

std::string balance_refusal(const In& in, const std::string& why) {
  return str("ddp.balance = ", name_of(in.s.balance), " ", why,
             "; set ddp.balance = off or change that (docs/data_parallel.md)");
}

bool on_cuda(const In& in) { return in.s.device == Device::kCuda; }

std::string cuda_refusal(const std::string& why, const std::string& instead) {
  return str("runtime.device = cuda ", why, "; set ", instead,
             ", or runtime.device = cpu (docs/gpu.md)");
}

bool offloading(const In& in) { return in.s.offload != Offload::kNone; }

std::string offload_refusal(const In& in, const std::string& why, const std::string& instead) {
  return str("train.offload = ", name_of(in.s.offload), " ", why, "; set ", instead,
             " or train.offload = none (docs/gpu.md)");
}

// What train.offload (not none) moves to host memory, for messages; indexed by Offload.
std::string offloaded(const In& in) {
  constexpr const char* kMoved[] = {"", "activations", "optimizer state",
                                    "activations and optimizer state"};
  return kMoved[static_cast<size_t>(in.s.offload)];
}

// The table's refusals, in the order they are asked (the first that applies is the message).
const std::vector<Rule>& rules() {
  static const std::vector<Rule> table = {
      {"train.offload != none and runtime.device = cpu",
       [](const In& in) { return offloading(in) && !on_cuda(in); },
       [](const In& in) {
         return offload_refusal(in,
                                str("moves a device rank's ", offloaded(in),
                                    " to host memory, got runtime.device = cpu (host memory "
                                    "holds them already)"),
                                "runtime.device = cuda");
       }},
      {"train.offload = optimizer | all and ps.servers > 0",
       [](const In& in) { return offloads_optimizer(in.s.offload) && in.l.servers > 0; },
       [](const In& in) {
         return offload_refusal(
             in,
             str("moves a device rank's optimizer state to host memory, got ps.servers = ",
                 in.l.servers, " (the servers hold the optimizer state, in host memory)"),
             "ps.servers = 0");
       }},
      {"train.offload = activations | all and pp.schedule = zb-h1",
       [](const In& in) {
         return offloads_activations(in.s.offload) && in.l.pp > 1 &&
                in.s.pp_schedule == PpSchedule::kZbH1;
       },
       [](const In& in) {
         return offload_refusal(
             in,
             str("moves each micro-batch's caches between its forward and its backward, got "
                 "pp.schedule = zb-h1 (its weight-gradient task reads the caches after the "
                 "backward: not offloaded yet)"),
             "pp.schedule = 1f1b");
       }},
      {"runtime.device = cuda and ps.servers beyond zero",
       [](const In& in) { return on_cuda(in) && in.l.servers > 0; },
       [](const In& in) {
         return cuda_refusal(str("runs data, pipeline and tensor parallel only, got layout ",
                                 in.l.str(), " (parameter servers on device ranks come later)"),
                             "ps.servers = 0");
       }},
      {"runtime.device = cuda and compress.kind != none",
       [](const In& in) { return on_cuda(in) && compressing(in); },
       [](const In& in) {
         return cuda_refusal(str("sends no gradients, got compress.kind = ", name_of(in.kind)),
                             "compress.kind = none");
       }},
      {"runtime.device = cuda and train.recompute != none",
       [](const In& in) { return on_cuda(in) && in.s.recompute != nn::Recompute::kNone; },
       [](const In& in) {
         return cuda_refusal(
             str("keeps every activation, got train.recompute = ", name_of(in.s.recompute)),
             "train.recompute = none");
       }},
      {"runtime.device = cuda and train.precision = fp16",
       [](const In& in) { return on_cuda(in) && in.type == DType::kF16; },
       [](const In&) {
         return cuda_refusal("runs fp32 or bf16 (the fp16 loss scaler is not on the device)",
                             "train.precision = bf16");
       }},
      {"ps.servers > 0 and pp.stages > 1",
       [](const In& in) { return in.l.servers > 0 && in.l.pp > 1; },
       [](const In& in) {
         return str("ps.servers = ", in.l.servers, " and pp.stages = ", in.l.pp,
                    " cannot be combined; use one of them");
       }},
      {"ps.servers > 0 and zero.stage > 0",
       [](const In& in) { return in.l.servers > 0 && in.s.zero_stage > 0; },
       [](const In& in) {
         return str("zero.stage = ", in.s.zero_stage, " with ps.servers = ", in.l.servers,
                    ": the parameter servers already hold the parameters and optimizer state "
                    "in shards; set zero.stage = 0");
       }},
      {"ps.servers > 0 and tp.size > 1",
       [](const In& in) { return in.l.servers > 0 && in.l.tp > 1; },
       [](const In& in) {
         return str("ps.servers = ", in.l.servers, " and tp.size = ", in.l.tp,
                    " cannot be combined; use one of them");
       }},
      {"ps.servers > 0 with ps.mode async or ssp and train.deterministic",
       [](const In& in) {
         return in.l.servers > 0 && in.s.ps_mode != PsMode::kSync && in.s.deterministic;
       },
       [](const In& in) {
         return str("train.deterministic cannot be combined with ps.mode = ", name_of(in.s.ps_mode),
                    ": its servers apply each push as it arrives, so the arrival order decides "
                    "the result; use ps.mode = sync (the servers add the workers' exact sums) or "
                    "train.deterministic = false");
       }},
      {"zero.shard_size > 0 and zero.stage = 0",
       [](const In& in) { return in.s.zero_shard_size > 0 && in.s.zero_stage == 0; },
       [](const In& in) {
         return shard_refusal(in,
                              "shards ZeRO's state within groups of ranks, but zero.stage = 0 "
                              "shards nothing; set zero.stage = 1, 2 or 3");
       }},
      {"zero.shard_size > 0 and compress.kind != none",
       [](const In& in) { return in.s.zero_shard_size > 0 && compressing(in); },
       [](const In& in) {
         return shard_refusal(in, str("does not run with compress.kind = ", name_of(in.kind),
                                      " (its exchanges and byte formulas cover one group); set "
                                      "compress.kind = none"));
       }},
      {"compress.kind != none and train.deterministic",
       [](const In& in) { return compressing(in) && in.s.deterministic; },
       [](const In& in) {
         return compress_refusal(
             in,
             "does not run with train.deterministic (its exact integer sum is the point of it)");
       }},
      {"compress.kind = powersgd and ps.servers > 0",
       [](const In& in) { return in.kind == CompressKind::kPowerSgd && in.l.servers > 0; },
       [](const In& in) {
         return compress_refusal(in,
                                 "does not apply to parameter-server pushes (it needs all-reduces "
                                 "among the workers); use fp16, bf16, int8 or topk");
       }},
      {"compress.kind != none and zero.stage = 3",
       [](const In& in) { return compressing(in) && in.s.zero_stage == 3; },
       [](const In& in) {
         return compress_refusal(
             in,
             "runs with zero.stage 0-2, got zero.stage = 3 (its parameter gathers share the dp "
             "group with the gradient exchanges); use zero.stage = 2, which shards gradients and "
             "optimizer state");
       }},
      {"compress.kind = powersgd, or topk with compress.error_feedback, and train.precision = fp16",
       [](const In& in) {
         const bool state = in.kind == CompressKind::kPowerSgd ||
                            (in.kind == CompressKind::kTopk && in.s.compress.error_feedback);
         return state && in.type == DType::kF16;
       },
       [](const In& in) {
         return compress_refusal(
             in,
             "keeps state (residuals, Q) that a step skipped for an fp16 overflow would fill "
             "with inf; with train.precision = fp16 use fp16, bf16, int8 or topk with "
             "compress.error_feedback = false, or train.precision = bf16");
       }},
      {"debug.slow_rank is a parameter server",
       [](const In& in) { return in.l.servers > 0 && in.s.slow_rank >= in.l.workers(); },
       [](const In& in) {
         return str("debug.slow_rank = ", in.s.slow_rank,
                    " is not a worker rank; workers are ranks 0..", in.l.workers() - 1,
                    " (the last ", in.l.servers, " ranks are servers)");
       }},
      {"debug.slow_rank >= the world size",
       [](const In& in) { return in.s.slow_rank >= in.l.world; },
       [](const In& in) {
         return str("debug.slow_rank must be a rank of the ", in.l.world,
                    "-rank world or -1 (none), got ", in.s.slow_rank);
       }},
      {"ddp.balance != off and ps.servers > 0",
       [](const In& in) { return in.s.balance != BalanceMode::kOff && in.l.servers > 0; },
       [](const In& in) {
         return balance_refusal(
             in, "runs without parameter servers (ps.servers > 0 trains whole worker batches)");
       }},
      {"ddp.balance != off and pp.stages > 1 or tp.size > 1",
       [](const In& in) {
         return in.s.balance != BalanceMode::kOff && (in.l.pp > 1 || in.l.tp > 1);
       },
       [](const In& in) {
         return balance_refusal(in, str("runs on plain data parallelism, got layout ", in.l.str(),
                                        " (pp.stages and tp.size must be 1)"));
       }},
      {"ddp.balance != off and zero.stage = 3",
       [](const In& in) { return in.s.balance != BalanceMode::kOff && in.s.zero_stage == 3; },
       [](const In& in) {
         return balance_refusal(
             in,
             "runs with zero.stage 0-2, got zero.stage = 3 (its parameter gathers around every "
             "piece need the same number of micro-shards on every rank); use zero.stage = 2");
       }},
      {"train.deterministic and pp.stages > 1 with pp.microbatches > 1",
       [](const In& in) { return in.s.deterministic && in.l.pp > 1 && in.s.pp_microbatches > 1; },
       [](const In& in) {
         return str(
             "train.deterministic runs each ddp.micro_shard micro-shard through the pipeline as "
             "one micro-batch, got pp.microbatches = ",
             in.s.pp_microbatches, "; set pp.microbatches = 1 or train.deterministic = false");
       }},
      {"pp.schedule = zb-h1 and train.recompute = full",
       [](const In& in) {
         return in.l.pp > 1 && in.s.pp_schedule == PpSchedule::kZbH1 &&
                in.s.recompute == nn::Recompute::kFull;
       },
       [](const In&) {
         return std::string(
             "pp.schedule = zb-h1 keeps each block's cache until its weight-gradient task, which "
             "train.recompute = full does not keep (its blocks rerun in one shared cache); use "
             "train.recompute = selective or none, or pp.schedule = 1f1b");
       }},
  };
  return table;
}

// The parts of a combination no rule refuses.
Parts choose(const In& in, bool overlap) {
  Parts p;
  const ParallelSpec& s = in.s;
  p.executor = in.l.pp > 1 ? ExecutorKind::kPipeline : ExecutorKind::kLocal;
  p.tp = in.l.tp == 1 ? "none" : s.tp_sequence ? "sequence_parallel" : "tensor_parallel";
  p.codec = name_of(in.kind);
  p.scaler = in.type == DType::kF16;
  if (in.l.servers > 0) {
    // A worker's own gradient (deterministic: its micro-shards' exact integer sums); the
    // servers sum the pushes.
    p.grad_sync = s.deterministic ? "exact_push" : "local";
    p.store = "parameter_server";
    p.working_copy = in.type != DType::kF32;
    return p;
  }
  const int stage = s.zero_stage;
  const bool grouped = in.l.shard < in.l.dp;
  // On cuda too, deterministic mode sums exactly (the micro-shards through host memory).
  p.grad_sync = s.deterministic ? "exact"
                : stage == 0    ? "allreduce"
                : stage == 1    ? "reduce_scatter"
                                : "reduce_scatter_shard";
  p.store = stage == 3 ? "sharded" : "replicated";
  // Device arenas are never rebound to shared host memory.
  p.shared_memory = s.shared_memory && !on_cuda(in) && in.l.dp > 1 && !compressing(in) &&
                    !s.deterministic && ((stage == 1 && !grouped) || (stage == 0 && !overlap));
  p.working_copy = in.type != DType::kF32 && stage != 3;
  p.prefetch = stage == 3 && s.zero_prefetch && overlap;
  return p;
}

}  // namespace

nlohmann::json Parts::json(const ParallelSpec& spec, bool overlap) const {
  nlohmann::json j = {{"precision", name_of(spec.precision)},
                      {"recompute", name_of(spec.recompute)},
                      {"offload", name_of(spec.offload)},
                      {"executor", name_of(executor)},
                      {"grad_sync", grad_sync},
                      {"store", store},
                      {"overlap", overlap},
                      {"prefetch", prefetch}};
  if (tp != "none") j["tp"] = tp;
  if (codec != "none") j["compress"] = codec;
  return j;
}

Parts compose(const ParallelSpec& spec, const Layout& layout, bool overlap) {
  const In in{spec, layout, spec.compress.kind, precision_type(spec)};
  for (const Rule& r : rules())
    if (r.applies(in)) throw InvalidArgument("config: " + r.why(in));
  return choose(in, overlap);
}

namespace {

// What of `model` does not run on cuda yet ("" when it all runs there), as "<key> = <value>
// (the layer)": the layers, the loss and the optimizer of an mlp or cnn classifier and of a gpt
// (classic or modern) call the device's kernel table (ops/device_kernels.h); attention has some
// head sizes only.
std::string missing_on_cuda(const nn::ModelSpec& m) {
  using nn::ModelKind;
  if (m.kind == ModelKind::kSequential) return "model.kind = sequential (its layer stack)";
  if (m.kind == ModelKind::kGpt) {
    const int64_t head = m.heads > 0 ? m.embed / m.heads : 0;
    if (head != 16 && head != 32 && head != 64 && head != 128)
      return str("model.embed / model.heads = ", m.embed, " / ", m.heads,
                 " (attention's head size; cuda's has sizes 16, 32, 64 and 128)");
  }
  if (m.task != data::Task::kClassification)
    return str("data.task = ", name_of(m.task), " (its loss)");
  return "";
}

}  // namespace

void check_device(const ParallelSpec& spec, const nn::ModelSpec& model) {
  if (spec.device == Device::kCpu) return;
  // Throws when this build has no runtime for the device.
  const std::string unavailable = device_runtime(spec.device).unavailable_reason();
  if (!unavailable.empty()) {
    throw Error(str("runtime.device = ", name_of(spec.device),
                    " cannot be used here: ", unavailable,
                    "; run where a GPU and its driver are, or set runtime.device = "
                    "cpu (docs/gpu.md)"));
  }
  const std::string missing = missing_on_cuda(model);
  if (!missing.empty())
    throw InvalidArgument(str("config: runtime.device = cuda has no kernel for ", missing,
                              " yet; use an mlp or cnn classifier or a gpt, or "
                              "runtime.device = cpu (docs/gpu.md)"));
}

std::vector<Combination> composition_grid(const ParallelSpec& base) {
  struct Shape {
    const char* name;
    int world, pp, tp, servers, shard;
  };
  static const Shape shapes[] = {{"1 rank", 1, 1, 1, 0, 0},       {"dp=2", 2, 1, 1, 0, 0},
                                 {"dp=4 shard=2", 4, 1, 1, 0, 2}, {"pp=2", 2, 2, 1, 0, 0},
                                 {"dp=2 pp=2", 4, 2, 1, 0, 0},    {"tp=2", 2, 1, 2, 0, 0},
                                 {"dp=2 tp=2", 4, 1, 2, 0, 0},    {"ps 1 x 2", 3, 1, 1, 1, 0}};
  std::vector<Combination> out;
  for (const Shape& sh : shapes)
    for (int stage = 0; stage <= 3; ++stage)
      for (const char* precision : Names<Precision>::values)
        for (const char* kind : Names<CompressKind>::values) {
          Combination c{sh.name, sh.world, base};
          c.spec.pp_stages = sh.pp;
          c.spec.tp_size = sh.tp;
          c.spec.ps_servers = sh.servers;
          c.spec.zero_shard_size = sh.shard;
          c.spec.zero_stage = stage;
          c.spec.precision = *value_of<Precision>(precision);
          c.spec.compress.kind = *value_of<CompressKind>(kind);
          out.push_back(std::move(c));
        }
  return out;
}

std::string refusal(const Combination& c, Parts* parts) {
  try {
    *parts = compose(c.spec, Layout::resolve(c.spec, c.world), false);
    return "";
  } catch (const InvalidArgument& e) {
    return e.what();
  }
}

namespace {

std::string parts_cell(const Parts& p) {
  std::string s = name_of(p.executor);
  if (p.tp != "none") s += " + " + p.tp;
  s += ", " + (p.shared_memory ? "shared_memory else " + p.grad_sync : p.grad_sync);
  s += ", " + p.store;
  if (p.working_copy) s += ", working copy";
  if (p.scaler) s += ", loss scaler";
  return s;
}

}  // namespace

std::string composition_markdown() {
  std::string out =
      "# Composition: what runs with what\n\n"
      "<!-- Generated by `tessel config --composition` from src/parallel/composition.cc; a test "
      "checks it. Do not edit by hand. -->\n\n"
      "The Engine asks one decision table which parts to build for a run (`tessel config` prints "
      "them under `engine`), or why the combination is refused. Below: every combination of a "
      "representative layout, `zero.stage` and `train.precision` with `ddp.overlap = off` and "
      "the other keys at their defaults, the parts it builds with `compress.kind = none` "
      "(executor, gradient sync, parameter store, extras) and the `compress.kind` values that "
      "run with it. `train.recompute` (none, full, selective) runs with every combination: the "
      "executor keeps or recomputes the activations (full recompute is refused only with "
      "`pp.schedule = zb-h1`, below). All of it on `runtime.device = cpu`; the rules for "
      "`runtime.device = cuda` are listed below.\n\n"
      "| layout | zero.stage | train.precision | parts | compress.kind |\n"
      "|---|---|---|---|---|\n";
  const ParallelSpec defaults;
  const std::vector<Combination> grid = composition_grid(defaults);
  for (size_t i = 0; i < grid.size(); i += 6) {  // the six compress kinds of one row
    Parts none;
    const std::string refused = refusal(grid[i], &none);
    std::string kinds;
    for (size_t k = i + 1; k < i + 6; ++k) {
      Parts p;
      if (refusal(grid[k], &p).empty())
        kinds += str(kinds.empty() ? "" : ", ", name_of(grid[k].spec.compress.kind));
    }
    const Combination& c = grid[i];
    out += str("| ", c.layout, " | ", c.spec.zero_stage, " | ", name_of(c.spec.precision), " | ",
               refused.empty() ? parts_cell(none) : "refused: " + refused, " | ",
               refused.empty() ? (kinds.empty() ? "none only" : "none, " + kinds) : "-", " |\n");
  }
  out +=
      "\n## Refusals\n\nEvery rule of the table, in the order it is asked (the first that "
      "applies gives the message):\n\n";
  for (const Rule& r : rules()) out += str("- ", r.when, "\n");
  ParallelSpec cuda;
  cuda.device = Device::kCuda;
  try {
    compose(cuda, Layout::resolve(cuda, 1), false);
    out +=
        "\nOne rank on a cuda device, the other keys at their defaults, passes the table; the "
        "start checks (`check_device`) then refuse a model with layers that have no cuda kernel "
        "yet (docs/gpu.md).\n";
  } catch (const InvalidArgument& e) {
    out += str("\nOne rank on a cuda device, the other keys at their defaults: `", e.what(), "`\n");
  }
  return out;
}

}  // namespace tessel::parallel
