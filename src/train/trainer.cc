#include "tessel/train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/ops/cpu.h"
#include "tessel/optim/schedule.h"

namespace tessel::train {

namespace fs = std::filesystem;
using nlohmann::json;

// Where training stands; saved in trainer.json so a resumed run continues exactly.
struct Trainer::State {
  int64_t epoch = 0;
  int64_t batch_in_epoch = 0;  // next batch of `epoch` to run
  EvalResult epoch_sums;       // running train loss x samples and correct of this epoch
  double train_seconds = 0;    // time in training steps, across resumes
  int64_t train_samples = 0;
};

namespace {

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", long(s / 3600), long(s / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%ldm%02lds", long(s / 60), long(s % 60));
  return buf;
}

template <typename... Args>
std::string fmt(const char* f, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, args...);
  return buf;
}

EvalResult mean_of(const EvalResult& sums) {
  EvalResult r = sums;
  if (sums.samples > 0) {
    r.loss = sums.loss / static_cast<double>(sums.samples);
    r.accuracy = sums.accuracy / static_cast<double>(sums.samples);
  }
  return r;
}

// Copies tensor `name` of `file` into `dst`, checking presence, dtype and shape.
void load_tensor(const ckpt::TensorFile& file, const std::string& what, const std::string& name,
                 Tensor dst) {
  const Tensor* src = file.find(name);
  if (src == nullptr)
    throw IoError(str("checkpoint: ", what, " has no tensor '", name,
                      "'; it was saved from a different model or optimizer"));
  if (src->dtype() != dst.dtype() || src->shape() != dst.shape())
    throw IoError(str("checkpoint: ", what, " tensor '", name, "' is ", dtype_name(src->dtype()),
                      " ", shape_str(src->shape()), " but the model needs ",
                      dtype_name(dst.dtype()), " ", shape_str(dst.shape()),
                      "; the checkpoint was saved from a different config"));
  dst.copy_from(*src);
}

}  // namespace

Trainer::Trainer(Config config, RunOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  ops::set_blas_threads(config_.runtime.threads);
  data_ = data::make_datasets(config_.data);
  nn::ModelSpec spec = config_.model;
  spec.input_shape = data_.train->input_shape();
  spec.num_classes = data_.train->num_classes();
  model_ = nn::build_model(spec, config_.seed);
  optimizer_ = optim::make_optimizer(config_.optim, model_->params().numel());

  data::LoaderOptions lo;
  lo.batch = config_.train.batch;
  lo.shuffle = config_.train.shuffle;
  lo.drop_last = config_.train.drop_last;
  lo.seed = config_.seed;
  lo.prefetch = config_.train.prefetch;
  loader_ = std::make_unique<data::DataLoader>(data_.train, lo);
  if (loader_->batches_per_epoch() == 0)
    throw InvalidArgument(str("config: train.batch = ", config_.train.batch, " is larger than the ",
                              data_.train->size(), " training samples with drop_last; lower it"));
  total_steps_ = config_.train.epochs * loader_->batches_per_epoch();
  if (config_.train.max_steps > 0) total_steps_ = std::min(total_steps_, config_.train.max_steps);
  base_lr_ = optim::scaled_lr(config_.optim.lr, config_.train.batch, config_.train.base_batch);

  run_dir_ = options_.run_dir;
  if (run_dir_.empty() && !options_.resume.empty())  // continue in the folder we resume from
    run_dir_ = fs::path(ckpt::resolve_checkpoint_dir(options_.resume)).parent_path().parent_path();
  if (run_dir_.empty()) run_dir_ = (fs::path("runs") / config_.name).string();
}

Trainer::~Trainer() = default;

