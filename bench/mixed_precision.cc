// train.precision and train.recompute, end to end: samples/s of full training steps (forward,
// loss, backward, optimizer step) of fashion_mlp and char_gpt (embed 256, 6 blocks) on 1
// thread, and each variant's peak activation bytes from its rank's memory ledger (the
// allocations, not a formula). The variants of a model are kept side by side and run in
// alternating rounds on the same preloaded batches; each figure is the median over the rounds,
// and the ratios are taken against the first variant (fp32, recompute none) of the same round.
//
//   mixed_precision [--steps N] [--rounds R] [--models fashion_mlp,char_gpt]
//                   [--variants fp32/none,bf16/none,...] [--json FILE]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"
#include "tessel/train/trainer.h"

using namespace tessel;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Variant {
  std::string precision, recompute;
  std::unique_ptr<train::Trainer> trainer;
  std::vector<data::Batch> batches;
  std::vector<double> rates, ratios;
  double peak_activations = 0;
};

std::vector<std::string> model_keys(const std::string& model) {
  if (model == "char_gpt")  // the shape: embed >= 256, 6 blocks
    return {"model.embed=256", "model.layers=6", "model.heads=8", "data.context=128",
            "train.batch=16"};
  return {"train.batch=128"};
}

void prepare(Variant& v, const std::string& model) {
  std::vector<std::string> keys = model_keys(model);
  keys.push_back("runtime.threads=1");
  keys.push_back("train.prefetch=0");
  keys.push_back("train.precision=" + v.precision);
  keys.push_back("train.recompute=" + v.recompute);
  const train::Config cfg =
      train::load_config(std::string(TESSEL_SOURCE_DIR) + "/examples/" + model + ".toml", keys);
  train::RunOptions opts;
  opts.progress = false;
  v.trainer = std::make_unique<train::Trainer>(cfg, opts);
  data::LoaderOptions lo;
  lo.batch = cfg.train.batch;
  lo.seed = cfg.seed;
  lo.prefetch = 0;
  data::DataLoader loader(v.trainer->datasets().train, lo);
  loader.start_epoch(0);
  v.batches.resize(8);
  for (auto& b : v.batches) loader.next(b);
}

// `steps` steps of v; returns samples/s. Records the peak activation bytes of these steps.
double run_steps(Variant& v, int steps, int64_t first) {
  MemoryScope scope(v.trainer->ledger(), MemCategory::kOther);
  train::EvalResult sums;
  v.trainer->ledger()->reset_peaks();
  const double t0 = now_seconds();
  int64_t rows = 0;
  for (int i = 0; i < steps; ++i) {
    const data::Batch& b = v.batches[static_cast<size_t>(first + i) % v.batches.size()];
    v.trainer->step({b}, sums);
    rows += b.y.dim(0);
  }
  const double rate = static_cast<double>(rows) / (now_seconds() - t0);
  v.peak_activations = static_cast<double>(v.trainer->ledger()->peak(MemCategory::kActivations));
  return rate;
}

nlohmann::json measure(const std::string& model, const std::vector<std::string>& variants,
                       int steps, int rounds) {
  std::vector<Variant> vs;
  for (const std::string& name : variants) {
    const auto parts = split(name, '/');
    vs.push_back({parts.at(0), parts.size() > 1 ? parts[1] : "none", nullptr, {}, {}, {}, 0});
    prepare(vs.back(), model);
  }
  for (Variant& v : vs) run_steps(v, 3, 0);  // warm-up: every buffer allocated
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < vs.size(); ++k) {  // a different variant leads each round
      Variant& v = vs[(k + static_cast<size_t>(r)) % vs.size()];
      v.rates.push_back(run_steps(v, steps, r * steps));
    }
    for (Variant& v : vs) v.ratios.push_back(v.rates.back() / vs[0].rates.back());
  }
  nlohmann::json out = nlohmann::json::array();
  std::printf("%-12s %-9s %-10s %11s %9s %16s %9s\n", "model", "precision", "recompute",
              "samples/s", "ratio", "peak act bytes", "of first");
  for (const Variant& v : vs) {
    const double rate = median(v.rates), ratio = median(v.ratios);
    std::printf("%-12s %-9s %-10s %11.1f %8.3fx %16.0f %8.1f%%\n", model.c_str(),
                v.precision.c_str(), v.recompute.c_str(), rate, ratio, v.peak_activations,
                100.0 * v.peak_activations / vs[0].peak_activations);
    std::fflush(stdout);
    out.push_back({{"model", model},
                   {"precision", v.precision},
                   {"recompute", v.recompute},
                   {"samples_per_second", rate},
                   {"ratio_to_first", ratio},
                   {"ratio_min", *std::min_element(v.ratios.begin(), v.ratios.end())},
                   {"ratio_max", *std::max_element(v.ratios.begin(), v.ratios.end())},
                   {"peak_activation_bytes", v.peak_activations}});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("isa: %s\n", tessel::ops::isa_description().c_str());  // CPU and ISA level
  int steps = 20, rounds = 5;
  std::vector<std::string> models = {"fashion_mlp", "char_gpt"};
  std::vector<std::string> variants = {"fp32/none", "bf16/none", "fp16/none", "fp32/full",
                                       "fp32/selective"};
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mixed_precision: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps")
      steps = std::stoi(next());
    else if (a == "--rounds")
      rounds = std::stoi(next());
    else if (a == "--models")
      models = split(next(), ',');
    else if (a == "--variants")
      variants = split(next(), ',');
    else if (a == "--json")
      json_path = next();
    else {
      std::fprintf(stderr,
                   "usage: mixed_precision [--steps N] [--rounds R] [--models a,b] "
                   "[--variants fp32/none,bf16/full,...] [--json FILE]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  set_log_level(LogLevel::kWarn);
  nlohmann::json out = nlohmann::json::array();
  try {
    ops::set_blas_threads(1);
    for (const std::string& m : models)
      for (auto& row : measure(m, variants, steps, rounds)) out.push_back(row);
  } catch (const Error& e) {
    std::fprintf(stderr, "mixed_precision: %s\n", e.what());
    return 1;
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
