// Pipeline bubble benchmark: stages of fixed simulated compute (tests/parallel/pipeline_testing.h:
// forward sleeps F ms, backward 2F ms per stage, under zb-h1 split into B and W of F ms each),
// ranks as threads. For P = 2, 4 and m = 1, 4, 8 under gpipe, 1f1b, interleaved (v = 2 chunks per
// stage of F / 2 each, so every stage computes as much as under the others) and zb-h1 it prints
// the measured bubble fraction (mean over stages of idle / schedule time) beside the model
// (parallel::bubble_model: (P-1)/(m+P-1), interleaved (P-1)/(v m+P-1), zb-h1 (P-1)/(3m+P-1)),
// the peak activation memory and micro-batches in flight per stage, and zb-h1's bubble over
// 1f1b's; with --trace it draws the measured timeline of the last step for P = 4, m = 8
// (docs/pipeline.md).
//
// Usage: pipeline_bubble [--forward-ms F] [--steps N] [--trace]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "pipeline_testing.h"
#include "tessel/comm/threads.h"
#include "tessel/ops/isa.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/engine.h"
#include "tessel/parallel/pipeline.h"

using namespace tessel;

namespace {

struct Result {
  double measured = 0;
  std::vector<double> peak_bytes, peak_inflight;
  std::vector<std::vector<parallel::TraceEvent>> trace;  // by stage
};

Result measure(int P, int m, int v, parallel::PpSchedule schedule, double forward_ms, int steps) {
  Result res;
  res.peak_bytes.resize(P);
  res.peak_inflight.resize(P);
  res.trace.resize(P);
  comm::run_threads(P, [&](comm::Communicator& c) {
    auto model = testing::sleep_model(P * v, forward_ms / v);
    parallel::ParallelSpec spec;
    spec.pp_stages = P;
    spec.pp_microbatches = m;
    spec.pp_schedule = schedule;
    spec.pp_virtual_stages = v;
    auto ledger = std::make_shared<MemoryLedger>();
    MemoryScope memory(ledger, MemCategory::kOther);
    parallel::Engine engine(spec, optim::OptimSpec{}, c, std::move(model), 1);
    Tensor x = Tensor::zeros({8 * m, 64});
    Tensor y = Tensor::zeros({8 * m}, DType::kI32);
    engine.start();
    for (int step = 0; step <= steps; ++step) {
      if (step == 1) engine.take_stats(0);  // step 0 allocates the activation caches
      engine.train_piece({x, y, nn::Context{true, 1, step, 0}, 1.0, true});
      engine.step(0.01f, 0, step);
    }
    const std::vector<parallel::RankStats> stats = engine.take_stats(0);
    const auto& pipe = dynamic_cast<const parallel::PipelineExecutor&>(engine.executor());
    res.trace[pipe.stage()] = pipe.trace();
    const parallel::RankStats& mine = stats[static_cast<size_t>(c.rank())];
    res.peak_bytes[pipe.stage()] = mine.mem_peak[static_cast<size_t>(MemCategory::kActivations)];
    res.peak_inflight[pipe.stage()] = mine.peak_inflight;
    double bubble = 0;
    for (const parallel::RankStats& s : stats)
      bubble += 1.0 - (s.forward_s + s.backward_s) / s.schedule_s;
    if (c.rank() == 0) res.measured = bubble / P;
  });
  return res;
}

// One row per stage, one character per `unit` seconds: the micro-batch's digit for a forward,
// its letter (a = 0) for a backward (zb-h1's B), its capital letter for a W, '.' for idle.
void draw(const Result& r, double unit) {
  for (size_t s = 0; s < r.trace.size(); ++s) {
    std::string row;
    for (const auto& e : r.trace[s]) {
      const size_t a = static_cast<size_t>(std::lround(e.start / unit));
      const size_t b = std::max(a + 1, static_cast<size_t>(std::lround(e.end / unit)));
      if (row.size() < b) row.resize(b, '.');
      const char first[] = {'0', 'a', 'A'};
      const int span = e.op == parallel::TaskOp::kForward ? 10 : 26;
      const char ch = static_cast<char>(first[static_cast<int>(e.op)] + e.micro % span);
      for (size_t i = a; i < b; ++i) row[i] = ch;
    }
    std::printf("  stage %zu |%s|\n", s, row.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  double forward_ms = 4;
  int steps = 3;
  bool trace = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--forward-ms") && i + 1 < argc)
      forward_ms = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--trace"))
      trace = true;
    else {
      std::fprintf(stderr, "usage: pipeline_bubble [--forward-ms F] [--steps N] [--trace]\n");
      return 2;
    }
  }
  std::printf("forward %.1f ms, backward %.1f ms per stage; %d measured steps\n", forward_ms,
              2 * forward_ms, steps);
  std::printf("%-11s %2s %2s %9s %9s %7s  peak activation KiB (micro-batches) per stage\n", "sched",
              "P", "m", "measured", "model", "diff");
  int worst_ok = 1;
  std::map<std::pair<int, int>, Result> ofob;  // 1f1b's, by (P, m), for zb-h1's ratios
  using parallel::PpSchedule;
  for (PpSchedule kind :
       {PpSchedule::kGpipe, PpSchedule::k1f1b, PpSchedule::kInterleaved, PpSchedule::kZbH1})
    for (int P : {2, 4})
      for (int m : {1, 4, 8}) {
        const char* schedule = name_of(kind);
        const int v = kind == PpSchedule::kInterleaved ? 2 : 1;
        Result r = measure(P, m, v, kind, forward_ms, steps);
        const double model = parallel::bubble_model(kind, P, m, v);
        const double diff = r.measured - model;
        if (std::fabs(diff) > 0.05) worst_ok = 0;
        std::printf("%-11s %2d %2d %9.3f %9.3f %+7.3f ", schedule, P, m, r.measured, model, diff);
        for (int s = 0; s < P; ++s)
          std::printf(" %6.1f (%.0f)", r.peak_bytes[s] / 1024, r.peak_inflight[s]);
        std::printf("\n");
        if (kind == PpSchedule::k1f1b) ofob[{P, m}] = r;
        if (kind == PpSchedule::kZbH1) {
          const Result& o = ofob[{P, m}];
          double peak = 0, ofob_peak = 0;
          for (int s = 0; s < P; ++s) {
            peak = std::max(peak, r.peak_bytes[s]);
            ofob_peak = std::max(ofob_peak, o.peak_bytes[s]);
          }
          std::printf("  zb-h1 / 1f1b: bubble %.2f (model %.2f), largest stage peak %.2f\n",
                      r.measured / o.measured,
                      model / parallel::bubble_model(PpSchedule::k1f1b, P, m, 1), peak / ofob_peak);
        }
        if (trace && P == 4 && m == 8) {
          std::printf(
              "  trace of the last step (1 char = %.1f ms; digit = forward, letter = "
              "backward, capital = W of that micro-batch, whichever of the stage's chunks, "
              ". = idle):\n",
              forward_ms / 2);
          draw(r, forward_ms / 2 * 1e-3);
        }
      }
  std::printf("all within 0.05 of the model: %s\n", worst_ok ? "yes" : "no");
  return 0;
}
