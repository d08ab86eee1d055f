// Pipeline partitions: which blocks each stage runs.
#include <algorithm>
#include <limits>

#include "tessel/core/error.h"
#include "tessel/parallel/pipeline.h"

namespace tessel::parallel {
namespace {

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// Contiguous cuts minimising the most expensive stage (exact dynamic programme; models have
// tens of blocks). best[s][i]: the smallest maximum stage cost of blocks [0, i) on s stages.
std::vector<size_t> balanced_cuts(const std::vector<double>& cost, int stages) {
  const size_t n = cost.size();
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<size_t>> from(stages + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (size_t i = s; i <= n; ++i)
      for (size_t k = s - 1; k < i; ++k) {
        double v = std::max(best[s - 1][k], prefix[i] - prefix[k]);
        if (v < best[s][i]) best[s][i] = v, from[s][i] = k;
      }
  std::vector<size_t> begin(stages + 1, n);
  for (int s = stages; s > 0; --s) begin[s - 1] = from[s][begin[s]];
  return begin;
}

// The number of chunks: pp.stages, times pp.virtual_stages for the interleaved schedule.
size_t chunk_count(const ParallelSpec& spec, size_t n, int stages) {
  const int64_t v = spec.pp_virtual_stages;
  const bool interleaved = spec.pp_schedule == PpSchedule::kInterleaved;
  if (v != 1 && !interleaved)
    throw InvalidArgument(str("config: pp.virtual_stages = ", v,
                              " needs pp.schedule = ", "interleaved (", name_of(spec.pp_schedule),
                              " runs one chunk per stage); set pp.schedule = interleaved or "
                              "pp.virtual_stages = 1"));
  if (interleaved && v < 2)
    throw InvalidArgument(str("config: pp.schedule = interleaved needs pp.virtual_stages >= 2 ",
                              "chunks per stage, got ", v,
                              "; for one chunk per stage use pp.schedule = 1f1b"));
  if (interleaved && spec.pp_cuts.empty() && spec.pp_partition == PpPartition::kRoundRobin)
    throw InvalidArgument(
        "config: pp.partition = round_robin makes every block a chunk, which pp.schedule = "
        "interleaved does not take; use pp.partition = balanced or uniform, which cut the "
        "model into pp.stages x pp.virtual_stages chunks");
  const size_t chunks = static_cast<size_t>(stages) * static_cast<size_t>(v);
  if (chunks > n)
    throw InvalidArgument(
        v > 1
            ? str("config: pp.stages x pp.virtual_stages = ", stages, " x ", v, " = ", chunks,
                  " chunks is more than the model's ", n,
                  " blocks; every chunk needs at least one block, so use ",
                  n / stages >= 2 ? str("pp.virtual_stages <= ", n / stages)
                                  : str("pp.stages <= ", n / 2, " or pp.schedule = 1f1b"))
            : str("config: pp.stages = ", stages, " is more than the model's ", n,
                  " blocks; every stage needs at least one block, so use at most ", n, " stages"));
  return chunks;
}

}  // namespace

Partition make_partition(const ParallelSpec& spec, nn::Model& model, int stages) {
  const size_t n = model.num_blocks();
  const size_t chunks = chunk_count(spec, n, stages);
  const char* unit = chunks > static_cast<size_t>(stages) ? "chunks" : "stages";
  Partition p;
  if (!spec.pp_cuts.empty()) {
    std::vector<int64_t> even;
    for (size_t c = 1; c < chunks; ++c) even.push_back(static_cast<int64_t>(n * c / chunks));
    if (spec.pp_cuts.size() != chunks - 1)
      throw InvalidArgument(str("config: pp.cuts must list the first block of ", unit, " 1..",
                                chunks - 1, " (", chunks - 1, " numbers), got ",
                                list_str(spec.pp_cuts), "; e.g. pp.cuts = ", list_str(even), " (",
                                chunks, " ", unit, " of about equal block counts)"));
    int64_t prev = 0;
    for (int64_t c : spec.pp_cuts) {
      if (c <= 0 || c >= static_cast<int64_t>(n))
        throw InvalidArgument(str("config: pp.cuts must lie in [1, ", n - 1, "] (the model has ", n,
                                  " blocks), got ", list_str(spec.pp_cuts)));
      if (c <= prev)
        throw InvalidArgument(str("config: pp.cuts must be strictly increasing, got ",
                                  list_str(spec.pp_cuts),
                                  "; list each stage's first block in order"));
      prev = c;
    }
    p.begin.push_back(0);
    for (int64_t c : spec.pp_cuts) p.begin.push_back(static_cast<size_t>(c));
  } else if (spec.pp_partition == PpPartition::kRoundRobin) {
    for (size_t i = 0; i < n; ++i) p.begin.push_back(i);
  } else if (spec.pp_partition == PpPartition::kUniform) {
    for (size_t c = 0; c < chunks; ++c) p.begin.push_back(n * c / chunks);
  } else {  // balanced
    // Estimated compute per block: forward plus backward, which costs two forwards (weight and
    // input gradient) or one where the block skips its input gradient (the first block).
    // Blocks without a FLOP count (activations, pooling) get a small share so that they still
    // spread when nothing else distinguishes the stages.
    std::vector<double> cost(n);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      nn::Module& b = model.block(i);
      total += cost[i] = b.forward_flops(1) * (b.input_grad() ? 3 : 2);
    }
    for (size_t i = 0; i < n; ++i) cost[i] += total > 0 ? 1e-3 * total / n : 1.0;
    std::vector<size_t> b = balanced_cuts(cost, static_cast<int>(chunks));
    p.begin.assign(b.begin(), b.end() - 1);
  }
  for (size_t c = 0; c < p.begin.size(); ++c) p.stage.push_back(static_cast<int>(c % stages));
  p.begin.push_back(n);
  return p;
}

}  // namespace tessel::parallel
