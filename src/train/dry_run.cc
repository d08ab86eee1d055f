#include "tessel/train/dry_run.h"

#include "tessel/comm/threads.h"
#include "tessel/core/error.h"
#include "tessel/train/trainer.h"

namespace tessel::train {

using nlohmann::json;

comm::Backend resolve_backend(const Config& config, bool under_mpi) {
  const BackendChoice choice = config.runtime.backend;
  const comm::Backend backend =
      choice == BackendChoice::kMpi || (choice == BackendChoice::kAuto && under_mpi)
          ? comm::Backend::kMpi
          : comm::Backend::kThreads;
  if (backend == comm::Backend::kMpi && config.runtime.workers > 1)
    throw InvalidArgument(
        "runtime.workers (--workers) is for ranks as threads; under mpirun use -np instead");
  return backend;
}

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
