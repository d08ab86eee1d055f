#include "tessel/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/communicator.h"
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

Trainer::Trainer(Config config, RunOptions options, comm::Communicator* world,
                 const data::Splits* data)
    : config_(std::move(config)), options_(std::move(options)) {
  // OpenBLAS's thread count is process-wide: ranks that are threads of one process each use one
  // BLAS thread (set by the launcher), a rank that owns its process uses runtime.threads.
  const bool owns_process = world == nullptr || std::string(world->backend()) == "mpi" ||
                            world->size() == 1;
  if (owns_process) ops::set_blas_threads(config_.runtime.threads);
  // (2 workers on 2 cores ran fashion_mlp 5% faster without a prefetch thread.)
  prefetch_ = resolve_prefetch(config_.train.prefetch, world ? world->ranks_on_host() : 1,
                               config_.runtime.threads,
                               static_cast<int>(std::thread::hardware_concurrency()));
  data_ = data ? *data : data::make_datasets(config_.data);
  nn::ModelSpec spec = config_.model;
  spec.input_shape = data_.train->input_shape();
  spec.num_classes = data_.train->num_classes();
  model_ = nn::build_model(spec, config_.seed);
  strategy_ = parallel::make_strategy(config_.parallel, world, *model_);
  optimizer_ = optim::make_optimizer(config_.optim, model_->params().numel());

  data::LoaderOptions lo;
  lo.batch = config_.train.batch;
  lo.shuffle = config_.train.shuffle;
  lo.drop_last = config_.train.drop_last;
  lo.seed = config_.seed;
  lo.prefetch = prefetch_;
  lo.slice_rank = strategy_->data_rank();
  lo.slice_count = strategy_->data_size();
  lockstep_ = strategy_->lockstep();
  const int64_t workers = strategy_->data_size();
  if (!lockstep_) {  // whole worker batches, claimed by index (batch_at)
    const std::string why = str("with ps.mode = ", config_.parallel.ps_mode,
                                " each worker trains claimed batches of train.batch / workers rows");
    if (config_.train.batch < workers)
      throw InvalidArgument(str("config: train.batch = ", config_.train.batch, " is smaller than the ",
                                workers, " workers; ", why, "; raise train.batch"));
    if (config_.train.accumulate > 1)
      throw InvalidArgument(str("config: train.accumulate = ", config_.train.accumulate, " ", why,
                                " and pushes each; set train.accumulate = 1 (raise train.batch "
                                "instead) or use ps.mode = sync"));
    if (config_.checkpoint.every_steps > 0)
      throw InvalidArgument(str("config: checkpoint.every_steps = ", config_.checkpoint.every_steps,
                                " needs every worker at the same step, but ", why,
                                " at its own pace; use checkpoint.every_epochs instead"));
    lo.batch = config_.train.batch / workers;
    lo.slice_rank = 0;
    lo.slice_count = 1;
  }
  batch_rows_ = lo.batch;
  loader_ = std::make_unique<data::DataLoader>(data_.train, lo);
  const int64_t bpe = loader_->batches_per_epoch();
  if (bpe == 0)
    throw InvalidArgument(str("config: train.batch = ", config_.train.batch, " is larger than the ",
                              data_.train->size(), " training samples with drop_last; lower it"));
  if (config_.parallel.deterministic) {
    const int64_t shards = config_.train.batch / config_.parallel.micro_shard;
    if (shards % strategy_->data_size() != 0)
      throw InvalidArgument(str("config: train.deterministic splits each batch into ", shards,
                                " micro-shards of ddp.micro_shard = ", config_.parallel.micro_shard,
                                " rows, which ", strategy_->data_size(),
                                " workers cannot share evenly; pick a worker count dividing ",
                                shards, " or change ddp.micro_shard"));
    if (!config_.train.drop_last && data_.train->size() % config_.train.batch != 0)
      throw InvalidArgument(str("config: train.deterministic needs full batches, but ",
                                data_.train->size(), " samples leave a short last batch of ",
                                config_.train.batch, "; set train.drop_last = true"));
  }
  const int64_t k = config_.train.accumulate;
  total_steps_ = config_.train.epochs * ((bpe + k - 1) / k);
  if (config_.train.max_steps > 0) total_steps_ = std::min(total_steps_, config_.train.max_steps);
  if (!lockstep_) {  // a step is `workers` worker batches, whoever trains them
    claim_budget_ = config_.train.epochs * bpe;
    if (config_.train.max_steps > 0)
      claim_budget_ = std::min(claim_budget_, config_.train.max_steps * workers);
    total_steps_ = (claim_budget_ + workers - 1) / workers;
  }
  base_lr_ = optim::scaled_lr(config_.optim.lr, config_.train.batch * k, config_.train.base_batch);

  run_dir_ = options_.run_dir;
  if (run_dir_.empty() && !options_.resume.empty())  // continue in the folder we resume from
    run_dir_ = fs::path(ckpt::resolve_checkpoint_dir(options_.resume)).parent_path().parent_path();
  if (run_dir_.empty()) run_dir_ = (fs::path("runs") / config_.name).string();
  if (!strategy_->is_main()) options_.progress = false;
}