float Trainer::step(const data::Batch& batch, EvalResult& sums) {
  nn::Context ctx{true, config_.seed, step_, batch.first_sample};
  Tensor logits = model_->forward(batch.x, ctx);
  float loss = loss_.forward(logits, batch.y);
  model_->zero_grad();
  model_->backward(loss_.backward(1.0f));
  Tensor grads = model_->grads().flat();
  if (config_.train.clip_norm > 0) {
    double norm = std::sqrt(optim::sum_squares(grads.data<float>(), grads.numel()));
    optim::clip_scale(grads.data<float>(), grads.numel(), norm, config_.train.clip_norm);
  }
  Tensor params = model_->params().flat();
  optimizer_->step(params, grads, optim::lr_at(config_.schedule, base_lr_, step_, total_steps_));
  ++step_;
  int64_t rows = batch.y.dim(0);
  sums.loss += static_cast<double>(loss) * rows;
  sums.accuracy += static_cast<double>(loss_.correct()) * rows / loss_.count();
  sums.samples += rows;
  return loss;
}

EvalResult Trainer::evaluate(const data::Dataset& dataset) {
  data::LoaderOptions lo;
  lo.batch = config_.train.batch;
  lo.shuffle = false;
  lo.prefetch = config_.train.prefetch;
  // A non-owning shared_ptr: the dataset outlives this call.
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](const auto*) {}), lo);
  loader.start_epoch(0);
  EvalResult sums;
  nn::CrossEntropyLoss loss;
  data::Batch batch;
  while (loader.next(batch)) {
    nn::Context ctx{false, config_.seed, step_, batch.first_sample};
    float l = loss.forward(model_->forward(batch.x, ctx), batch.y);
    int64_t rows = batch.y.dim(0);
    sums.loss += static_cast<double>(l) * rows;
    sums.accuracy += static_cast<double>(loss.correct()) * rows / loss.count();
    sums.samples += rows;
  }
  return mean_of(sums);
}

void Trainer::log_metrics(const json& record) {
  std::ofstream out(fs::path(run_dir_) / "metrics.jsonl", std::ios::app);
  out << record.dump() << "\n";
}

void Trainer::save(const State& s) {
  ckpt::Checkpoint c;
  for (nn::Parameter* p : model_->parameters()) c.model.tensors.emplace_back(p->name, p->value);
  c.model.metadata["format"] = "tessel";
  c.model.metadata["model"] = config_.model.kind;
  for (auto& [name, t] : optimizer_->state()) c.optimizer.tensors.emplace_back(name, t);
  c.optimizer.metadata["kind"] = config_.optim.kind;
  json t = {{"step", step_},
            {"epoch", s.epoch},
            {"batch_in_epoch", s.batch_in_epoch},
            {"optimizer_steps", optimizer_->steps()},
            {"seed", config_.seed},
            {"epoch_loss_sum", s.epoch_sums.loss},
            {"epoch_correct_sum", s.epoch_sums.accuracy},
            {"epoch_samples", s.epoch_sums.samples},
            {"train_seconds", s.train_seconds},
            {"train_samples", s.train_samples},
            {"params_sha256", model_->params_sha256()},
            {"config_name", config_.name}};
  c.trainer_json = t.dump(2);
  std::string dir = ckpt::save_checkpoint(run_dir_, step_, c, config_.checkpoint.keep_last);
  log_debug("checkpoint saved: ", dir);
}

void Trainer::load_weights(const std::string& path) {
  ckpt::Checkpoint c = ckpt::load_checkpoint(path);
  std::string what = ckpt::resolve_checkpoint_dir(path) + "/model.safetensors";
  for (nn::Parameter* p : model_->parameters()) load_tensor(c.model, what, p->name, p->value);
}

