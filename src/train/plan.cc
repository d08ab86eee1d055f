// The planner: enumerate the layouts of N ranks, keep those the engine accepts, predict memory
// and step time for each (plan.h). Terms used below:
//   replica rows   train.batch / dp, the rows one data-parallel replica runs per step;
//   micro rows     replica rows / pp.microbatches, one pipeline micro-batch;
//   stage share    the forward flops of a stage's blocks over the whole model's (the calibration
//                  is of the whole model on one rank; a stage runs its share of it);
//   link           alpha (seconds per message) and beta (bytes/s) of a ring over a group.
#include "tessel/train/plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "tessel/core/error.h"
#include "tessel/nn/models.h"
#include "tessel/parallel/composition.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/parameter_server.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/parallel/schedule.h"
#include "tessel/parallel/units.h"

namespace tessel::train {

using nlohmann::json;

double MemoryBytes::total() const {
  double t = 0;
  for (double b : bytes) t += b;
  return t;
}

MemCategory MemoryBytes::largest() const {
  return MemCategory(std::max_element(bytes.begin(), bytes.end()) - bytes.begin());
}

// The allocation sites, per arena element (engine.cc, param_stores.cc, grad_syncs.cc,
// working_copy.cc, optimizer.cc): f32 master values (ReplicatedStore whole, ShardedStore its
// shard), the 16-bit working copy the blocks read (not at stage 3, which gathers 16-bit units),
// f32 gradients (ArenaSync whole, ShardSync its shard), the optimizer's state over the elements
// this rank updates (AdamW two moments, SGD one momentum).
std::vector<StateTerm> engine_state_terms(parallel::Precision precision,
                                          optim::OptimKind optimizer) {
  std::vector<StateTerm> terms = {
      {MemCategory::kParameters, 4, 3, false},
      {MemCategory::kGradients, 4, 2, false},
      {MemCategory::kOptimizer, optimizer == optim::OptimKind::kSgd ? 4.0 : 8.0, 1, false}};
  if (precision != parallel::Precision::kFp32)
    terms.push_back({MemCategory::kParameters, 2, 4, true});
  return terms;
}

double ring_seconds(double bytes, int p, double passes, double alpha, double beta) {
  if (p <= 1 || bytes <= 0) return 0;
  return passes * (p - 1) * (alpha + bytes / (p * beta));
}

void rank_candidates(std::vector<Candidate>& plan) {
  std::stable_sort(plan.begin(), plan.end(), [](const Candidate& a, const Candidate& b) {
    if (a.overflow.empty() != b.overflow.empty()) return a.overflow.empty();
    // samples/s in steps of 0.1%: as fast within one step (or both too big), the smaller first
    const auto step = [](const Candidate& c) {
      return c.overflow.empty() ? std::floor(std::log(std::max(c.samples_per_s, 1e-30)) / 1e-3)
                                : 0.0;
    };
    if (step(a) != step(b)) return step(a) > step(b);
    return a.memory.total() < b.memory.total();
  });
}

MemoryBytes state_bytes(const std::vector<StateTerm>& terms, int stage, double whole,
                        double shard) {
  MemoryBytes m;
  for (const StateTerm& t : terms) {
    if (t.before_stage3 && stage >= 3) continue;
    m[t.category] += t.bytes * (stage >= t.sharded_from ? shard : whole);
  }
  return m;
}

double pipeline_bubble(const std::vector<double>& stage_compute, size_t slowest, double f) {
  if (stage_compute.size() < 2) return 0;
  double others = 0;
  for (size_t s = 0; s < stage_compute.size(); ++s)
    if (s != slowest) others += stage_compute[s];
  return f / (1 - f) * others / static_cast<double>(stage_compute.size() - 1);
}

StepTime share_host(StepTime slowest, double host_work, int ranks_here, const Calibration& cal) {
  if (ranks_here <= 1) return slowest;
  const bool crowded = ranks_here > cal.cores;
  const double host =
      host_work * (crowded ? cal.contention_crowded : cal.contention) / std::max(1, cal.cores);
  // what the slowest rank waits through leaves its core to the others: a pipeline's idle
  // stages; with more ranks than cores its exposed communication too
  const double waits = slowest.bubble + (crowded ? slowest.comm - slowest.sync : 0);
  slowest.compute = std::max(slowest.compute, host - waits);
  return slowest;
}

namespace {

// Builds the model's structure cut for a tp group (no collective is ever called: plan only
// lays out the arena).
class ShapeOnlyTp final : public nn::TensorParallel {
 public:
  using TensorParallel::TensorParallel;
  void all_reduce_sum(void*, int64_t, DType) override { refuse(); }
  void all_reduce_max(float*, int64_t) override { refuse(); }
  void all_gather(const void*, void*, int64_t, DType) override { refuse(); }
  void reduce_scatter(const void*, void*, int64_t, DType) override { refuse(); }