Trainer::~Trainer() = default;

float Trainer::backward_piece(const Tensor& x, const Tensor& y, int64_t first_sample,
                              double weight, bool sync, EvalResult& sums) {
  parallel::Piece piece{x, y, nn::Context{true, config_.seed, step_, first_sample}, weight, sync};
  const bool deterministic = config_.parallel.deterministic;
  if (deterministic) model_->zero_grad();
  parallel::PieceResult r = strategy_->train_piece(piece, loss_);
  if (deterministic) strategy_->collect_shard();
  sums.loss += r.loss_sum;
  sums.accuracy += r.correct;
  sums.samples += r.rows;
  return static_cast<float>(r.loss_sum / std::max<int64_t>(1, r.rows));
}

float Trainer::step(const std::vector<data::Batch>& batches, EvalResult& sums) {
  // Every row of the step's global batches weighs 1/global_rows, so summing the ranks'
  // gradients gives the gradient of the global mean loss whatever the split.
  double global_rows = 0;
  for (const data::Batch& b : batches) global_rows += static_cast<double>(b.global_size);
  model_->zero_grad();
  EvalResult local;
  const int64_t shard = config_.parallel.deterministic ? config_.parallel.micro_shard : 0;
  for (size_t j = 0; j < batches.size(); ++j) {
    const data::Batch& b = batches[j];
    const int64_t rows = b.y.dim(0);
    const bool last_batch = j + 1 == batches.size();
    if (rows == 0) {  // more ranks than rows in a short last batch: only take part in the reduction
      strategy_->begin_backward(last_batch);
      continue;
    }
    if (shard == 0) {
      backward_piece(b.x, b.y, b.first_sample, rows / global_rows, last_batch, local);
      continue;
    }
    // Deterministic mode: fixed micro-shards, each with its own gradient.
    const int64_t x_row = b.x.numel() / rows, y_row = b.y.numel() / rows;
    for (int64_t r = 0; r < rows; r += shard) {
      Shape xs = b.x.shape(), ys = b.y.shape();
      xs[0] = ys[0] = std::min(shard, rows - r);
      backward_piece(b.x.view(r * x_row, xs), b.y.view(r * y_row, ys), b.first_sample + r,
                     xs[0] / global_rows, false, local);
    }
  }
  strategy_->step(*optimizer_, optim::lr_at(config_.schedule, base_lr_, step_, total_steps_),
                  config_.train.clip_norm, step_);
  ++step_;
  sums.loss += local.loss;
  sums.accuracy += local.accuracy;
  sums.samples += local.samples;
  return static_cast<float>(local.loss / std::max<int64_t>(1, local.samples));
}

