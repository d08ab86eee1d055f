#include "tessel/train/checkpointer.h"

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/model_weights.h"
#include "tessel/core/log.h"
#include "tessel/core/trace.h"

namespace tessel::train {

namespace {

using nlohmann::json;

std::vector<std::string> state_buffer_names(const optim::OptimSpec& spec) {
  std::vector<std::string> out;
  for (const optim::StateBuffer& b : optim::make_optimizer(spec, 0)->state()) out.push_back(b.name);
  return out;
}

}  // namespace

Checkpointer::Checkpointer(const Config& config, parallel::Engine& engine,
                           std::shared_ptr<const text::Tokenizer> tokenizer, ckpt::ModelIo io)
    : config_(config),
      engine_(engine),
      model_(engine.model()),
      tokenizer_(std::move(tokenizer)),
      io_(std::move(io)) {}

ckpt::Manifest Checkpointer::manifest() const {
  ckpt::Manifest m;
  m.model_kind = name_of(config_.model.kind);
  m.tokenizer = tokenizer_;
  m.io = io_;
  for (const nn::Parameter* p : model_.parameters())
    m.parameters.push_back({p->name, p->full_shape()});
  m.optimizer_kind = name_of(config_.optim.kind);
  m.state_buffers = state_buffer_names(config_.optim);
  return m;
}

std::string Checkpointer::save(const std::string& run_dir, int64_t step,
                               const std::string& trainer_json) {
  TraceSpan span("checkpoint", "checkpoint");
  if (TraceArgs* args = span.args()) args->num("step", static_cast<double>(step));
  const std::string dir = engine_.is_main() ? ckpt::begin_checkpoint(run_dir, step) : std::string();
  int64_t optimizer_steps = 0;
  std::vector<ckpt::ShardFile> shards;
  try {
    shards = engine_.write_shards(dir, &optimizer_steps);
  } catch (...) {  // e.g. a full disk: the partial checkpoint does not stay to fill it
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    throw;
  }
  std::string committed;
  if (engine_.is_main()) {
    ckpt::Manifest m = manifest();
    m.optimizer_steps = optimizer_steps;
    m.shards = shards;
    TraceSpan commit("commit", "checkpoint");
    committed =
        ckpt::commit_checkpoint(run_dir, dir, step, m, trainer_json, config_.checkpoint.keep_last);
    log_debug("checkpoint saved: ", committed);
  }
  // Nobody writes the next checkpoint's files before this one is committed.
  double done = 1;
  engine_.sum(&done, 1);
  return committed;
}

void Checkpointer::snapshot(Snapshots& snapshots, int64_t step, const std::string& trainer_json) {
  const parallel::StateView view = engine_.state();
  snapshots.add(step, engine_.rank(), manifest(), parallel::state_slices(view, model_),
                view.optimizer ? view.optimizer->steps() : 0, trainer_json);
}

std::string Checkpointer::restore(const std::string& path, std::string* dir) {
  // Every rank opens (and so verifies) the first candidate it can, from `first` on; the
  // ranks then agree on the oldest of their picks, and open that one if it was not theirs.
  const std::vector<std::string> candidates = ckpt::checkpoint_candidates(path);
  std::unique_ptr<ckpt::CheckpointReader> reader;
  std::string damage;  // why the newest candidate was passed over
  size_t first = 0;
  for (;;) {
    size_t pick = first;
    for (reader.reset(); pick < candidates.size(); ++pick) {
      try {
        reader = std::make_unique<ckpt::CheckpointReader>(candidates[pick]);
        break;
      } catch (const IoError& e) {
        if (damage.empty()) damage = e.what();
      }
    }
    double picks[2] = {static_cast<double>(pick), -static_cast<double>(pick)};
    if (engine_.layout().servers == 0) engine_.max(picks, 2);  // servers: each rank on its own
    if (picks[0] >= static_cast<double>(candidates.size()))
      throw IoError(candidates.size() == 1 ? damage
                                           : str(damage,
                                                 "; no older checkpoint next to it is "
                                                 "intact either"));
    first = static_cast<size_t>(picks[0]);
    if (-picks[1] == picks[0]) break;
  }
  if (first > 0)
    log_warn(damage, "; resuming from the previous complete checkpoint ", candidates[first],
             " instead");
  *dir = candidates[first];
  return restore(*reader);
}

std::string Checkpointer::restore(const ckpt::CheckpointSource& reader) {
  const ckpt::Manifest& m = reader.manifest();
  if (m.model_kind != name_of(config_.model.kind))
    throw IoError(str("checkpoint: ", reader.dir(), " holds a ", m.model_kind,
                      " model, the config a ", name_of(config_.model.kind),
                      "; resume with the config it was trained with"));
  if (m.tokenizer && !text::same_tokenizer(m.tokenizer.get(), tokenizer_.get()))
    throw IoError(str("checkpoint: ", reader.dir(), " was trained on text with a ",
                      m.tokenizer->vocab_size(), "-token ",
                      m.tokenizer->to_json()["kind"].get<std::string>(), " vocabulary, but ",
                      config_.data.path, " gives a different vocabulary",
                      tokenizer_ ? str(" of ", tokenizer_->vocab_size(), " tokens") : std::string(),
                      "; resume on the text and data.tokenizer it "
                      "was trained with (tessel eval reads other text with the checkpoint's "
                      "tokenizer)"));
  ckpt::check_parameters(reader, model_);
  parallel::StateView view = engine_.state();
  for (const nn::Range& r : view.held) ckpt::read_range(reader, model_, "", r, view.values(r));
  view.write_back();  // values on a device: the host copies read into go up
  if (view.optimizer) {
    if (m.optimizer_kind != name_of(config_.optim.kind))
      throw IoError(
          str("checkpoint: ", reader.dir(), " holds ", m.optimizer_kind,
              " optimizer state but the config asks for optim.kind = ", name_of(config_.optim.kind),
              "; resume with the optimizer it was trained with"));
    for (const optim::StateBuffer& buf : view.optimizer->state())
      for (const nn::Range& r : view.updated) {
        // Read into host memory (staging for state on a device), then to where it lives.
        Tensor state = buf.values.view(view.state_offset(r), {r.size()});
        Tensor host = state.device() == Device::kCpu ? state : Tensor::empty({r.size()});
        ckpt::read_range(reader, model_, buf.name + "/", r, host.data<float>());
        if (host.raw() != state.raw()) state.copy_from(host);
      }
    view.optimizer->set_steps(m.optimizer_steps);
  }
  engine_.restore_compression(reader);
  return reader.trainer_json();
}

}  // namespace tessel::train
