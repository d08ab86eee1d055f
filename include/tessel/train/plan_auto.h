// layout = "auto" (and `tessel train --layout auto`): train plans the config for its ranks as
// `tessel plan` does (the calibration cached per host, ISA and model) and trains the fastest
// layout predicted to fit runtime.memory_limit_mb. The pick is said (with the runner-up and
// the margin), recorded in run.json, and its keys written into the run's config.toml with
// layout = "manual", so that a resume trains the same layout.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/config/config.h"
#include "tessel/train/plan.h"

namespace tessel::train {

// The share of runtime.memory_limit_mb a pick may be predicted to use: the rest covers the
// prediction's error (within 10% of the measured peak, docs/planning.md).
constexpr double kAutoMemoryShare = 0.9;

struct LayoutChoice {
  Config config;                   // the given one with the pick's keys set, layout = "manual"
  std::vector<std::string> notes;  // what train says: the pick, why, the runner-up and margin
  nlohmann::json record;           // run.json's "layout_auto"
};

// The best feasible layout of a plan (ranked by plan_layouts, of config's train.precision).
// Throws InvalidArgument naming the category that overflows and what to change when no layout
// fits under options.memory_per_rank.
LayoutChoice choose_layout(const Config& config, const std::vector<Candidate>& plan,
                           const PlanOptions& options);

// config as train runs it: unchanged unless layout = "auto"; then calibrated (cache_dir, ""
// for default_cache_dir()), planned for `workers` ranks on one host and chosen. With an MPI
// `world` rank 0 decides and broadcasts the pick (or its error), so every rank trains the same
// layout and fails alike; null: ranks as threads of this process, decided here.
LayoutChoice resolve_layout(const Config& config, int workers, comm::Communicator* world,
                            const std::string& cache_dir = "");

}  // namespace tessel::train
