// Cost of train.trace: fashion_mlp on 2 workers (ranks as threads, batch 128), the same run
// alternating rounds of steps with every rank's tracer recording and not recording, so drift on
// a shared machine hits both alike. Each recording round is one trace window, as a run records
// it: a fresh tracer that holds the round's events. Prints the median samples/s of each and the
// overhead of tracing on ((off - on) / off). Tracing off is a null pointer check at each
// instrumented point.
//
//   trace_overhead [--rounds R] [--steps N] [--config examples/fashion_mlp.toml] [--workers 2]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/core/memory.h"
#include "tessel/core/trace.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"
#include "tessel/train/trainer.h"

using namespace tessel;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  int rounds = 21, steps = 40, workers = 2;
  std::string config = std::string(TESSEL_SOURCE_DIR) + "/examples/fashion_mlp.toml";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rounds")
      rounds = std::stoi(argv[i + 1]);
    else if (a == "--steps")
      steps = std::stoi(argv[i + 1]);
    else if (a == "--workers")
      workers = std::stoi(argv[i + 1]);
    else if (a == "--config")
      config = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: trace_overhead [--rounds R] [--steps N] [--workers W] [--config F]\n");
      return 2;
    }
  }
  set_log_level(LogLevel::kWarn);
  ops::set_blas_threads(1);
  const train::Config cfg = train::load_config(config, {"train.batch=128"});
  const data::Splits data = data::make_datasets(cfg.data);
  std::vector<double> on_sps, off_sps;
  size_t events = 0;
  comm::run_threads(workers, [&](comm::Communicator& world) {
    train::RunOptions opts;
    opts.progress = false;
    opts.run_dir = "/tmp/tessel_trace_overhead";
    train::Trainer trainer(cfg, opts, &world, &data);
    MemoryScope memory(trainer.ledger(), MemCategory::kOther);  // as in Trainer::run
    data::LoaderOptions lo;
    lo.batch = 128;
    lo.seed = cfg.seed;
    lo.slice_rank = world.rank();
    lo.slice_count = workers;
    data::DataLoader loader(data.train, lo);
    loader.start_epoch(0);
    std::vector<std::vector<data::Batch>> batches(16, std::vector<data::Batch>(1));
    for (auto& b : batches) loader.next(b[0]);
    train::EvalResult sums;
    int64_t step = 0;
    auto run = [&](int n) {
      for (int i = 0; i < n; ++i, ++step) {
        TraceSpan span("step", "step");  // as the Trainer's loop records it
        trainer.step(batches[static_cast<size_t>(step) % batches.size()], sums);
      }
    };
    run(20);  // warm-up
    for (int r = 0; r < 2 * rounds; ++r) {
      const bool on = r % 2 == (r / 2) % 2;  // on, off, off, on, on, off, ...
      Tracer tracer;
      TraceScope scope(&tracer);
      tracer.set_recording(on);
      world.barrier();
      const double t0 = now_seconds();
      run(steps);
      world.barrier();
      const double sps = steps * 128.0 / (now_seconds() - t0);
      if (world.rank() == 0) (on ? on_sps : off_sps).push_back(sps);
      if (world.rank() == 0 && on) events += tracer.size();
    }
  });
  const double on = median(on_sps), off = median(off_sps);
  std::printf("trace_overhead: %s, %d workers, batch 128, %d rounds of %d steps each way\n",
              config.c_str(), workers, rounds, steps);
  std::printf(
      "tracing off: %.0f samples/s (median)\ntracing on:  %.0f samples/s (median), %zu "
      "events recorded on rank 0 (%.1f per step)\noverhead: %.2f%%\n",
      off, on, events, static_cast<double>(events) / (rounds * steps), 100.0 * (off - on) / off);
  return 0;
}
