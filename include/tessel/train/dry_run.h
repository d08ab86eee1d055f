// The dry run behind `tessel config`: the run `train` would start, set up by the same code on
// the same number of ranks (as threads of this process, however train would start them) up to
// its first step -- datasets, model, layout, engine, pipeline partition and schedule, loader,
// memory limit -- so a config train would reject fails here with train's message. Nothing is
// trained and nothing is written.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessel/config/config.h"

namespace tessel::train {

// Sets up `config` on `world` ranks and returns rank 0's Trainer::plan() with every rank's
// measured bytes ("memory_bytes_per_rank"). Throws what train would throw before training.
nlohmann::json dry_run(const Config& config, int world);

}  // namespace tessel::train
