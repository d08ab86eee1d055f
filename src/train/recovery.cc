#include "tessel/train/recovery.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/threads.h"
#include "tessel/core/log.h"
#include "tessel/ops/cpu.h"
#include "tessel/train/snapshots.h"

namespace tessel::train {

namespace {

// Where the ranks restart after a failure: the newest complete snapshot, else the newest
// checkpoint in the run folder, else where this run began. Sets opts and returns it in words.
std::string choose_restart(const Snapshots* snapshots, const std::string& run_dir,
                           const RunOptions& original, RunOptions& opts, int64_t* from_step) {
  opts.run_dir = run_dir;
  opts.resume_snapshot = snapshots != nullptr && snapshots->latest() != nullptr;
  if (opts.resume_snapshot) {
    *from_step = snapshots->latest_step();
    return snapshots->latest()->dir();
  }
  try {
    opts.resume = ckpt::resolve_checkpoint_dir(run_dir);
  } catch (const IoError&) {  // no checkpoint yet
    opts.resume = original.resume;
  }
  *from_step = -1;
  opts.overwrite = true;  // from the start: the failed attempt's files go (with a resume: kept)
  return opts.resume.empty() ? std::string("the start") : opts.resume;
}

}  // namespace

nlohmann::json train_threads(const Config& config, const RunOptions& options,
                             const comm::CommOptions& comm) {
  const int workers = config.runtime.workers;
  if (config.fault.fail_rank >= 0 && config.fault.fail_mode == FailMode::kStop)
    throw InvalidArgument(
        "config: debug.fail_mode = stop stops the whole process, which with ranks as threads is "
        "every rank; use debug.fail_mode = hang");
  if (workers > 1) {  // each rank computes with one BLAS thread; the ranks are the parallelism
    if (config.runtime.threads > 1)
      log_warn("runtime.threads = ", config.runtime.threads, " ignored: ", workers,
               " workers as threads each use one BLAS thread");
    ops::set_blas_threads(1);
  }
  const data::Splits data = data::make_datasets(config.data);  // read once, shared
  std::unique_ptr<Snapshots> snapshots;
  if (config.train.max_restarts > 0 && config.checkpoint.snapshot_steps > 0)
    snapshots = std::make_unique<Snapshots>(workers);
  Config cfg = config;
  RunOptions opts = options;
  opts.snapshots = snapshots.get();
  nlohmann::json summary, restarts = nlohmann::json::array();
  std::string run_dir;
  for (;;) {
    std::atomic<int> started{0};
    try {
      comm::run_threads(
          workers,
          [&](comm::Communicator& world) {
            Trainer trainer(cfg, opts, &world, &data);
            if (world.rank() == 0) run_dir = trainer.run_dir();
            started.fetch_add(1);
            nlohmann::json s = trainer.run();
            if (world.rank() == 0) summary = std::move(s);
          },
          comm);
      // The last try wrote summary.json without the restarts before it.
      if (!restarts.empty() && !run_dir.empty()) {
        summary["restarts"] = restarts;
        ckpt::write_file_atomic(run_dir + "/summary.json", summary.dump(2) + "\n");
      }
      return summary;
    } catch (const std::exception& e) {
      const bool mendable = dynamic_cast<const InvalidArgument*>(&e) == nullptr;
      const bool stopping = options.interrupt != nullptr && options.interrupt->load();
      if (!mendable || stopping || started.load() < workers ||
          static_cast<int>(restarts.size()) >= config.train.max_restarts)
        throw;
      if (snapshots) snapshots->abandon();
      int64_t from_step = -1;
      const std::string from = choose_restart(snapshots.get(), run_dir, options, opts, &from_step);
      cfg.fault.fail_rank = -1;  // an injected fault happens once
      restarts.push_back({{"from_step", from_step}, {"error", excerpt(e.what())}});
      log_warn("recovery: a rank failed: ", e.what(), "; restart ", restarts.size(), " of ",
               config.train.max_restarts, ": every rank resumes from ", from);
    }
  }
}

void inject_fault(const FaultSpec& fault, comm::Communicator& world, int64_t step) {
  if (step != fault.fail_step || world.rank() != fault.fail_rank) return;
  const std::string what =
      str("debug: injected failure (debug.fail_mode = ", name_of(fault.fail_mode), ") on rank ",
          world.rank(), " after step ", step);
  if (fault.fail_mode == FailMode::kThrow) throw Error(what);
  log_warn(what);
  if (fault.fail_mode == FailMode::kKill) ::raise(SIGKILL);
  if (fault.fail_mode == FailMode::kStop)
    ::raise(SIGSTOP);  // until SIGCONT, or killed with the job
  // hang: alive (an MPI rank's monitor thread still beats) but no progress, until the others
  // give up on this rank and abort the group. Its CommError then carries their reason (which
  // names this rank), so the run reports the hang whichever rank's error reaches it first.
  for (;;) {
    world.transport().check_alive();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void check_restored_params(parallel::Engine& engine, const std::string& expected,
                           const std::string& dir) {
  // Parameter servers hold the values and serve them only once training starts.
  if (expected.empty() || engine.layout().servers > 0) return;
  const std::string got = engine.params_sha256();
  if (got != expected)
    throw IoError(str("checkpoint: the parameters loaded from ", dir, " have params_sha256 ",
                      got.substr(0, 16), "..., but its trainer.json records ",
                      expected.substr(0, 16),
                      "...; its files pass their checksums, so loading them went wrong (a bug: "
                      "please report it); resume from another checkpoint meanwhile"));
}

}  // namespace tessel::train