// One epoch (or what is left of it) of a layout that is not lockstep: this worker trains
// whole worker batches that it claims from the strategy, one push each, until the epoch's
// range is handed out; a slow worker simply trains fewer. Each push weighs 1 / workers (the
// batch's mean gradient over the worker count, as a lockstep slice of a full batch weighs), so
// the servers' updates keep their size. step_ is the global step of the batch in hand. Progress
// lines are rank 0's own view: its running sums, and samples/s from the claim indices (which
// count every worker's batches). An interrupt closes this worker's claims after the batch in
// hand; --stop-after and train.max_steps cut the range, so every batch handed out is trained.
// Ends with one collective that counts the batches trained and agrees on stopping. Returns
// whether the run stops.
bool Trainer::train_claimed_epoch(State& s, double& epoch_train_seconds, double& last_plain_line,
                                  bool tty) {
  const int64_t workers = strategy_->data_size();
  const int64_t first = s.batch_in_epoch;
  int64_t limit = std::min(loader_->batches_per_epoch(), first + claim_budget_ - batches_done_);
  bool cut = false;  // --stop-after ends this invocation inside (or at the end of) this range
  if (options_.stop_after > 0) {
    const int64_t left = start_batches_ + options_.stop_after * workers - batches_done_;
    if (first + left <= limit) limit = first + left, cut = true;
  }
  const int64_t epoch_step = step_;
  auto interrupted = [&] { return options_.interrupt != nullptr && options_.interrupt->load(); };
  strategy_->set_claims({s.epoch, first, limit, epoch_step, !interrupted()});
  double window_start = now_seconds(), t0 = window_start;
  int64_t b = strategy_->claim(), window_first = b, mine = 0;
  int64_t next_log = (epoch_step / config_.train.log_every + 1) * config_.train.log_every;
  bool stop = b < 0 && interrupted();
  epoch_train_seconds += now_seconds() - t0;
  s.train_seconds += now_seconds() - t0;
  while (b >= 0) {
    const data::Batch batch = loader_->batch_at(s.epoch, b);
    t0 = now_seconds();  // time reading data is not training time
    step_ = epoch_step + (b - first) / workers;
    const int64_t counted = s.epoch_sums.samples;
    model_->zero_grad();
    if (batch.y.dim(0) > 0)
      backward_piece(batch.x, batch.y, batch.first_sample, 1.0 / static_cast<double>(workers),
                     true, s.epoch_sums);
    stop = interrupted();
    if (stop) strategy_->set_claims({});  // this push claims nothing more
    strategy_->step(*optimizer_, optim::lr_at(config_.schedule, base_lr_, step_, total_steps_),
                    config_.train.clip_norm, step_);
    ++mine;
    const int64_t done = b;
    b = stop ? -1 : strategy_->claim();
    const double now = now_seconds(), dt = now - t0;
    s.train_seconds += dt;
    epoch_train_seconds += dt;
    s.train_samples += s.epoch_sums.samples - counted;

    // A line when rank 0's batch reaches the next multiple of train.log_every steps.
    if (!strategy_->is_main() || step_ + 1 < next_log) continue;
    next_log = ((step_ + 1) / config_.train.log_every + 1) * config_.train.log_every;
    const double sps = static_cast<double>((done + 1 - window_first) * batch_rows_) /
                       std::max(1e-9, now - window_start);
    report_progress(s.epoch, step_ + 1, mean_of(s.epoch_sums), sps,
                    static_cast<double>((claim_budget_ - batches_done_ - (done + 1 - first)) *
                                        batch_rows_),
                    tty, last_plain_line);
    window_start = now;
    window_first = done + 1;
  }
  // Collective: every worker's batches (each claimed batch was trained), and whether to stop.
  double v[2] = {static_cast<double>(mine), stop ? 1.0 : 0.0};
  strategy_->sum(v, 2);
  const int64_t trained = static_cast<int64_t>(v[0]);
  if (v[1] == 0 && first + trained != limit)
    throw Error(str("trainer: the workers trained ", trained, " batches of epoch ", s.epoch + 1,
                    "'s range [", first, ", ", limit, ") (this is a bug)"));
  s.batch_in_epoch = first + trained;
  batches_done_ += trained;
  step_ = (batches_done_ + workers - 1) / workers;  // a partial step counts, as a short batch does
  return v[1] > 0 || cut;
}