void Trainer::restore(const std::string& path, State& s) {
  ckpt::Checkpoint c = ckpt::load_checkpoint(path);
  std::string dir = ckpt::resolve_checkpoint_dir(path);
  for (nn::Parameter* p : model_->parameters())
    load_tensor(c.model, dir + "/model.safetensors", p->name, p->value);
  for (auto& [name, t] : optimizer_->state())
    load_tensor(c.optimizer, dir + "/optimizer.safetensors", name, t);
  try {
    json t = json::parse(c.trainer_json);
    step_ = t.at("step").get<int64_t>();
    s.epoch = t.at("epoch").get<int64_t>();
    s.batch_in_epoch = t.at("batch_in_epoch").get<int64_t>();
    optimizer_->set_steps(t.at("optimizer_steps").get<int64_t>());
    s.epoch_sums.loss = t.at("epoch_loss_sum").get<double>();
    s.epoch_sums.accuracy = t.at("epoch_correct_sum").get<double>();
    s.epoch_sums.samples = t.at("epoch_samples").get<int64_t>();
    s.train_seconds = t.at("train_seconds").get<double>();
    s.train_samples = t.at("train_samples").get<int64_t>();
  } catch (const json::exception& e) {
    throw IoError(str("checkpoint: ", dir, "/trainer.json is corrupt (", e.what(),
                      "); resume from an older checkpoint"));
  }
  if (s.batch_in_epoch > loader_->batches_per_epoch())
    throw IoError(str("checkpoint: ", dir, " is at batch ", s.batch_in_epoch, " of an epoch of ",
                      loader_->batches_per_epoch(),
                      " batches; train.batch or the dataset changed since it was saved"));
  log_info("resumed from ", dir, " at step ", step_, " (epoch ", s.epoch + 1, ", batch ",
           s.batch_in_epoch, ")");
}

