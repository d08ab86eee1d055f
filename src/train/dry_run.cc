#include "tessel/train/dry_run.h"

#include "tessel/comm/threads.h"
#include "tessel/core/error.h"
#include "tessel/train/trainer.h"

namespace tessel::train {

using nlohmann::json;

json dry_run(const Config& config, int world) {
  const data::Splits data = data::make_datasets(config.data);
  RunOptions opts;
  opts.progress = false;
  json plan;
  std::vector<json> memory(static_cast<size_t>(world));
  comm::run_threads(world, [&](comm::Communicator& c) {
    const Trainer trainer(config, opts, world == 1 ? nullptr : &c, &data);
    json p = trainer.plan();
    memory[static_cast<size_t>(c.rank())] = p["memory_bytes"];
    if (c.rank() == 0) plan = std::move(p);
  });
  plan.erase("memory_bytes");
  plan["memory_bytes_per_rank"] = memory;
  return plan;
}

}  // namespace tessel::train