// Rank 0: a train record in metrics.jsonl after `steps` steps, and a progress line: live on a
// terminal, plain at most every 5 s otherwise. `samples_left` gives the ETA.
void Trainer::report_progress(int64_t epoch, int64_t steps, const EvalResult& m, double sps,
                              double samples_left, bool tty, double& last_plain_line) {
  const double lr = optim::lr_at(config_.schedule, base_lr_, steps - 1, total_steps_);
  log_metrics({{"type", "train"}, {"step", steps}, {"epoch", epoch + 1}, {"epoch_loss", m.loss},
               {"epoch_accuracy", m.accuracy}, {"lr", lr}, {"samples_per_second", sps}});
  const double now = now_seconds();
  if (!options_.progress || (!tty && now - last_plain_line < 5.0)) return;
  last_plain_line = now;
  const std::string line = fmt(
      "epoch %ld/%ld step %ld/%ld loss %.4f acc %.2f%% %.0f samples/s ETA %s", long(epoch + 1),
      long(config_.train.epochs), long(steps), long(total_steps_), m.loss, 100.0 * m.accuracy, sps,
      format_eta(samples_left / std::max(sps, 1e-9)).c_str());
  std::fprintf(stderr, tty ? "\r\033[K%s" : "%s\n", line.c_str());
}

EvalResult Trainer::global_mean(const EvalResult& local) {
  double v[3] = {local.loss, local.accuracy, static_cast<double>(local.samples)};
  strategy_->sum(v, 3);
  return mean_of(EvalResult{v[0], v[1], static_cast<int64_t>(v[2])});
}

EvalResult Trainer::evaluate(const data::Dataset& dataset) {
  data::LoaderOptions lo;
  lo.batch = config_.train.batch;
  lo.shuffle = false;
  lo.prefetch = prefetch_;
  lo.slice_rank = strategy_->data_rank();
  lo.slice_count = strategy_->data_size();
  // A non-owning shared_ptr: the dataset outlives this call.
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](const auto*) {}), lo);
  loader.start_epoch(0);
  EvalResult sums;
  nn::CrossEntropyLoss loss;
  data::Batch batch;
  while (loader.next(batch)) {
    const int64_t rows = batch.y.dim(0);
    if (rows == 0) continue;  // more ranks than rows in a short last batch
    parallel::Piece piece{batch.x, batch.y, nn::Context{false, config_.seed, step_, batch.first_sample}};
    parallel::PieceResult r = strategy_->eval_piece(piece, loss);
    sums.loss += r.loss_sum;
    sums.accuracy += r.correct;
    sums.samples += r.rows;
  }
  return global_mean(sums);
}

void Trainer::log_metrics(const json& record) {
  std::ofstream out(fs::path(run_dir_) / "metrics.jsonl", std::ios::app);
  out << record.dump() << "\n";
}