json Trainer::run() {
  const double wall_start = now_seconds();
  State s;
  if (!options_.resume.empty()) restore(options_.resume, s);
  fs::create_directories(run_dir_);
  {
    std::ofstream cfg(fs::path(run_dir_) / "config.toml");
    cfg << to_toml(config_);
  }
  if (options_.resume.empty()) std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::trunc);

  const bool tty = options_.progress && isatty(fileno(stderr));
  const int64_t bpe = loader_->batches_per_epoch();
  const int64_t epochs = config_.train.epochs;
  const int64_t start_step = step_;
  if (options_.progress)
    log_info("training ", config_.model.kind, " (", model_->num_parameters(), " parameters) on ",
             data_.train->name(), " (", data_.train->size(), " samples), ", epochs, " epochs x ",
             bpe, " steps, batch ", config_.train.batch, ", run folder ", run_dir_);

  EvalResult last_test;
  int64_t last_test_step = -1;
  EvalResult last_train = mean_of(s.epoch_sums);
  bool stopped = false;
  double last_epoch_line = 0, last_plain_line = 0;
  double window_start = now_seconds();
  int64_t window_samples = 0;
  for (; s.epoch < epochs && step_ < total_steps_ && !stopped; ++s.epoch, s.batch_in_epoch = 0) {
    const double epoch_start = now_seconds();
    loader_->start_epoch(s.epoch, s.batch_in_epoch);
    data::Batch batch;
    for (;;) {
      if (step_ >= total_steps_) break;
      double t0 = now_seconds();
      if (!loader_->next(batch)) break;
      double t1 = now_seconds();  // time waiting for data is not training time
      float loss = step(batch, s.epoch_sums);
      double t2 = now_seconds();
      if (!std::isfinite(loss))
        throw Error(str("train: loss is ", loss, " at step ", step_,
                        "; lower optim.lr or set train.clip_norm"));
      (void)t0;
      s.train_seconds += t2 - t1;
      s.train_samples += batch.y.dim(0);
      window_samples += batch.y.dim(0);
      ++s.batch_in_epoch;

      if (step_ % config_.train.log_every == 0 || step_ == total_steps_) {
        double now = now_seconds();
        double sps = window_samples / std::max(1e-9, now - window_start);
        EvalResult m = mean_of(s.epoch_sums);
        double lr = optim::lr_at(config_.schedule, base_lr_, step_ - 1, total_steps_);
        log_metrics({{"type", "train"}, {"step", step_}, {"epoch", s.epoch + 1}, {"loss", loss},
                     {"epoch_loss", m.loss}, {"epoch_accuracy", m.accuracy}, {"lr", lr},
                     {"samples_per_second", sps}});
        // Live line on a terminal; plain lines at most every 5 s otherwise.
        if (options_.progress && (tty || now - last_plain_line >= 5.0)) {
          last_plain_line = now;
          double eta = (total_steps_ - step_) * config_.train.batch / std::max(sps, 1e-9);
          std::string line = fmt("epoch %ld/%ld step %ld/%ld loss %.4f acc %.2f%% %.0f samples/s ETA %s",
                                 long(s.epoch + 1), long(epochs), long(step_), long(total_steps_),
                                 m.loss, 100.0 * m.accuracy, sps, format_eta(eta).c_str());
          if (tty)
            std::fprintf(stderr, "\r\033[K%s", line.c_str());
          else
            std::fprintf(stderr, "%s\n", line.c_str());
        }
        window_start = now;
        window_samples = 0;
      }
      const bool interrupted = options_.interrupt != nullptr && options_.interrupt->load();
      const bool stop_here = options_.stop_after > 0 && step_ - start_step >= options_.stop_after;
      if (interrupted || stop_here) {
        stopped = true;
        break;
      }
      if (config_.checkpoint.every_steps > 0 && step_ % config_.checkpoint.every_steps == 0) save(s);
    }
    if (stopped) break;

    // End of an epoch (or of the step budget): evaluate and report.
    if (tty) std::fprintf(stderr, "\n");
    last_train = mean_of(s.epoch_sums);
    json rec = {{"type", "epoch"}, {"epoch", s.epoch + 1}, {"step", step_},
                {"train_loss", last_train.loss}, {"train_accuracy", last_train.accuracy},
                {"epoch_seconds", now_seconds() - epoch_start}};
    if (data_.test) {
      last_test = evaluate(*data_.test);
      last_test_step = step_;
      rec["test_loss"] = last_test.loss;
      rec["test_accuracy"] = last_test.accuracy;
    }
    if (config_.train.eval_train) {
      EvalResult full = evaluate(*data_.train);
      rec["train_eval_loss"] = full.loss;
      rec["train_eval_accuracy"] = full.accuracy;
    }
    log_metrics(rec);
    // One line per epoch, thinned to one every 2 s for runs of many short epochs.
    if (options_.progress && (epochs <= 20 || s.epoch + 1 == epochs ||
                              now_seconds() - last_epoch_line >= 2.0)) {
      last_epoch_line = now_seconds();
      std::string line = fmt("epoch %ld/%ld: train loss %.4f acc %.2f%%", long(s.epoch + 1),
                             long(epochs), last_train.loss, 100.0 * last_train.accuracy);
      if (data_.test)
        line += fmt(", test loss %.4f acc %.2f%%", last_test.loss, 100.0 * last_test.accuracy);
      if (config_.train.eval_train)
        line += fmt(", train-set eval acc %.2f%%", 100.0 * rec["train_eval_accuracy"].get<double>());
      log_info(line, fmt(" (%.1f s)", rec["epoch_seconds"].get<double>()));
    }
    s.epoch_sums = EvalResult{};
    const bool last_epoch = s.epoch + 1 >= epochs || step_ >= total_steps_;
    if ((config_.checkpoint.every_epochs > 0 && (s.epoch + 1) % config_.checkpoint.every_epochs == 0) ||
        last_epoch) {
      State next = s;
      ++next.epoch;
      next.batch_in_epoch = 0;
      save(next);
    }
  }
  if (stopped) {
    if (tty) std::fprintf(stderr, "\n");
    save(s);
    log_info("stopped at step ", step_, "; continue with --resume ", run_dir_);
  }
  if (data_.test && last_test_step != step_) last_test = evaluate(*data_.test);

  json summary = {
      {"model", config_.model.kind},
      {"dataset", data_.train->name()},
      {"world_size", 1},
      {"layout", "single"},
      {"epochs", s.epoch},
      {"steps", step_},
      {"train_loss", last_train.loss},
      {"train_accuracy", last_train.accuracy},
      {"test_loss", data_.test ? json(last_test.loss) : json(nullptr)},
      {"test_accuracy", data_.test ? json(last_test.accuracy) : json(nullptr)},
      {"samples_per_second", s.train_samples / std::max(1e-9, s.train_seconds)},
      {"train_seconds", s.train_seconds},
      {"wall_seconds", now_seconds() - wall_start},
      {"params_sha256", model_->params_sha256()},
      {"num_parameters", model_->num_parameters()},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"threads", config_.runtime.threads},
      {"completed", !stopped},
      {"run_dir", run_dir_}};
  ckpt::write_file_atomic((fs::path(run_dir_) / "summary.json").string(), summary.dump(2) + "\n");
  return summary;
}

}  // namespace tessel::train
