// Recovery from rank failures, for ranks that are threads of this process: restarting them
// from an in-memory snapshot (snapshots.h) or the newest checkpoint (train.max_restarts); the
// check that restored parameters are the ones that were saved; and the failures debug.fail_*
// injects to test all of it. Processes under MPI are restarted from outside, by
// `tessel launch` (docs/fault_tolerance.md).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/config/config.h"
#include "tessel/parallel/engine.h"
#include "tessel/train/trainer.h"

namespace tessel::train {

// Trains `config` with runtime.workers ranks as threads of this process and returns rank 0's
// summary. When a rank fails after every rank has started (an error, an injected fault, a rank
// stalled past comm.timeout_s) and train.max_restarts allows, every rank restarts, with a
// warning, from the newest complete in-memory snapshot (checkpoint.snapshot_steps), else the
// newest checkpoint of the run folder, else where the run began. The summary then lists the
// restarts ("restarts": [{"from_step", "error"}]). Errors that a restart cannot mend (bad
// config, a stop request) end the run.
nlohmann::json train_threads(const Config& config, const RunOptions& options,
                             const comm::CommOptions& comm);

// debug.fail_*: when `step` is fault.fail_step and world's rank is fault.fail_rank, fails as
// fault.fail_mode asks: throw (an Error), kill (SIGKILL of this process), hang (stops making
// progress until the group is aborted, then throws CommError) or stop (SIGSTOP of this
// process). Called once per step at the step boundary, outside the hot path.
void inject_fault(const FaultSpec& fault, comm::Communicator& world, int64_t step);

// After a restore (collective): the engine's parameters hash to `expected`, the params_sha256
// that trainer.json recorded at save time (skipped when empty, and with parameter servers,
// whose values are read only once they serve). Throws IoError naming dir otherwise.
void check_restored_params(parallel::Engine& engine, const std::string& expected,
                           const std::string& dir);

}  // namespace tessel::train