void Trainer::save(const State& s) {
  // Collective: the running sums are per rank; the checkpoint holds their global totals.
  double totals[4] = {s.epoch_sums.loss, s.epoch_sums.accuracy,
                      static_cast<double>(s.epoch_sums.samples), static_cast<double>(s.train_samples)};
  strategy_->sum(totals, 4);
  strategy_->consolidate(*optimizer_);
  if (!strategy_->is_main()) return;
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
            {"epoch_loss_sum", totals[0]},
            {"epoch_correct_sum", totals[1]},
            {"epoch_samples", static_cast<int64_t>(totals[2])},
            {"train_seconds", s.train_seconds},
            {"train_samples", static_cast<int64_t>(totals[3])},
            {"world_size", strategy_->world_size()},
            {"params_sha256", model_->params_sha256()},
            {"config_name", config_.name},
            {"batch_rows", batch_rows_}};  // the unit of batch_in_epoch
  if (!lockstep_) t["worker_batches"] = batches_done_;
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
    // The position in another layout's batches (lockstep: train.batch rows, else worker batches).
    const int64_t saved_rows = t.value("batch_rows", config_.train.batch);
    if (saved_rows != batch_rows_) {
      const int64_t row = s.batch_in_epoch * saved_rows;
      if (row >= data_.train->size())
        s.batch_in_epoch = loader_->batches_per_epoch();
      else if (row % batch_rows_ != 0)
        throw IoError(str("checkpoint: ", dir, " stopped at row ", row, " of epoch ", s.epoch + 1,
                          ", which is not a batch boundary of this layout's ", batch_rows_,
                          "-row batches; resume with the layout and ps.mode it was saved with"));
      else
        s.batch_in_epoch = row / batch_rows_;
    }
    batches_done_ = t.value("worker_batches", step_ * (config_.train.batch / batch_rows_));
  } catch (const json::exception& e) {
    throw IoError(str("checkpoint: ", dir, "/trainer.json is corrupt (", e.what(),
                      "); resume from an older checkpoint"));
  }
  if (!strategy_->is_main()) {  // rank 0 carries the saved global totals
    s.epoch_sums = EvalResult{};
    s.train_samples = 0;
  }
  if (s.batch_in_epoch > loader_->batches_per_epoch())
    throw IoError(str("checkpoint: ", dir, " is at batch ", s.batch_in_epoch, " of an epoch of ",
                      loader_->batches_per_epoch(),
                      " batches; train.batch or the dataset changed since it was saved"));
  if (strategy_->is_main()) log_info("resumed from ", dir, " at step ", step_, " (epoch ", s.epoch + 1, ", batch ",
           s.batch_in_epoch, ")");
}

