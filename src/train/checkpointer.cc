#include "tessel/train/checkpointer.h"

#include <algorithm>
#include <numeric>

#include <nlohmann/json.hpp>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/log.h"

namespace tessel::train {

namespace {

using nlohmann::json;

// Reads arena range r of tensor family `prefix` ("" for values, "exp_avg/" ...) into dst
// (elements that are padding stay as they are).
void read_range(const ckpt::CheckpointReader& reader, const nn::Model& model,
                const std::string& prefix, nn::Range r, float* dst) {
  for (const nn::Run& run : model.runs(r))
    reader.read(prefix + model.parameters()[run.param]->name, run.logical, run.count,
                dst + (run.local - r.lo));
}

// Every parameter of the model is in the checkpoint with the model's (whole) shape.
void check_parameters(const ckpt::CheckpointReader& reader, const nn::Model& model) {
  const ckpt::Manifest& m = reader.manifest();
  for (const nn::Parameter* p : model.parameters()) {
    auto it = std::find_if(m.parameters.begin(), m.parameters.end(),
                           [&](const ckpt::TensorSpec& t) { return t.name == p->name; });
    if (it == m.parameters.end() || it->shape != p->full_shape())
      throw IoError(str("checkpoint: ", reader.dir(), " has ",
                        it == m.parameters.end() ? str("no parameter '", p->name, "'")
                                                 : str("'", p->name, "' of shape ", shape_str(it->shape)),
                        " but the model needs ", shape_str(p->full_shape()),
                        "; the checkpoint was saved from a different model config"));
  }
}

std::vector<std::string> state_buffer_names(const optim::OptimSpec& spec) {
  std::vector<std::string> out;
  for (const optim::StateBuffer& b : optim::make_optimizer(spec, 0)->state()) out.push_back(b.name);
  return out;
}

}  // namespace

Checkpointer::Checkpointer(const Config& config, parallel::Engine& engine, std::string vocabulary)
    : config_(config), engine_(engine), model_(engine.model()), vocabulary_(std::move(vocabulary)) {}

std::string Checkpointer::save(const std::string& run_dir, int64_t step,
                               const std::string& trainer_json) {
  const std::string dir = engine_.is_main() ? ckpt::begin_checkpoint(run_dir, step) : std::string();
  ckpt::Manifest m;
  const std::vector<ckpt::ShardFile> shards = engine_.write_shards(dir, &m.optimizer_steps);
  std::string committed;
  if (engine_.is_main()) {
    m.model_kind = config_.model.kind;
    m.vocabulary = vocabulary_;
    for (const nn::Parameter* p : model_.parameters()) m.parameters.push_back({p->name, p->full_shape()});
    m.optimizer_kind = config_.optim.kind;
    m.state_buffers = state_buffer_names(config_.optim);
    m.shards = shards;
    committed = ckpt::commit_checkpoint(run_dir, dir, step, m, trainer_json,
                                        config_.checkpoint.keep_last);
    log_debug("checkpoint saved: ", committed);
  }
  // Nobody writes the next checkpoint's files before this one is committed.
  double done = 1;
  engine_.sum(&done, 1);
  return committed;
}

std::string Checkpointer::restore(const std::string& path) {
  const ckpt::CheckpointReader reader(path);
  const ckpt::Manifest& m = reader.manifest();
  if (m.model_kind != config_.model.kind)
    throw IoError(str("checkpoint: ", reader.dir(), " holds a ", m.model_kind, " model, the config a ",
                      config_.model.kind, "; resume with the config it was trained with"));
  if (!m.vocabulary.empty() && m.vocabulary != vocabulary_)
    throw IoError(str("checkpoint: ", reader.dir(), " was trained on text with a ",
                      m.vocabulary.size(), "-token vocabulary, but ", config_.data.path,
                      " gives ", vocabulary_.size(), " different tokens; resume on the text it "
                      "was trained on (tessel eval reads other text with the checkpoint's "
                      "vocabulary)"));
  check_parameters(reader, model_);
  parallel::StateView view = engine_.state();
  for (const nn::Range& r : view.held) read_range(reader, model_, "", r, view.values(r));
  if (view.optimizer) {
    if (m.optimizer_kind != config_.optim.kind)
      throw IoError(str("checkpoint: ", reader.dir(), " holds ", m.optimizer_kind,
                        " optimizer state but the config asks for optim.kind = ", config_.optim.kind,
                        "; resume with the optimizer it was trained with"));
    for (const optim::StateBuffer& buf : view.optimizer->state())
      for (const nn::Range& r : view.updated)
        read_range(reader, model_, buf.name + "/", r,
                   buf.values.data<float>() + view.state_offset(r));
    view.optimizer->set_steps(m.optimizer_steps);
  }
  return reader.trainer_json();
}

void Checkpointer::load_weights(const ckpt::CheckpointReader& reader, nn::Model& model) {
  check_parameters(reader, model);
  for (nn::Parameter* p : model.parameters())
    reader.read(p->name, 0, p->value.numel(), p->value.data<float>());
}

}  // namespace tessel::train
