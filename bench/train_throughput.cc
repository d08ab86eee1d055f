// Training throughput of tessel's example models: samples/s of full training steps (forward,
// loss, backward, optimizer step) with 1 and 2 BLAS threads, on real batches loaded before the
// timed part (Fashion-MNIST at batch 128; char_gpt's text at its example's batch, 32). Also
// reports the achieved GFLOP/s (forward F plus a backward of 2F for input and weight gradients,
// less the first block's input gradient, which is never computed) beside two references
// measured in the same run: the core's fp32 FMA peak (12 independent vfmadd chains,
// bench/fma_peak.h; with 2 threads, twice the one-core figure, an upper bound) and the GEMM
// GFLOP/s (ops::gemm, 512^3). Also samples per second of the process's CPU time: on a shared
// host it leaves out the time the process waited for a core (a busy SMT sibling still slows
// it), so it compares two builds more steadily than the wall-clock rate.
//
//   train_throughput [--steps N] [--repeats R] [--models fashion_mlp,fashion_cnn,char_gpt]
//                    [--threads 1,2] [--json FILE]
// Run bench/compare_torch.sh to measure PyTorch on the same models side by side.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fma_peak.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"
#include "tessel/train/trainer.h"

using namespace tessel;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

double sgemm_gflops(int n, int repeats) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  ops::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now_seconds();
    ops::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    times.push_back(now_seconds() - t0);
  }
  std::sort(times.begin(), times.end());
  return 2.0 * n * n * n / times[times.size() / 2] / 1e9;
}

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Measure {
  double samples_per_second, samples_per_cpu_second;
  double gflops;
  int64_t batch;
};

Measure measure(const std::string& example, int threads, int steps, int repeats) {
  // The Fashion-MNIST models at batch 128, char_gpt at its example's batch (32).
  std::vector<std::string> keys = {"runtime.threads=" + std::to_string(threads)};
  if (example.rfind("fashion", 0) == 0) keys.push_back("train.batch=128");
  train::Config cfg =
      train::load_config(std::string(TESSEL_SOURCE_DIR) + "/examples/" + example + ".toml", keys);
  const int64_t batch = cfg.train.batch;
  train::RunOptions opts;
  opts.progress = false;
  train::Trainer trainer(cfg, opts);
  // Load the batches first: data loading is not part of the timed steps.
  data::LoaderOptions lo;
  lo.batch = batch;
  lo.seed = cfg.seed;
  lo.prefetch = 0;
  data::DataLoader loader(trainer.datasets().train, lo);
  loader.start_epoch(0);
  std::vector<std::vector<data::Batch>> batches(16, std::vector<data::Batch>(1));
  for (auto& b : batches) loader.next(b[0]);
  train::EvalResult sums;
  for (int i = 0; i < 10; ++i) trainer.step(batches[i % batches.size()], sums);  // warm-up
  std::vector<double> rates, cpu_rates;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = now_seconds(), c0 = cpu_seconds();
    for (int i = 0; i < steps; ++i) trainer.step(batches[i % batches.size()], sums);
    rates.push_back(static_cast<double>(steps * batch) / (now_seconds() - t0));
    cpu_rates.push_back(static_cast<double>(steps * batch) / (cpu_seconds() - c0));
  }
  const double sps = median(rates);
  // Forward F, backward 2F (input and weight gradients) less the first block's input gradient,
  // which the trainer never computes (its input is data).
  nn::Model& m = trainer.model();
  double flops = 3.0 * m.forward_flops(1) - m.block(0).forward_flops(1);
  return {sps, median(cpu_rates), sps * flops / 1e9, batch};
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  int steps = 100, repeats = 5;
  std::vector<std::string> models = {"fashion_mlp", "fashion_cnn", "char_gpt"};
  std::vector<std::string> threads = {"1", "2"};
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "train_throughput: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--repeats")
      repeats = std::stoi(next());
    else if (a == "--models")
      models = split(next());
    else if (a == "--threads")
      threads = split(next());
    else if (a == "--json")
      json_path = next();
    else {
      std::fprintf(stderr,
                   "usage: train_throughput [--steps N] [--repeats R] [--models a,b] "
                   "[--threads 1,2] [--json FILE]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  set_log_level(LogLevel::kWarn);
  nlohmann::json out = nlohmann::json::array();
  try {
    const double fma_peak = bench::fma_peak_gflops();  // one core
    std::printf("fp32 FMA peak, 1 core (12 vfmadd chains, this run): %.1f GFLOP/s\n", fma_peak);
    std::printf("%-12s %7s %12s %9s %9s %12s %9s %14s\n", "model", "threads", "samples/s",
                "GFLOP/s", "of peak", "sgemm GF/s", "of sgemm", "per CPU second");
    for (const std::string& t : threads) {
      int nt = std::stoi(t);
      ops::set_blas_threads(nt);
      const double peak = nt * fma_peak;
      double sgemm = sgemm_gflops(512, 20);  // the GEMM size our kernel runs best at
      for (const std::string& m : models) {
        Measure r = measure(m, nt, steps, repeats);
        std::printf("%-12s %7d %12.0f %9.1f %8.0f%% %12.1f %8.0f%% %14.0f\n", m.c_str(), nt,
                    r.samples_per_second, r.gflops, 100.0 * r.gflops / peak, sgemm,
                    100.0 * r.gflops / sgemm, r.samples_per_cpu_second);
        std::fflush(stdout);
        out.push_back({{"model", m},
                       {"threads", nt},
                       {"batch", r.batch},
                       {"samples_per_second", r.samples_per_second},
                       {"samples_per_cpu_second", r.samples_per_cpu_second},
                       {"gflops", r.gflops},
                       {"fma_peak_gflops", peak},
                       {"sgemm_gflops", sgemm},
                       {"isa", tessel::ops::isa_name(tessel::ops::isa())}});
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "train_throughput: %s\n", e.what());
    return 1;
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