json Trainer::run() {
  const double wall_start = now_seconds();
  const bool main = strategy_->is_main();
  State s;
  if (!options_.resume.empty()) restore(options_.resume, s);
  if (strategy_->is_server())  // a parameter server: serves the workers until they finish
    return strategy_->serve(*optimizer_, [this](int64_t step) {
      return optim::lr_at(config_.schedule, base_lr_, step, total_steps_);
    });
  if (main) {
    fs::create_directories(run_dir_);
    std::ofstream(fs::path(run_dir_) / "config.toml") << to_toml(config_);
    if (options_.resume.empty()) std::ofstream(fs::path(run_dir_) / "metrics.jsonl", std::ios::trunc);
  }
  strategy_->on_start();

  const bool tty = options_.progress && isatty(fileno(stderr));
  const int64_t bpe = loader_->batches_per_epoch();
  const int64_t epochs = config_.train.epochs;
  const int64_t k = config_.train.accumulate;
  const int64_t global_batch = config_.train.batch * k;
  const int64_t start_step = step_;
  start_batches_ = batches_done_;
  const int64_t workers = strategy_->data_size();
  if (options_.progress)
    log_info("training ", config_.model.kind, " (", model_->num_parameters(), " parameters) on ",
             data_.train->name(), " (", data_.train->size(), " samples), layout ",
             strategy_->layout(), ", ", epochs, " epochs x ",
             lockstep_ ? (bpe + k - 1) / k : (bpe + workers - 1) / workers, " steps, batch ",
             global_batch, lockstep_ ? "" : str(" (claimed in worker batches of ", batch_rows_, ")"),
             ", run folder ", run_dir_);
  // Lockstep layouts count steps; the others claimed worker batches (agreed at epoch ends).
  auto budget_left = [&] {
    return lockstep_ ? step_ < total_steps_ : batches_done_ < claim_budget_;
  };

  EvalResult last_test, last_train = global_mean(s.epoch_sums);
  int64_t last_test_step = -1;
  bool stopped = false;
  double last_epoch_line = 0, last_plain_line = 0;
  double window_start = now_seconds();
  int64_t window_samples = 0;
  json epoch_records = json::array();
  std::vector<data::Batch> group;
  for (; s.epoch < epochs && budget_left() && !stopped; ++s.epoch, s.batch_in_epoch = 0) {
    const double epoch_start = now_seconds();
    double epoch_train_seconds = 0;
    if (lockstep_)
      loader_->start_epoch(s.epoch, s.batch_in_epoch);
    else  // the whole epoch, batches claimed at each worker's pace
      stopped = train_claimed_epoch(s, epoch_train_seconds, last_plain_line, tty);
    while (lockstep_) {
      if (step_ >= total_steps_) break;
      group.resize(static_cast<size_t>(k));
      size_t got = 0;
      while (got < group.size() && loader_->next(group[got])) ++got;
      if (got == 0) break;
      group.resize(got);
      const double t0 = now_seconds();  // time waiting for data is not training time
      const int64_t counted = s.epoch_sums.samples;
      step(group, s.epoch_sums);
      const double dt = now_seconds() - t0;
      s.train_seconds += dt;
      epoch_train_seconds += dt;
      // Rows count where their loss is computed: every stage of a pipeline sees the rows.
      s.train_samples += s.epoch_sums.samples - counted;
      for (const data::Batch& b : group) window_samples += b.global_size;
      s.batch_in_epoch += static_cast<int64_t>(got);

      // Collective on every rank at the same steps: global metrics, and whether to stop.
      if (step_ % config_.train.log_every == 0 || step_ == total_steps_) {
        double now = now_seconds();
        double sps = window_samples / std::max(1e-9, now - window_start);
        EvalResult m = global_mean(s.epoch_sums);
        double interrupt = options_.interrupt != nullptr && options_.interrupt->load() ? 1 : 0;
        strategy_->max(&interrupt, 1);
        if (interrupt > 0) stopped = true;
        if (main)
          report_progress(s.epoch, step_, m, sps,
                          static_cast<double>((total_steps_ - step_) * global_batch), tty,
                          last_plain_line);
        window_start = now;
        window_samples = 0;
      }
      if (options_.stop_after > 0 && step_ - start_step >= options_.stop_after) stopped = true;
      if (stopped) break;
      if (config_.checkpoint.every_steps > 0 && step_ % config_.checkpoint.every_steps == 0) save(s);
    }
    if (stopped) break;

    // End of an epoch (or of the step budget): evaluate and report.
    if (tty) std::fprintf(stderr, "\n");
    last_train = global_mean(s.epoch_sums);
    json rec = {{"type", "epoch"}, {"epoch", s.epoch + 1}, {"step", step_},
                {"train_loss", last_train.loss}, {"train_accuracy", last_train.accuracy}};
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
    rec["epoch_seconds"] = now_seconds() - epoch_start;
    rec["ranks"] = rank_metrics(epoch_train_seconds);
    if (main) log_metrics(rec);
    epoch_records.push_back(rec);
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
    const bool last_epoch = s.epoch + 1 >= epochs || !budget_left();
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
    if (main) log_info("stopped at step ", step_, "; continue with --resume ", run_dir_);
  }
  if (data_.test && last_test_step != step_) last_test = evaluate(*data_.test);

  double samples = static_cast<double>(s.train_samples), seconds = s.train_seconds;
  strategy_->sum(&samples, 1);
  strategy_->max(&seconds, 1);
  strategy_->consolidate(*optimizer_);  // params_sha256 of the whole model
  json summary = {
      {"model", config_.model.kind},
      {"dataset", data_.train->name()},
      {"world_size", strategy_->world_size()},
      {"layout", strategy_->layout()},
      {"epochs", s.epoch},
      {"steps", step_},
      {"train_loss", last_train.loss},
      {"train_accuracy", last_train.accuracy},
      {"test_loss", data_.test ? json(last_test.loss) : json(nullptr)},
      {"test_accuracy", data_.test ? json(last_test.accuracy) : json(nullptr)},
      {"samples_per_second", samples / std::max(1e-9, seconds)},
      {"train_seconds", seconds},
      {"wall_seconds", now_seconds() - wall_start},
      {"params_sha256", model_->params_sha256()},
      {"num_parameters", model_->num_parameters()},
      {"peak_rss_bytes", peak_rss_bytes()},
      {"threads", config_.runtime.threads},
      {"completed", !stopped},
      {"run_dir", run_dir_}};
  if (!epoch_records.empty()) summary["ranks"] = epoch_records.back()["ranks"];
  if (main)
    ckpt::write_file_atomic((fs::path(run_dir_) / "summary.json").string(), summary.dump(2) + "\n");
  return summary;
}

}  // namespace tessel::train