 private:
  [[noreturn]] static void refuse() {
    throw Error("plan: a model laid out for planning ran a collective (this is a bug)");
  }
};

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

struct Link {
  double alpha = 0, beta = 1;
};

// What one stage of one layout holds and runs, from the engine's own layout of the arena.
struct StageShape {
  double whole = 0, shard = 0, largest_unit = 0, flops_share = 0, act_share = 0;
  double server_shard = 0;  // with parameter servers: the largest server's range
  double tied_numel = 0;
  double in_width = 0, out_width = 0;  // elements per row it receives and sends forward
};

std::vector<StageShape> stage_shapes(const Config& config, const parallel::ParallelSpec& spec,
                                     const parallel::Layout& l, const Calibration& cal) {
  ShapeOnlyTp tp(0, l.tp, spec.tp_sequence);
  auto model = nn::build_model(config.model, l.tp > 1 ? &tp : nullptr);
  const parallel::Partition part = parallel::make_partition(spec, *model, l.pp);
  // Each block's share of the time (forward flops) and of the activations (bytes its forward
  // keeps), plus 2% of the mean so that no block counts for nothing.
  const auto shares = [](const std::vector<double>& w, const std::vector<bool>& local) {
    double total = 0, mine = 0;
    for (double x : w) total += x;
    const double floor = 0.02 * total / static_cast<double>(std::max<size_t>(1, w.size()));
    for (size_t b = 0; b < w.size() && b < local.size(); ++b)
      if (local[b]) mine += w[b] + floor;
    return total > 0 ? mine / (total * 1.02) : 0.0;
  };
  std::vector<StageShape> out(static_cast<size_t>(l.pp));
  for (int s = 0; s < l.pp; ++s) {
    std::vector<bool> local(model->num_blocks(), false);
    StageShape& st = out[static_cast<size_t>(s)];
    const std::vector<double>& width = cal.block_out_width;  // empty: not calibrated
    for (size_t c = 0; c < part.chunks(); ++c) {
      if (part.stage[c] != s) continue;
      const size_t begin = part.begin[c], end = part.begin[c + 1];
      for (size_t b = begin; b < end; ++b) local[b] = true;
      if (begin > 0 && begin <= width.size()) st.in_width += width[begin - 1];
      if (end < model->num_blocks() && end <= width.size()) st.out_width += width[end - 1];
    }
    st.flops_share = l.pp == 1 ? 1.0 : shares(cal.block_flops, local);
    st.act_share = l.pp == 1 ? 1.0 : shares(cal.block_act_bytes, local);
    const parallel::Units u = parallel::make_units(*model, spec.bucket_mb, local, l.shard, 0);
    if (l.servers > 0)
      for (const nn::Range& r : parallel::server_shards(*model, l.servers))
        st.server_shard = std::max(st.server_shard, static_cast<double>(r.size()));
    st.whole = static_cast<double>(u.span.size());
    st.shard = static_cast<double>(u.shard_numel);
    for (const parallel::Unit& unit : u.list)
      st.largest_unit = std::max(st.largest_unit, static_cast<double>(unit.range.size()));
    // A block here reading a parameter of a block on another stage (the tied LM head): this
    // stage keeps a copy of it (pipeline.cc).
    for (size_t b = 0; b < model->num_blocks(); ++b)
      for (size_t o : model->blocks_used_by(b))
        if (local[b] && o != b && !local[o])
          for (const nn::Parameter* p : model->borrowed(b))
            st.tied_numel += static_cast<double>(shape_numel(p->shape));
  }
  return out;
}

bool uses_shared_memory(const parallel::ParallelSpec& spec, const parallel::Layout& l,
                        const PlanOptions& o) {
  return spec.shared_memory && o.hosts == 1 && l.dp > 1 && spec.zero_stage <= 1 &&
         spec.compress.kind == parallel::CompressKind::kNone && l.shard == l.dp &&
         !spec.deterministic;
}

// The activation width a tensor-parallel collective moves per row.
double row_width(const Config& config) {
  const nn::ModelSpec& m = config.model;
  if (nn::reads_tokens(m))
    return static_cast<double>(nn::text_sizes(m).embed) * static_cast<double>(m.input_shape[0]);
  if (m.kind == nn::ModelKind::kMlp && !m.hidden.empty())
    return static_cast<double>(*std::max_element(m.hidden.begin(), m.hidden.end()));
  return static_cast<double>(m.fc_hidden);
}

// Collectives a tensor-parallel group runs per micro-batch pass (forward + backward): a GPT
// block's two regions each all-reduce once each way, embedding and head once more; an MLP's
// cut pairs likewise.
double tp_collectives(const Config& config, double blocks_share) {
  const nn::ModelSpec& m = config.model;
  if (nn::reads_tokens(m))
    return (4.0 * static_cast<double>(nn::text_sizes(m).layers) + 4.0) * blocks_share;
  return 2.0 * std::ceil(static_cast<double>(m.hidden.size()) / 2.0) * blocks_share;
}

struct Inputs {
  const Config& config;
  const PlanOptions& options;
  const Calibration& cal;
  Link here, across;  // within a host; between hosts
};

// Whether bucket collectives (and ZeRO-3 prefetches) run on a progress thread: ddp.overlap,
// "auto" meaning a spare core per rank (engine.cc resolve_overlap).
bool overlaps(const Inputs& in, const parallel::ParallelSpec& spec) {
  const int ranks_here = in.options.workers / in.options.hosts;
  return spec.overlap == parallel::Overlap::kOn ||
         (spec.overlap == parallel::Overlap::kAuto && in.cal.cores >= 2 * ranks_here);
}

// The rows one stage runs per micro-batch and how many micro-batches it holds at once (1F1B:
// as many as stages follow it; GPipe: all). A batch the replicas cannot share evenly gives the
// fullest (and slowest) replica one row more than the mean: 32 rows on 6 replicas, 6; async and
// ssp parameter-server workers each train batch / workers rows, rounded down (trainer.cc).
struct Micro {
  int m = 1, in_flight = 1;
  double replica_rows = 0, rows = 0;
};
Micro micro_of(const Inputs& in, const parallel::ParallelSpec& spec, const parallel::Layout& l,
               int stage) {
  Micro mb;
  mb.m = static_cast<int>(spec.pp_microbatches);
  const bool own_pace = l.servers > 0 && spec.ps_mode != parallel::PsMode::kSync;
  mb.replica_rows = static_cast<double>((in.config.train.batch + (own_pace ? 0 : l.dp - 1)) / l.dp);
  mb.rows = mb.replica_rows / mb.m;
  mb.in_flight = l.pp == 1                                          ? 1
                 : spec.pp_schedule == parallel::PpSchedule::kGpipe ? mb.m
                 : spec.pp_schedule == parallel::PpSchedule::kZbH1
                     ? std::min(mb.m, l.pp)  // until each W
                     : std::min(mb.m, l.pp - stage);
  return mb;
}

MemoryBytes stage_memory(const Inputs& in, const parallel::ParallelSpec& spec,
                         const parallel::Layout& l, const StageShape& st, int stage) {
  const double g_bytes = spec.precision == parallel::Precision::kFp32 ? 4.0 : 2.0;
  const auto terms = engine_state_terms(spec.precision, in.config.optim.kind);
  MemoryBytes mem, server;
  if (l.servers > 0) {
    // a worker holds every value (and the working copy) and gradient, and its batch's
    // activations; a server its range's values, gradients and optimizer state and no batch
    // (parameter_server.cc), and each worker's receive buffers (server_loop.h): the f32
    // gradient (deterministic: int64 sums, and their sum), in async and ssp a snapshot of the
    // values it is sent. The fuller of the two. (Compressed messages are left out.)
    mem = state_bytes(terms, 0, st.whole, st.whole);
    mem[MemCategory::kOptimizer] = 0;
    server = state_bytes(engine_state_terms(parallel::Precision::kFp32, in.config.optim.kind), 3, 0,
                         st.server_shard);
    const double pushed = spec.deterministic ? 8 : 4;
    const double snapshot = spec.ps_mode == parallel::PsMode::kSync ? 0 : 4;
    server[MemCategory::kComm] = l.dp * (pushed + snapshot) * st.server_shard;
    if (spec.deterministic) server[MemCategory::kGradients] += 8 * st.server_shard;
  } else {
    mem = state_bytes(terms, spec.zero_stage, st.whole, st.shard);
    if (uses_shared_memory(spec, l, in.options) && spec.zero_stage == 1)
      mem[MemCategory::kParameters] += 4 * (st.shard - st.whole);  // one value copy per host
    if (spec.zero_stage == 3)  // gathered units: this one, and the next when prefetching
      mem[MemCategory::kComm] +=
          (overlaps(in, spec) && spec.zero_prefetch ? 2 : 1) * st.largest_unit * g_bytes;
    if (spec.zero_stage >= 2) {
      // ShardSync's f32 buckets: up to two open during a backward; a pipeline keeps every
      // unit's open through the step and reduces them all at its end, each with a copy in the
      // message's 16 bits (measured: fashion_mlp dp=2 pp=2 bf16 ZeRO-2 and 3, the first stage)
      mem[MemCategory::kComm] +=
          (l.pp > 1 ? st.whole : std::min(2 * st.largest_unit, st.whole)) * 4;
      if (l.pp > 1 && g_bytes < 4) mem[MemCategory::kComm] += st.whole * g_bytes;
    }
  }
  mem[MemCategory::kParameters] += st.tied_numel * g_bytes;  // a head stage's tied table
  mem[MemCategory::kGradients] += 4 * st.tied_numel;
  const Calibration::Variant& v = in.cal.variant(name_of(spec.precision), name_of(spec.recompute));
  const Micro mb = micro_of(in, spec, l, stage);
  // What the forwards keep (block_act_bytes, of the f32 forward, in this variant's proportion
  // but never more) is held for every micro-batch in flight; the rest of the peak (the
  // backward's transients) for one. fashion_cnn's bf16 one-rank peak is twice its f32 one (the
  // backward's conversions on a CPU without 16-bit arithmetic), but its first stage keeps
  // 1.07x the f32 bytes; char_gpt's bf16 keeps less, in its peak's proportion.
  const Calibration::Variant& base = in.cal.variant("fp32", "none");
  double kept = 0;
  for (double b : in.cal.block_act_bytes) kept += b / static_cast<double>(base.rows);
  kept =
      std::min(v.act_bytes_per_row,
               kept * std::min(1.0, v.act_bytes_per_row / std::max(1.0, base.act_bytes_per_row)));
  mem[MemCategory::kActivations] =
      (v.act_bytes_fixed + (kept * mb.in_flight + v.act_bytes_per_row - kept) * mb.rows) *
      st.act_share * (in.cal.tp_act_whole + (1 - in.cal.tp_act_whole) / l.tp);
  // The batch this rank reads (f32 or i32 inputs, i32 labels), its piece of it and the batches
  // the loader prefetches (trainer.cc)
  const double inputs = static_cast<double>(shape_numel(in.config.model.input_shape));
  const double row_bytes = 4 * inputs + 4 * (nn::reads_tokens(in.config.model) ? inputs : 1);
  const int ranks_here = in.options.workers / in.options.hosts;
  const int prefetch = resolve_prefetch(in.config.train.prefetch, ranks_here,
                                        in.config.runtime.threads, in.cal.cores);
  mem[MemCategory::kOther] = (2 + prefetch) * mb.replica_rows * row_bytes;
  if (l.pp > 1) {
    // Each way, a send's copy (kept until the peer takes it) and a received tensor (kept by the
    // stage's caches) for every micro-batch in flight and one more; the last stage as many as
    // the stage before it (measured: fashion_cnn and fashion_mlp, 2 and 4 stages).
    const int n = micro_of(in, spec, l, std::min(stage, l.pp - 2)).in_flight;
    mem[MemCategory::kComm] += (n + 1) * mb.rows * (st.in_width + st.out_width) * g_bytes;
  }
  return server.total() > mem.total() ? server : mem;
}

StepTime stage_time(const Inputs& in, const parallel::ParallelSpec& spec, const parallel::Layout& l,
                    const StageShape& st) {
  const Calibration::Variant& v = in.cal.variant(name_of(spec.precision), name_of(spec.recompute));
  const Micro mb = micro_of(in, spec, l, 0);
  const double held = l.servers > 0 || spec.zero_stage == 0 ? st.whole : st.shard;
  StepTime t;  // compute as on a core of its own (predict() adds the host's crowding)
  t.compute = v.step_s_per_row * mb.replica_rows * st.flops_share *
                  (in.cal.tp_time_whole + (1 - in.cal.tp_time_whole) / l.tp) +
              v.step_s_fixed * held / std::max(1.0, in.cal.arena_numel);
  // data parallel: all-reduce (ZeRO 1-2: reduce-scatter, then all-gather the f32 values;
  // ZeRO-3: two gathers of 16-bit units) or a parameter server's pushes and pulls
  const Link link = in.options.hosts > 1 ? in.across : in.here;
  const double g_bytes = spec.precision == parallel::Precision::kFp32 ? 4.0 : 2.0,
               grads = st.whole * g_bytes;
  double dp = 0, other = 0;
  if (l.servers > 0)
    dp = 2 * link.alpha + 2.0 * st.whole * 4 * l.dp / (l.servers * link.beta);
  else if (spec.zero_stage == 0)
    dp = ring_seconds(grads, l.dp, 2, link.alpha, link.beta);
  else
    dp = ring_seconds(grads, l.dp, 1, link.alpha, link.beta) +
         ring_seconds(st.whole * (spec.zero_stage == 3 ? 2 * g_bytes : 4), l.dp, 1, link.alpha,
                      link.beta);
  const double act_bytes = mb.rows * row_width(in.config);
  if (l.tp > 1)
    other += mb.m * tp_collectives(in.config, st.flops_share) *
             ring_seconds(act_bytes * 4, l.tp, 2, in.here.alpha, in.here.beta);
  // the group's measured waits: per pipeline message and per data-parallel step
  const bool crowded = in.options.workers / in.options.hosts > in.cal.cores;
  if (l.pp > 1) {
    t.sync += 2 * mb.m * (crowded ? in.cal.handoff_crowded_s : in.cal.handoff_s);
    other += mb.m *
             (2 * in.here.alpha + mb.rows * (st.in_width + st.out_width) * g_bytes / in.here.beta);
  }
  if (l.dp > 1 || l.servers > 0) t.sync += crowded ? in.cal.dp_step_crowded_s : in.cal.dp_step_s;
  other += t.sync;
  // with overlap the gradient traffic hides behind the backward (about 60% of the compute)
  t.comm = other + (overlaps(in, spec) ? std::max(0.0, dp - t.compute * 0.6) : dp);
  return t;
}

void predict(const Inputs& in, const parallel::ParallelSpec& spec, const parallel::Layout& l,
             const std::vector<StageShape>& stages, Candidate& c) {
  double work = 0;  // every training rank's compute, on cores of their own
  std::vector<double> compute;
  size_t slowest = 0;
  for (int s = 0; s < l.pp; ++s) {
    const StageShape& st = stages[static_cast<size_t>(s)];
    const StepTime t = stage_time(in, spec, l, st);
    work += t.compute * l.dp * l.tp;
    compute.push_back(t.compute);
    if (t.total() > c.time.total()) c.time = t, slowest = compute.size() - 1;
    const MemoryBytes mem = stage_memory(in, spec, l, st, s);
    if (mem.total() > c.memory.total()) c.memory = mem;
  }
  if (l.pp > 1)
    c.time.bubble = pipeline_bubble(
        compute, slowest,
        parallel::bubble_model(spec.pp_schedule, l.pp, static_cast<int>(spec.pp_microbatches),
                               static_cast<int>(spec.pp_virtual_stages)));
  c.time =
      share_host(c.time, work / in.options.hosts, in.options.workers / in.options.hosts, in.cal);
  c.samples_per_s = static_cast<double>(in.config.train.batch) / c.time.total();
  const int64_t cap = in.options.memory_per_rank;
  if (cap > 0 && c.memory.total() > static_cast<double>(cap))
    c.overflow = mem_category_name(c.memory.largest());
}

}  // namespace

namespace {

// The micro-batch counts tried for a pipeline of `pp` stages: pp, 2 pp and 4 pp where they
// divide the replica's rows (fewer fill the pipeline badly; more shrink the GEMMs).
std::vector<int> micro_choices(int pp, int64_t replica_rows) {
  if (pp == 1) return {1};
  std::vector<int> out;
  for (int k : {1, 2, 4})
    if (replica_rows % (k * pp) == 0) out.push_back(k * pp);
  return out;
}

// Every spec to try: the config's own keys with the layout's keys set.
std::vector<Candidate> enumerate(const Config& config, int workers,
                                 const std::vector<std::string>& precisions) {
  std::vector<Candidate> out;
  auto add = [&](int tp, int pp, int servers, int zero, int m, const std::string& precision,
                 const std::string& recompute) {
    Candidate c;
    c.spec = config.parallel;
    c.spec.tp_size = tp;
    c.spec.pp_stages = pp;
    c.spec.ps_servers = servers;
    c.spec.zero_stage = zero;
    c.spec.pp_microbatches = m;
    c.spec.precision = *value_of<parallel::Precision>(precision);
    c.spec.recompute = *value_of<nn::Recompute>(recompute);
    c.sets = {str("tp.size=", tp),
              str("pp.stages=", pp),
              str("zero.stage=", zero),
              str("ps.servers=", servers),
              "train.precision=" + precision,
              "train.recompute=" + recompute};
    if (pp > 1) c.sets.push_back(str("pp.microbatches=", m));
    out.push_back(std::move(c));
  };
  for (const std::string recompute : {"none", "selective", "full"})
    for (const std::string& precision : precisions) {
      for (int tp : divisors(workers)) {
        for (int pp : divisors(workers / tp)) {
          const int dp = workers / (tp * pp);
          // recompute in a pipeline keeps more than without it (docs/planning.md): not offered
          if (pp > 1 && recompute != "none") continue;
          for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
            for (int m : micro_choices(pp, config.train.batch / dp))
              add(tp, pp, 0, zero, m, precision, recompute);
        }
      }
      for (int servers = 1; servers <= std::min(2, workers - 1); ++servers)
        add(1, 1, servers, 0, 1, precision, recompute);
    }
  return out;
}

}  // namespace

void check_options(const PlanOptions& options) {
  if (options.workers < 1)
    throw InvalidArgument(str("plan: --workers must be >= 1, got ", options.workers));
  if (options.hosts < 1 || options.workers % options.hosts != 0)
    throw InvalidArgument(str("plan: --hosts ", options.hosts, " must divide --workers ",
                              options.workers, " (the same number of ranks on every host)"));
  if (options.hosts > 1 && !(options.bandwidth > 0))
    throw InvalidArgument(
        "plan: --hosts > 1 needs --bandwidth (bytes/s between hosts, e.g. 12.5GB for 100 "
        "Gbit/s) and --latency (seconds per message, e.g. 5e-6)");
}

std::vector<Candidate> plan_layouts(const Config& given, const PlanOptions& options,
                                    const Calibration& calibration) {
  Config config = given;  // the model shaped by its dataset, as the Trainer shapes it
  config.model.input_shape = calibration.input_shape;
  config.model.num_classes = calibration.num_classes;
  check_options(options);
  const Link measured{calibration.link_latency_s, calibration.link_bytes_per_s};
  const Link stated{options.latency, options.bandwidth};
  const Inputs in{config, options, calibration,
                  options.hosts == 1 && options.bandwidth > 0 ? stated : measured, stated};
  std::map<std::tuple<int, int, int>, std::vector<StageShape>> shapes;  // by (tp, pp, shard)
  std::vector<Candidate> out;
  for (Candidate& c : enumerate(config, options.workers, options.precisions)) {
    try {
      const parallel::Layout l = parallel::Layout::resolve(c.spec, options.workers);
      parallel::compose(c.spec, l, false);  // a combination the decision table refuses
      // a pipeline's replicas each cut their rows into pp.microbatches (Engine::check_batch)
      const int64_t replica_rows = config.train.batch / l.dp;
      if (replica_rows < 1 || replica_rows % c.spec.pp_microbatches != 0 ||
          (l.pp > 1 && config.train.batch % l.dp != 0))
        continue;
      const auto key = std::make_tuple(l.tp, l.pp, l.shard);
      if (!shapes.count(key)) shapes[key] = stage_shapes(config, c.spec, l, calibration);
      c.layout = l.str();
      predict(in, c.spec, l, shapes[key], c);
      out.push_back(std::move(c));
    } catch (const InvalidArgument&) {
      // a layout the engine refuses (the tp cut of the model, the partition): not offered
    }
  }
  if (out.empty())
    throw InvalidArgument(str("plan: no layout of ", options.workers,
                              " ranks runs this config; try another --workers"));
  rank_candidates(out);
  return out;
}

}  // namespace tessel::train
