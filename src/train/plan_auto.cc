// layout = "auto": the plan's pick for the ranks train starts (plan_auto.h).
#include "tessel/train/plan_auto.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "tessel/core/error.h"

namespace tessel::train {

using nlohmann::json;

namespace {

std::string name_of(const Candidate& c) { return c.layout + " " + options_str(c.spec); }

json prediction(const Candidate& c) {
  return {{"layout", name_of(c)},
          {"samples_per_second", c.samples_per_s},
          {"step_seconds", c.time.total()},
          {"memory_bytes", c.memory.total()}};
}

// What shrinks a category on a rank, beyond the layouts auto already tried.
std::string advice(MemCategory c) {
  switch (c) {
    case MemCategory::kParameters:
    case MemCategory::kGradients:
      return "use more workers (ZeRO and pipeline stages share them out)";
    case MemCategory::kOptimizer:
      return "use more workers (ZeRO shards the state) or optim.kind = sgd (one state per value)";
    case MemCategory::kActivations:
      return "lower train.batch or use more workers (each holds a share of the batch)";
    default:
      return "lower train.batch or ddp.bucket_mb";
  }
}

std::string no_fit(const Candidate& smallest, const PlanOptions& o) {
  const double mib = static_cast<double>(1 << 20);
  return str("layout = auto: no layout of ", o.workers, " ranks is predicted to fit ",
             std::lround(static_cast<double>(o.memory_per_rank) / mib * 10) / 10.0, " MiB (",
             std::lround(100 * kAutoMemoryShare),
             "% of runtime.memory_limit_mb, the rest for the prediction's error): the smallest, ",
             name_of(smallest), ", needs ", size_str(smallest.memory.total()),
             " per rank, most of it ", smallest.overflow, "; ", advice(smallest.memory.largest()),
             ", or raise runtime.memory_limit_mb to ",
             static_cast<int64_t>(std::ceil(smallest.memory.total() / kAutoMemoryShare / mib)));
}

// config with the layout keys `sets` and layout = "manual" (parsed as a config file is, so
// that the keys are checked together).
Config with_layout(const Config& config, std::vector<std::string> sets) {
  sets.push_back("layout=manual");
  return parse_config(to_toml(config), config.name, sets);
}

// Rank 0's answer under MPI: the pick's keys, notes and record, or the error every rank throws.
json decide(const Config& config, int workers, const std::string& cache_dir) {
  try {
    const LayoutChoice c = resolve_layout(config, workers, nullptr, cache_dir);
    return {{"notes", c.notes}, {"record", c.record}};
  } catch (const std::exception& e) {
    return {{"error", e.what()}};
  }
}

}  // namespace

LayoutChoice choose_layout(const Config& config, const std::vector<Candidate>& plan,
                           const PlanOptions& options) {
  if (plan.empty())
    throw InvalidArgument(str("layout = auto: no layout of ", options.workers,
                              " ranks runs this config; set the layout keys by hand"));
  const Candidate& best = plan.front();
  if (!best.overflow.empty()) throw InvalidArgument(no_fit(best, options));
  const auto feasible = std::count_if(plan.begin(), plan.end(),
                                      [](const Candidate& c) { return c.overflow.empty(); });
  const Candidate* next = feasible > 1 ? &plan[1] : nullptr;
  LayoutChoice out;
  out.config = with_layout(config, best.sets);
  const double cap_mib = static_cast<double>(options.memory_per_rank) / (1 << 20);
  out.notes.push_back(
      str("layout = auto: ", name_of(best), ", predicted ",
          std::lround(best.samples_per_s * 10) / 10.0, " samples/s (step ",
          std::lround(best.time.total() * 1e4) / 10.0, " ms), ", size_str(best.memory.total()),
          " per rank: the fastest of ", feasible, " layouts of ", options.workers, " ranks",
          options.memory_per_rank > 0
              ? str(" predicted under ", std::lround(cap_mib * 10) / 10.0, " MiB (",
                    std::lround(100 * kAutoMemoryShare), "% of runtime.memory_limit_mb)")
              : std::string(""),
          " in train.precision = ", tessel::name_of(config.parallel.precision)));
  json record = {{"chosen", prediction(best)},
                 {"set", best.sets},
                 {"feasible", feasible},
                 {"layouts", plan.size()},
                 {"memory_cap_bytes", options.memory_per_rank},
                 {"runner_up", nullptr}};
  if (next != nullptr) {
    const double margin = best.samples_per_s / next->samples_per_s - 1;
    out.notes.push_back(str("  runner-up ", name_of(*next), ": ",
                            std::lround(next->samples_per_s * 10) / 10.0, " samples/s, ",
                            margin < 1e-3 ? std::string("as fast (the pick holds less memory, ")
                                          : str(std::lround(margin * 1000) / 10.0, "% slower ("),
                            size_str(next->memory.total()), " per rank)"));
    record["runner_up"] = prediction(*next);
    record["margin"] = margin;
  }
  std::string keys;
  for (const std::string& s : best.sets) keys += " " + s;
  out.notes.push_back("  its keys (kept in the run's config.toml for --resume):" + keys);
  out.record = std::move(record);
  return out;
}

LayoutChoice resolve_layout(const Config& config, int workers, comm::Communicator* world,
                            const std::string& cache_dir) {
  if (config.layout != LayoutMode::kAuto) return {config, {}, nullptr};
  if (world == nullptr) {
    PlanOptions o;
    o.workers = workers;
    o.memory_per_rank = static_cast<int64_t>(
        static_cast<double>(config.parallel.memory_limit_mb << 20) * kAutoMemoryShare);
    o.precisions = {tessel::name_of(config.parallel.precision)};
    const Calibration cal = calibrate(config, cache_dir.empty() ? default_cache_dir() : cache_dir);
    return choose_layout(config, plan_layouts(config, o, cal), o);
  }
  // Rank 0 calibrates and plans (the others wait: the calibration may take half a minute).
  std::string answer = world->rank() == 0 ? decide(config, workers, cache_dir).dump() : "";
  int64_t size = static_cast<int64_t>(answer.size());
  comm::CallOptions wait;
  wait.timeout_s = std::max(600.0, config.comm.timeout_s);
  world->broadcast(&size, 1, comm::ElemType::kI64, 0, wait);
  answer.resize(static_cast<size_t>(size));
  world->broadcast(answer.data(), answer.size(), comm::ElemType::kU8, 0);
  const json a = json::parse(answer);
  if (a.contains("error")) throw InvalidArgument(a["error"].get<std::string>());
  const json& record = a["record"];
  return {with_layout(config, record["set"].get<std::vector<std::string>>()),
          a["notes"].get<std::vector<std::string>>(), record};
}

}  // namespace tessel::train
