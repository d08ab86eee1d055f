#include "tessel/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/core/trace.h"
#include "tessel/nn/models.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"
#include "tessel/optim/schedule.h"
#include "tessel/parallel/composition.h"
#include "tessel/tensor/device.h"
#include "tessel/train/checkpointer.h"
#include "tessel/train/progress.h"
#include "tessel/train/recovery.h"
#include "tessel/train/run_folder.h"
#include "tessel/train/run_trace.h"

namespace tessel::train {

namespace fs = std::filesystem;
using nlohmann::json;

Trainer::Trainer(Config config, RunOptions options, comm::Communicator* world,
                 const data::Splits* data)
    : config_(std::move(config)), options_(std::move(options)) {
  if (world == nullptr) {
    own_world_ = std::move(comm::make_thread_world(1)[0]);
    world = &own_world_;
  }
  world_ = world;
  data_ = data ? *data : data::make_datasets(config_.data);  // shared input, no rank's state
  // From here on this rank's tensors are charged to its ledger (core/memory.h).
  ledger_ = std::make_shared<MemoryLedger>(config_.parallel.memory_limit_mb << 20,
                                           str("rank ", world->rank()));
  MemoryScope memory(ledger_, MemCategory::kOther);
  DeviceScope device(config_.parallel.device, nullptr);  // runtime.device: where tensors go
  if (config_.observe.trace)
    trace_ = std::make_unique<RunTrace>(config_.observe.trace_steps, str("rank ", world->rank()));
  // OpenBLAS's thread count is process-wide: ranks that are threads of one process each use one
  // BLAS thread (set by the launcher), a rank that owns its process uses runtime.threads.
  if (world->backend() == comm::Backend::kMpi || world->size() == 1)
    ops::set_blas_threads(config_.runtime.threads);
  if (world->rank() == 0 && config_.parallel.precision == parallel::Precision::kBf16 &&
      !ops::gemm_lowp_native())
    log_info("ops: this CPU has no bf16 arithmetic (ISA level ", ops::isa_name(ops::isa()),
             "): bf16 keeps its storage, buffers and messages, and computes in f32 FMAs");
  // (2 workers on 2 cores ran fashion_mlp 5% faster without a prefetch thread.)
  prefetch_ =
      resolve_prefetch(config_.train.prefetch, world->ranks_on_host(), config_.runtime.threads,
                       static_cast<int>(std::thread::hardware_concurrency()));
  // Caught here (and so by `tessel config`), not by the first step's forward.
  const bool tokens = nn::reads_tokens(config_.model);
  if (tokens != (data_.train->input_dtype() == DType::kI32))
    throw InvalidArgument(
        str("model: ", name_of(config_.model.kind), " reads ", tokens ? "token ids" : "features",
            ", but data.kind = '", name_of(config_.data.kind), "' gives ",
            tokens ? "features" : "token ids",
            "; a gpt or a stack of text layers trains on data.kind = 'text' or 'tokens', the "
            "other models on the others"));
  nn::ModelSpec spec = config_.model;
  spec.input_shape = data_.train->input_shape();
  spec.num_classes = data_.train->num_classes();
  spec.task = data_.train->task();
  parallel::check_device(config_.parallel, spec);
  engine_ = std::make_unique<parallel::Engine>(config_.parallel, config_.optim, *world, spec,
                                               config_.seed);
  checkpointer_ = std::make_unique<Checkpointer>(
      config_, *engine_, data_.tokenizer,
      ckpt::ModelIo{spec.input_shape, data_.train->input_dtype(), spec.num_classes,
                    data_.input_mean, data_.input_std, spec.task, data_.input_names,
                    data_.target_names});
  set_up_loader();
  base_lr_ = optim::scaled_lr(config_.optim.lr, config_.train.batch * config_.train.accumulate,
                              config_.train.base_batch);
  run_dir_ = options_.run_dir;
  if (run_dir_.empty() && !options_.resume.empty())  // continue in the folder we resume from
    run_dir_ = fs::path(ckpt::resolve_checkpoint_dir(options_.resume)).parent_path().parent_path();
  if (run_dir_.empty()) run_dir_ = (fs::path("runs") / config_.name).string();
  progress_ = std::make_unique<Progress>(config_, engine_->is_main(), options_.progress,
                                         world->backend() != comm::Backend::kMpi, run_dir_);
}

Trainer::~Trainer() = default;

json Trainer::plan() const {
  const int64_t bpe = loader_->batches_per_epoch();
  const int64_t per_step = lockstep_ ? config_.train.accumulate : engine_->data_size();
  json memory;
  for (int c = 0; c < kMemCategories; ++c)
    memory[mem_category_name(static_cast<MemCategory>(c))] =
        ledger_->current(static_cast<MemCategory>(c));
  json out = {{"world_size", world_->size()},
              {"layout", engine_->layout().str()},
              {"engine", engine_->parts()},
              {"model", name_of(config_.model.kind)},
              {"num_parameters", engine_->model().num_parameters()},
              {"dataset", data_.train->name()},
              {"train_samples", data_.train->size()},
              {"global_batch", config_.train.batch * config_.train.accumulate},
              {"steps_per_epoch", (bpe + per_step - 1) / per_step},
              {"steps", total_steps_},
              {"schedule_steps", schedule_steps_},
              {"run_dir", run_dir_},
              {"memory_bytes", memory}};
  out.update(engine_->plan());
  return out;
}

void Trainer::set_up_loader() {
  const int64_t workers = engine_->data_size();
  lockstep_ = engine_->claims() == nullptr;
  data::LoaderOptions lo;
  lo.batch = config_.train.batch;
  lo.shuffle = config_.train.shuffle;
  lo.drop_last = config_.train.drop_last;
  lo.seed = config_.seed;
  lo.prefetch = prefetch_;
  // ddp.balance: every rank loads whole batches and computes the micro-shards dealt to it.
  const bool dealt = config_.parallel.balance != parallel::BalanceMode::kOff;
  lo.slice_rank = dealt ? 0 : engine_->data_rank();
  lo.slice_count = dealt ? 1 : static_cast<int>(workers);
  if (!lockstep_) {  // whole worker batches, claimed by index (batch_at)
    const std::string why =
        str("with ps.mode = ", name_of(config_.parallel.ps_mode),
            " each worker trains claimed batches of train.batch / workers rows");
    if (config_.train.batch < workers)
      throw InvalidArgument(str("config: train.batch = ", config_.train.batch,
                                " is smaller than the ", workers, " workers; ", why,
                                "; raise train.batch"));
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
  set_up_shards(workers, dealt);
  engine_->check_batch(config_.train.batch);
  // The one product of a config value and the dataset's size: every count below is at most it.
  int64_t run_batches = 0;
  if (__builtin_mul_overflow(config_.train.epochs, bpe, &run_batches))
    throw InvalidArgument(str("config: train.epochs = ", config_.train.epochs, " x ", bpe,
                              " batches per epoch do not fit in 64 bits; lower train.epochs"));
  const int64_t k = config_.train.accumulate;
  schedule_steps_ = total_steps_ = config_.train.epochs * ((bpe + k - 1) / k);
  if (config_.train.max_steps > 0) total_steps_ = std::min(total_steps_, config_.train.max_steps);
  if (!lockstep_) {  // a step is `workers` worker batches, whoever trains them
    claim_budget_ = run_batches;
    schedule_steps_ = (claim_budget_ + workers - 1) / workers;
    if (config_.train.max_steps > 0 && config_.train.max_steps < schedule_steps_)
      claim_budget_ = config_.train.max_steps * workers;  // less than the epochs' batches
    total_steps_ = (claim_budget_ + workers - 1) / workers;
  }
}

// Deterministic mode: the micro-shards of each batch, dealt evenly (a multiple of the ranks)
// or by ddp.balance, and full batches. Otherwise ddp.balance deals each batch's rows.
void Trainer::set_up_shards(int64_t workers, bool dealt) {
  if (!config_.parallel.deterministic) {
    if (!dealt) return;
    if (config_.train.batch < workers)
      throw InvalidArgument(
          str("config: ddp.balance = ", name_of(config_.parallel.balance),
              " deals each rank one row at least, but train.batch = ", config_.train.batch,
              " is smaller than the ", workers, " data-parallel ranks; raise train.batch"));
    deal_ = std::make_unique<parallel::ShardDeal>(config_.parallel.balance,
                                                  static_cast<int>(workers), config_.train.batch);
    return;
  }
  const int64_t shards = config_.train.batch / config_.parallel.micro_shard;
  if (dealt && shards < workers)
    throw InvalidArgument(
        str("config: ddp.balance = ", name_of(config_.parallel.balance),
            " deals each rank one micro-shard at least, but train.batch = ", config_.train.batch,
            " makes ", shards, " of ddp.micro_shard = ", config_.parallel.micro_shard, " rows for ",
            workers, " data-parallel ranks; lower ddp.micro_shard"));
  if (dealt)
    deal_ = std::make_unique<parallel::ShardDeal>(config_.parallel.balance,
                                                  static_cast<int>(workers), shards);
  else if (shards % workers != 0)
    throw InvalidArgument(
        str("config: train.deterministic splits each batch into ", shards,
            " micro-shards of ddp.micro_shard = ", config_.parallel.micro_shard, " rows, which ",
            workers, " data-parallel ranks cannot share evenly; pick a dp size dividing ", shards,
            ", change ddp.micro_shard, or set ddp.balance = dynamic (uneven deals)"));
  if (!config_.train.drop_last && data_.train->size() % config_.train.batch != 0)
    throw InvalidArgument(str("config: train.deterministic needs full batches, but ",
                              data_.train->size(), " samples leave a short last batch of ",
                              data_.train->size() % config_.train.batch,
                              "; set train.drop_last = true"));
}

float Trainer::lr_at(int64_t step) const {
  return optim::lr_at(config_.schedule, base_lr_, step, schedule_steps_);
}

void Trainer::train_piece(const parallel::Piece& piece, EvalResult& sums) {
  const parallel::PieceStats r = engine_->train_piece(piece);
  sums.loss += r.loss_sum;
  sums.accuracy += r.correct;
  sums.samples += r.rows;
}

double Trainer::step(const std::vector<data::Batch>& batches, EvalResult& sums) {
  // Every row of the step's global batches weighs 1/global_rows, so summing the ranks'
  // gradients gives the gradient of the global mean loss whatever the split.
  double global_rows = 0;
  for (const data::Batch& b : batches) global_rows += static_cast<double>(b.global_size);
  const int64_t shard = config_.parallel.deterministic ? config_.parallel.micro_shard : 0;
  const int me = engine_->data_rank();
  const double t0 = now_seconds();
  int64_t dealt = 0;  // shards computed: micro-shards in deterministic mode, else rows
  for (size_t j = 0; j < batches.size(); ++j) {
    const data::Batch& b = batches[j];
    const int64_t rows = b.y.dim(0);
    const bool last = j + 1 == batches.size();
    auto piece = [&](int64_t lo, int64_t hi, bool last_piece) {
      Shape xs = b.x.shape(), ys = b.y.shape();
      xs[0] = ys[0] = hi - lo;
      const int64_t x_row = b.x.numel() / std::max<int64_t>(rows, 1);
      const int64_t y_row = b.y.numel() / std::max<int64_t>(rows, 1);
      train_piece({b.x.view(lo * x_row, xs), b.y.view(lo * y_row, ys),
                   nn::Context{true, config_.seed, step_, b.first_sample + lo},
                   static_cast<double>(hi - lo) / global_rows, last_piece},
                  sums);
    };
    if (shard == 0) {  // the loader's slice, or with ddp.balance the rows dealt to this rank
      int64_t lo = 0, hi = rows;  // a short last batch is dealt in proportion
      if (deal_) {
        lo = deal_->first(me) * rows / batch_rows_;
        hi = (deal_->first(me) + deal_->counts()[static_cast<size_t>(me)]) * rows / batch_rows_;
      }
      piece(lo, hi, last);
      dealt += hi - lo;
      continue;
    }
    // Deterministic mode: fixed micro-shards, each with its own gradient. The loader's slice,
    // or with ddp.balance the shards dealt to this rank of the whole batch.
    const int64_t lo = deal_ ? deal_->first(me) * shard : 0;
    const int64_t hi = deal_ ? lo + deal_->counts()[static_cast<size_t>(me)] * shard : rows;
    for (int64_t r = lo; r < hi; r += shard, ++dealt)
      piece(r, std::min(r + shard, hi), last && r + shard >= hi);
  }
  const double busy_s = now_seconds() - t0;
  engine_->step(lr_at(step_), config_.train.clip_norm, step_);
  ++step_;
  return deal_ ? busy_s / static_cast<double>(std::max<int64_t>(dealt, 1)) : 0;
}

void Trainer::rebalance(const std::vector<double>& seconds_per_shard) {
  if (!deal_->update(seconds_per_shard)) return;
  if (Tracer* tracer = active_tracer()) {  // the deal of the next step
    TraceArgs args;
    args.text("shards_per_rank", deal_->str());
    tracer->instant("ddp.balance", "step", now_seconds(), std::move(args));
  }
}

EvalResult Trainer::global_mean(const EvalResult& local) {
  double v[3] = {local.loss, local.accuracy, static_cast<double>(local.samples)};
  engine_->sum(v, 3);
  return mean_of(EvalResult{v[0], v[1], static_cast<int64_t>(v[2])});
}

EvalResult Trainer::evaluate(const data::Dataset& dataset) {
  MemoryScope memory(ledger_, MemCategory::kOther);
  DeviceScope device(config_.parallel.device, nullptr);
  EvalPass pass;
  pass.batch = config_.train.batch;
  pass.slice_rank = engine_->data_rank();
  pass.slice_count = engine_->data_size();
  pass.prefetch = prefetch_;
  pass.seed = config_.seed;
  pass.step = step_;
  return train::evaluate(
      dataset, pass, [&](const parallel::Piece& p) { return engine_->eval_piece(p); },
      [&](double* v, int n) { engine_->sum(v, n); });
}

// One all-reduce (max) carries both: the stop flag, and each rank's seconds per shard in its
// own slot (0 in the others'), so that balancing adds no collective of its own.
bool Trainer::agree_stop(double seconds_per_shard) {
  const bool measuring = deal_ && deal_->measuring();
  if (options_.interrupt == nullptr && !measuring) return false;
  std::vector<double> v(measuring ? 1 + static_cast<size_t>(engine_->data_size()) : 1, 0.0);
  v[0] = options_.interrupt != nullptr && options_.interrupt->load() ? 1 : 0;
  if (measuring) v[1 + static_cast<size_t>(engine_->data_rank())] = seconds_per_shard;
  engine_->max(v.data(), static_cast<int>(v.size()));
  if (measuring) rebalance({v.begin() + 1, v.end()});
  return v[0] > 0;
}

void Trainer::train_epoch(State& s, bool& stopped) {
  const int64_t k = config_.train.accumulate;
  loader_->start_epoch(s.epoch, s.batch_in_epoch);
  double window_start = now_seconds();
  int64_t window_samples = 0;
  EvalResult window_sums = s.epoch_sums;  // at the last record
  std::vector<data::Batch> group;
  while (step_ < total_steps_) {
    group.resize(static_cast<size_t>(k));
    size_t got = 0;
    while (got < group.size() && loader_->next(group[got])) ++got;
    if (got == 0) break;
    group.resize(got);
    if (trace_) trace_->tracer()->at_step(step_);
    const double t0 = now_seconds();  // time waiting for data is not training time
    const int64_t counted = s.epoch_sums.samples;
    double seconds_per_shard = 0;
    {
      TraceSpan span("step", "step");
      if (TraceArgs* args = span.args()) {
        args->num("step", static_cast<double>(step_));
        if (deal_)  // this rank's micro-shards per batch in this step
          args->num("shards", static_cast<double>(
                                  deal_->counts()[static_cast<size_t>(engine_->data_rank())]));
      }
      seconds_per_shard = step(group, s.epoch_sums);
    }
    const double dt = now_seconds() - t0;
    s.train_seconds += dt;
    untaken_s_ += dt;
    ++untaken_steps_;
    progress_->tick(step_);
    // Rows count where their loss is computed: every stage of a pipeline sees the rows.
    s.train_samples += s.epoch_sums.samples - counted;
    for (const data::Batch& b : group) window_samples += b.global_size;
    s.batch_in_epoch += static_cast<int64_t>(got);
    // Collective on every rank at the same steps: global metrics, and whether to stop (every
    // step, so that a signal to any rank stops them all at the next step boundary).
    stopped = agree_stop(seconds_per_shard);
    inject_fault(config_.fault, *world_, step_);
    if (step_ % config_.train.log_every == 0 || step_ == total_steps_) {
      const double now = now_seconds();
      const EvalResult m = global_mean(s.epoch_sums);
      const EvalResult w = global_mean(minus(s.epoch_sums, window_sums));
      const std::vector<parallel::RankStats> ranks = take_stats();
      progress_->train_line({s.epoch, step_, m, w, lr_at(step_ - 1),
                             window_samples / std::max(1e-9, now - window_start), &ranks,
                             deal_.get()});
      window_sums = s.epoch_sums;
      window_start = now;
      window_samples = 0;
    }
    if (options_.stop_after > 0 && step_ - start_step_ >= options_.stop_after) stopped = true;
    if (stopped) return;
    if (config_.checkpoint.every_steps > 0 && step_ % config_.checkpoint.every_steps == 0)
      save(s);
    else if (options_.snapshots && step_ % config_.checkpoint.snapshot_steps == 0)
      save(s, /*to_disk=*/false);
  }
}

std::vector<parallel::RankStats> Trainer::take_stats() {
  std::vector<parallel::RankStats> ranks =
      engine_->take_stats(untaken_s_, static_cast<double>(untaken_steps_));
  untaken_s_ = 0;
  untaken_steps_ = 0;
  for (auto* total : {&epoch_stats_, &run_stats_}) {
    if (total->empty()) total->resize(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r) (*total)[r].add(ranks[r]);
  }
  return ranks;
}

void Trainer::end_epoch(State& s, double epoch_start, json& epoch_records, EvalResult& last_test,
                        int64_t& last_test_step) {
  const EvalResult train = global_mean(s.epoch_sums);
  json rec = {{"type", "epoch"},
              {"epoch", s.epoch + 1},
              {"step", step_},
              {"train_loss", train.loss},
              {"train_accuracy", train.accuracy}};
  // train.max_steps ended the run inside the epoch; a resume finishes it with another record.
  if (s.batch_in_epoch < loader_->batches_per_epoch()) rec["partial"] = true;
  if (data_.test) {
    last_test = evaluate(*data_.test);
    last_test_step = step_;
    rec["test_loss"] = last_test.loss;
    rec["test_accuracy"] = last_test.accuracy;
  }
  double train_eval_accuracy = 0;
  if (config_.train.eval_train) {
    const EvalResult full = evaluate(*data_.train);
    rec["train_eval_loss"] = full.loss;
    rec["train_eval_accuracy"] = train_eval_accuracy = full.accuracy;
  }
  rec["epoch_seconds"] = now_seconds() - epoch_start;
  take_stats();
  rec["ranks"] = rank_report(epoch_stats_, *engine_, config_);
  epoch_stats_.clear();
  progress_->log(rec);
  epoch_records.push_back(rec);
  progress_->epoch_line(s.epoch, train, data_.test ? &last_test : nullptr,
                        config_.train.eval_train ? &train_eval_accuracy : nullptr,
                        rec["epoch_seconds"].get<double>());
}

void Trainer::start_progress() {
  const int64_t bpe = loader_->batches_per_epoch(), k = config_.train.accumulate;
  const int64_t workers = engine_->data_size();
  const int64_t steps_per_epoch = lockstep_ ? (bpe + k - 1) / k : (bpe + workers - 1) / workers;
  if (lockstep_ && workers > config_.train.batch && engine_->is_main())
    log_warn("train.batch = ", config_.train.batch, " rows over ", workers,
             " data-parallel ranks leaves ", workers - config_.train.batch,
             " of them without rows (they only join the collectives); use at most ",
             config_.train.batch, " ranks, or a larger train.batch");
  progress_->info(str("training ", name_of(config_.model.kind), " (",
                      engine_->model().num_parameters(), " parameters) on ", data_.train->name(),
                      " (", data_.train->size(), " samples), layout ", engine_->layout().str(),
                      ", zero.stage ", config_.parallel.zero_stage, ", ", config_.train.epochs,
                      " epochs x ", steps_per_epoch, " steps, batch ", config_.train.batch * k,
                      lockstep_ ? "" : str(" (claimed in worker batches of ", batch_rows_, ")"),
                      ", run folder ", run_dir_));
  // The ETA's guess of an evaluation before one ran: a forward pass costs about a third of a
  // training step per row.
  const double eval_rows = static_cast<double>(
      (data_.test ? data_.test->size() : 0) + (config_.train.eval_train ? data_.train->size() : 0));
  progress_->start(step_, total_steps_, steps_per_epoch,
                   eval_rows / static_cast<double>(3 * config_.train.batch * k));
}

bool Trainer::open_run(State& s) {
  const bool resuming = !options_.resume.empty() || options_.resume_snapshot;
  const RunStart start = resuming             ? RunStart::kResume
                         : options_.overwrite ? RunStart::kOverwrite
                                              : RunStart::kFresh;
  prepare_run_folder(*world_, run_dir_, start,
                     {options_.command, engine_->layout().str(),
                      options_.resume_snapshot ? "an in-memory snapshot"
                      : resuming               ? ckpt::resolve_checkpoint_dir(options_.resume)
                                               : "",
                      options_.layout_auto});
  for (const std::string& note : options_.notes) progress_->info(note);
  if (resuming) {
    const std::string loaded = restore(options_.resume, s);
    if (engine_->is_main() && !options_.resume_snapshot) record_resumed_from(run_dir_, loaded);
  }
  return resuming;
}

json Trainer::run() {
  MemoryScope memory(ledger_, MemCategory::kOther);
  DeviceScope device(config_.parallel.device, nullptr);
  TraceScope trace(trace_ ? trace_->tracer() : nullptr);
  if (trace_) trace_->align(*world_);
  wall_start_ = now_seconds();
  State s;
  const bool resuming = open_run(s);
  if (!engine_->trains()) {  // a server: serves the training ranks until they finish
    json out = engine_->serve([this](int64_t step) { return lr_at(step); });
    finish_trace();
    return out;
  }
  progress_->start_log(!resuming);
  if (engine_->is_main()) std::ofstream(fs::path(run_dir_) / "config.toml") << to_toml(config_);
  engine_->start();

  const int64_t bpe = loader_->batches_per_epoch(), epochs = config_.train.epochs;
  start_step_ = step_;
  start_batches_ = batches_done_;
  start_progress();
  // Lockstep layouts count steps; the others claimed worker batches (agreed at epoch ends).
  auto budget_left = [&] {
    return lockstep_ ? step_ < total_steps_ : batches_done_ < claim_budget_;
  };
  EvalResult last_test, last_train = global_mean(s.epoch_sums);
  int64_t last_test_step = -1;
  bool stopped = false;
  json epoch_records = json::array();
  if (resuming && !(s.epoch < epochs && budget_left()))
    progress_->info(str("the run had already trained ", s.epoch, " epochs and ", step_,
                        " steps; nothing left to train (raise train.epochs or train.max_steps "
                        "to go on)"));
  for (; s.epoch < epochs && budget_left() && !stopped; ++s.epoch, s.batch_in_epoch = 0) {
    const double epoch_start = now_seconds();
    if (lockstep_)
      train_epoch(s, stopped);
    else  // the whole epoch, batches claimed at each worker's pace
      stopped = train_claimed_epoch(s);
    if (stopped) break;
    // End of an epoch (or of the step budget): evaluate and report.
    const double end_start = now_seconds();
    last_train = global_mean(s.epoch_sums);
    end_epoch(s, epoch_start, epoch_records, last_test, last_test_step);
    if (s.batch_in_epoch < bpe) {  // the budget ended inside the epoch: a resume goes on here
      save(s);
      progress_->epoch_end_took(now_seconds() - end_start);
      break;
    }
    s.epoch_sums = EvalResult{};
    const bool last_epoch = s.epoch + 1 >= epochs || !budget_left();
    const int64_t every = config_.checkpoint.every_epochs;
    if ((every > 0 && (s.epoch + 1) % every == 0) || last_epoch) {
      State next = s;
      ++next.epoch;
      next.batch_in_epoch = 0;
      save(next);
    }
    progress_->epoch_end_took(now_seconds() - end_start);
  }
  if (stopped) {
    progress_->end_live_line();
    save(s);
    progress_->info(str("stopped at step ", step_, "; continue with --resume ", run_dir_));
  }
  if (data_.test && last_test_step != step_) last_test = evaluate(*data_.test);
  const bool stop_after = options_.stop_after > 0 && step_ - start_step_ >= options_.stop_after;
  const char* stopped_by = stopped             ? (stop_after ? "stop_after" : "signal")
                           : s.epoch >= epochs ? "epochs"
                                               : "max_steps";
  json out = summary(s, last_train, last_test, epoch_records, stopped_by);
  finish_trace();
  return out;
}

void Trainer::finish_trace() {
  if (!trace_) return;
  trace_->tracer()->set_recording(false);
  engine_->finish();  // nothing is asked of the servers afterwards: their serve() returns
  trace_->write(*world_, (fs::path(run_dir_) / "trace.json").string(),
                {{"layout", engine_->layout().str()},
                 {"world_size", world_->size()},
                 {"trace_steps", config_.observe.trace_steps},
                 {"model", name_of(config_.model.kind)}});
}

json Trainer::summary(const State& s, const EvalResult& last_train, const EvalResult& last_test,
                      const json& epoch_records, const std::string& stopped_by) {
  double samples = static_cast<double>(s.train_samples), seconds = s.train_seconds;
  engine_->sum(&samples, 1);
  engine_->max(&seconds, 1);
  const std::string digest = engine_->params_sha256();
  // Each training rank's process (ranks as threads share one).
  json rss = json::array();
  for (double b : engine_->gather(static_cast<double>(peak_rss_bytes())))
    rss.push_back(static_cast<int64_t>(b));
  json out = {{"model", name_of(config_.model.kind)},
              {"dataset", data_.train->name()},
              {"world_size", world_->size()},
              {"layout", engine_->layout().str()},
              {"zero_stage", config_.parallel.zero_stage},
              {"engine", engine_->parts()},
              {"epochs", s.epoch},
              {"steps", step_},
              {"train_loss", last_train.loss},
              {"train_accuracy", last_train.accuracy},
              {"test_loss", data_.test ? json(last_test.loss) : json(nullptr)},
              {"test_accuracy", data_.test ? json(last_test.accuracy) : json(nullptr)},
              {"samples_per_second", samples / std::max(1e-9, seconds)},
              {"train_seconds", seconds},
              {"wall_seconds", s.wall_seconds + now_seconds() - wall_start_},
              {"params_sha256", digest},
              {"num_parameters", engine_->model().num_parameters()},
              {"peak_rss_bytes", *std::max_element(rss.begin(), rss.end())},
              {"peak_rss_bytes_per_rank", rss},
              {"threads", config_.runtime.threads},
              {"isa", ops::isa_name(ops::isa())},
              {"completed", stopped_by == "epochs" || stopped_by == "max_steps"},
              {"stopped_by", stopped_by},
              {"run_dir", run_dir_}};
  if (!epoch_records.empty()) out["ranks"] = epoch_records.back()["ranks"];
  if (const optim::LossScaler* ls = engine_->loss_scaler()) {
    out["loss_scale"] = ls->scale();
    out["skipped_steps"] = ls->skipped();
  }
  // A rank slower than its peers over the whole run (progress lines name it as it happens).
  const std::optional<Straggler> straggler = find_straggler(run_stats_);
  out["straggler"] = straggler
                         ? json{{"rank", straggler->rank}, {"slowdown", straggler->slowdown()}}
                         : json(nullptr);
  if (json c = compress_report(run_stats_); !c.is_null()) out["compress"] = c;
  if (deal_) out["balance"] = balance_report(*deal_);
  if (engine_->layout().tp > 1) out["tensor_parallel"] = engine_->tp_counters();
  if (engine_->is_main())
    ckpt::write_file_atomic((fs::path(run_dir_) / "summary.json").string(), out.dump(2) + "\n");
  return out;
}

}  // namespace tessel::train
