#include "config_suggest.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "tessel/config/config.h"
#include "tessel/core/error.h"
#include "tessel/core/suggest.h"

namespace tessel::train {
namespace {

// Names from PyTorch, Lightning, Hugging Face and DeepSpeed configs, and what tessel calls the
// same thing. Edit distance alone would map some to a different concept (grad_accum is nearer
// to train.batch than to train.accumulate), so these are matched by name first. An empty key:
// tessel has no key for it. docs/config.md's "Coming from PyTorch or DeepSpeed" table shows
// the same mappings (a test checks both agree).
struct Foreign {
  const char* names;  // space-separated
  const char* key;
  const char* how;
};

const Foreign kForeign[] = {
    {"gradient_accumulation_steps grad_accum grad_accum_steps accumulate_grad_batches "
     "gradient_accumulation accumulation_steps",
     "train.accumulate",
     "micro-batches of train.batch rows summed per optimizer step; a step trains "
     "train.batch x train.accumulate samples"},
    {"train_micro_batch_size_per_gpu micro_batch_size per_device_train_batch_size "
     "batch_size_per_gpu",
     "train.batch",
     "train.batch is the micro-batch of all ranks together: set it to the per-rank micro-batch "
     "x the data-parallel ranks"},
    {"train_batch_size global_batch_size", "train.batch",
     "the samples of one optimizer step are train.batch x train.accumulate"},
    {"batch_size", "train.batch",
     "the batch of all ranks together (each rank trains its slice of it)"},
    {"world_size nproc_per_node num_processes nprocs", "runtime.workers",
     "the number of ranks: --workers N (runtime.workers) runs them as threads of one process; "
     "under mpirun it is -np N and runtime.workers stays 1"},
    {"local_rank node_rank", "",
     "each rank learns its rank and the ranks on its host from the launcher (mpirun, or "
     "--workers threads); nothing to set"},
    {"zero_stage zero_optimization", "zero.stage",
     "the same stages: 1 shards optimizer state, 2 also gradients, 3 also parameters"},
    {"mics_shard_size zero_hpz_partition_size", "zero.shard_size",
     "shard within groups of this many dp ranks and all-reduce gradients across the groups"},
    {"learning_rate", "optim.lr", "the base learning rate"},
    {"max_grad_norm gradient_clipping clip_grad_norm grad_clip", "train.clip_norm",
     "clip the global gradient norm to this value (0: off)"},
    {"num_train_epochs max_epochs num_epochs", "train.epochs", "passes over the training set"},
    {"pipeline_parallel_size pipeline_model_parallel_size num_stages", "pp.stages",
     "pipeline stages; the ranks are data-parallel x pipeline"},
    {"tensor_model_parallel_size tensor_parallel_size tp_size", "tp.size",
     "ranks each layer is cut across; the ranks are dp x pp x tp"},
    {"lr_scheduler_type lr_scheduler scheduler", "schedule.kind", "constant, step or cosine"},
};

const Foreign* foreign_name(const std::string& path) {
  std::string name = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const Foreign& f : kForeign) {
    const std::string names = std::string(" ") + f.names + " ";
    if (names.find(" " + name + " ") != std::string::npos) return &f;
  }
  return nullptr;
}

bool is_subsequence(const std::string& small, const std::string& big) {
  size_t j = 0;
  for (char ch : big)
    if (j < small.size() && small[j] == ch) ++j;
  return j == small.size();
}

std::pair<std::string, std::string> split_key(const std::string& path) {
  const size_t dot = path.find('.');
  if (dot == std::string::npos) return {"", path};
  return {path.substr(0, dot), path.substr(dot + 1)};
}

// Closest valid key: prefers keys of the same section, and counts an abbreviation
// ("lr" in "learning_rate", "batch" in "batchsize") as close.
std::string nearest_key(const std::string& path) {
  const auto [section, name] = split_key(path);
  std::string best;
  double best_d = 1e9;
  for (const KeyInfo& k : config_keys()) {
    const auto [ksection, kname] = split_key(k.path);
    double d = static_cast<double>(edit_distance(name, kname));
    if (is_subsequence(kname, name) || is_subsequence(name, kname))
      d = std::min(d, 1.0 + std::abs(double(name.size()) - double(kname.size())) / 4.0);
    d += 0.5 * static_cast<double>(edit_distance(section, ksection));
    if (d < best_d) best_d = d, best = k.path;
  }
  return best;
}

}  // namespace

std::string unknown_key_message(const std::string& path, const std::string& where) {
  const std::string head = str("config: unknown key '", excerpt(path), "'", where, "; ");
  const std::string tail = " (docs/config.md lists every key)";
  // No key is near a name this long (and comparing it with every key would take long).
  if (path.size() > 100) return head + "keys are short names such as train.batch" + tail;
  // A near miss of a valid key is a typo ("pp.stage"), not another framework's name.
  size_t miss = path.size();
  for (const KeyInfo& k : config_keys()) miss = std::min(miss, edit_distance(path, k.path));
  const Foreign* f = foreign_name(path);
  if (f != nullptr && miss > 2) {
    if (*f->key == '\0') return head + "tessel has no such key: " + f->how + tail;
    return str(head, "did you mean '", f->key, "'? ", f->how, tail);
  }
  return str(head, "did you mean '", nearest_key(path), "'?", tail);
}

}  // namespace tessel::train
