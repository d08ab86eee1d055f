// The planner on paper (plan_scale.h). Terms: s sequence length, b micro-batch sequences, h
// hidden width, a heads, t tensor-parallel ranks, L layers, P pipeline stages, m micro-batches.
#include "tessel/train/plan_scale.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/parallel/schedule.h"

namespace tessel::train {

GptShape gpt_preset(const std::string& name) {
  // GPT-2 XL (Radford et al. 2019) and GPT-3 Table 2.1 (Brown et al. 2020)
  if (name == "1.5b") return {48, 1600, 25, 1024, 50257};
  if (name == "2.7b") return {32, 2560, 32, 2048, 50257};
  if (name == "6.7b") return {32, 4096, 32, 2048, 50257};
  if (name == "13b") return {40, 5120, 40, 2048, 50257};  // 5140 in the paper; 5120 divides
  if (name == "175b") return {96, 12288, 96, 2048, 50257};
  throw InvalidArgument(
      str("plan: --gpt ", name, " is not a known size; use 1.5b, 2.7b, 6.7b, 13b or 175b"));
}

double gpt_parameters(const GptShape& g) {
  const double L = static_cast<double>(g.layers), h = static_cast<double>(g.hidden);
  return 12 * L * h * h + 13 * L * h + static_cast<double>(g.vocab + g.seq) * h;
}

double layer_activation_bytes(const GptShape& g, int64_t b, int tp, bool sequence,
                              const std::string& recompute) {
  const double s = static_cast<double>(g.seq), h = static_cast<double>(g.hidden),
               a = static_cast<double>(g.heads), t = tp, sbh = s * static_cast<double>(b) * h;
  if (recompute == "full") return 2 * sbh;
  const double attention = recompute == "selective" ? 0 : 5 * a * s / h;  // scores, softmax
  if (sequence) return sbh / t * (34 + attention);
  return sbh * (10 + 24 / t + attention / t);
}

namespace {

Candidate predict_gpt(const GptShape& g, const ScaleOptions& o, int tp, int pp, int zero,
                      const std::string& recompute) {
  Candidate c;
  const int dp = o.workers / (tp * pp);
  const int64_t m = o.global_batch / (dp * o.micro_batch);
  c.spec.tp_size = tp;
  c.spec.pp_stages = pp;
  c.spec.zero_stage = zero;
  c.spec.pp_microbatches = m;
  c.spec.precision = parallel::Precision::kBf16;
  c.spec.recompute = *value_of<nn::Recompute>(recompute);
  c.spec.tp_sequence = tp > 1;
  c.layout = str("dp=", dp, " pp=", pp, " tp=", tp, tp > 1 ? " sp" : "");
  c.sets = {str("tp.size=", tp),
            str("pp.stages=", pp),
            str("zero.stage=", zero),
            str("pp.microbatches=", m),
            "train.precision=bf16",
            "train.recompute=" + recompute,
            str("tp.sequence_parallel=", tp > 1 ? "true" : "false")};
  const double params = gpt_parameters(g) / (tp * pp);  // per rank before ZeRO
  c.memory = state_bytes(engine_state_terms(parallel::Precision::kBf16, optim::OptimKind::kAdamw),
                         zero, params, params / dp);
  // 1F1B: the first stage holds P micro-batches of its L / P layers (Korthikanti sec. 4.2)
  const double in_flight = static_cast<double>(std::min<int64_t>(m, pp));
  c.memory[MemCategory::kActivations] =
      layer_activation_bytes(g, o.micro_batch, tp, tp > 1, recompute) *
      static_cast<double>(g.layers) / pp * in_flight;
  // compute: 6 flops per parameter per token, plus a forward again under full recompute
  const double tokens = static_cast<double>(o.global_batch * g.seq);
  const double per_token = recompute == "full" ? 8.0 : recompute == "selective" ? 6.2 : 6.0;
  c.time.compute = per_token * gpt_parameters(g) * tokens / (o.workers * o.flops_per_rank);
  // dp: gradient all-reduce (reduce-scatter + all-gather from stage 1) in 16 bits across hosts
  const double grads = params * 2;
  const double dp_s = ring_seconds(grads, dp, zero == 3 ? 3 : 2, o.latency, o.bandwidth);
  // tp: 4 all-reduces of s b h per layer per micro-batch (all-gather/reduce-scatter pairs with
  // sequence parallelism: the same bytes), within a host
  const double act = static_cast<double>(g.seq * o.micro_batch * g.hidden) * 2;
  const double tp_s = static_cast<double>(m) * static_cast<double>(g.layers) / pp * 4 *
                      ring_seconds(act, tp, 2, o.latency, o.host_bandwidth);
  const double pp_s = pp > 1 ? 2.0 * static_cast<double>(m) * (o.latency + act / o.bandwidth) : 0;
  c.time.comm = dp_s + tp_s + pp_s;
  if (pp > 1) {
    const double f =
        parallel::bubble_model(parallel::PpSchedule::k1f1b, pp, static_cast<int>(m), 1);
    c.time.bubble = c.time.compute * f / (1 - f);
  }
  c.samples_per_s = static_cast<double>(o.global_batch) / c.time.total();
  if (o.memory_per_rank > 0 && c.memory.total() > static_cast<double>(o.memory_per_rank))
    c.overflow = mem_category_name(c.memory.largest());
  return c;
}

}  // namespace

std::vector<Candidate> plan_gpt(const GptShape& g, const ScaleOptions& o) {
  if (o.workers < 1 || o.global_batch < 1 || o.micro_batch < 1)
    throw InvalidArgument(str("plan: --workers, --batch and --micro-batch must be >= 1, got ",
                              o.workers, ", ", o.global_batch, ", ", o.micro_batch));
  std::vector<Candidate> out;
  for (int tp = 1; tp <= std::min(o.workers, o.ranks_per_host); tp *= 2)
    for (int pp = 1; tp * pp <= o.workers; pp *= 2) {
      if (o.workers % (tp * pp) != 0 || g.layers % pp != 0 || g.heads % tp != 0) continue;
      const int dp = o.workers / (tp * pp);
      if (o.global_batch % (static_cast<int64_t>(dp) * o.micro_batch) != 0) continue;
      for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
        for (const std::string recompute : {"none", "selective", "full"})
          out.push_back(predict_gpt(g, o, tp, pp, zero, recompute));
    }
  if (out.empty())
    throw InvalidArgument(str("plan: no layout of ", o.workers, " ranks divides the model (",
                              g.layers, " layers, ", g.heads, " heads) and the batch ",
                              o.global_batch, "; use a power of two of ranks"));
  rank_candidates(out);
  return out;
}

}  // namespace tessel::train
