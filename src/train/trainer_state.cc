// Trainer: where a run stands (trainer.json in each checkpoint), saving it and resuming from
// it, and the epochs of parameter-server workers that train claimed batches.
#include <algorithm>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/clock.h"
#include "tessel/core/trace.h"
#include "tessel/train/checkpointer.h"
#include "tessel/train/progress.h"
#include "tessel/train/recovery.h"
#include "tessel/train/run_trace.h"
#include "tessel/train/snapshots.h"
#include "tessel/train/trainer.h"

namespace tessel::train {

using nlohmann::json;

void Trainer::save(const State& s, bool to_disk) {
  // Collective: the running sums are per rank; the checkpoint holds their global totals.
  double totals[4] = {s.epoch_sums.loss, s.epoch_sums.accuracy,
                      static_cast<double>(s.epoch_sums.samples),
                      static_cast<double>(s.train_samples)};
  engine_->sum(totals, 4);
  json t = {{"step", step_},
            {"epoch", s.epoch},
            {"batch_in_epoch", s.batch_in_epoch},
            {"seed", config_.seed},
            {"epoch_loss_sum", totals[0]},
            {"epoch_correct_sum", totals[1]},
            {"epoch_samples", static_cast<int64_t>(totals[2])},
            {"train_seconds", s.train_seconds},
            {"wall_seconds", s.wall_seconds + now_seconds() - wall_start_},
            {"train_samples", static_cast<int64_t>(totals[3])},
            {"world_size", world_->size()},
            {"layout", engine_->layout().str()},
            {"zero_stage", config_.parallel.zero_stage},
            {"config_name", config_.name},
            {"batch_rows", batch_rows_}};  // the unit of batch_in_epoch
  if (!lockstep_) t["worker_batches"] = batches_done_;
  if (deal_) t["balance"] = deal_->save();                   // the same on every rank
  if (const optim::LossScaler* ls = engine_->loss_scaler())  // the same on every rank
    t["loss_scaler"] = {{"scale", ls->scale()},
                        {"growth_tracker", ls->growth_tracker()},
                        {"skipped", ls->skipped()}};
  if (to_disk) {
    t["params_sha256"] = engine_->params_sha256();  // checked after a resume
    checkpointer_->save(run_dir_, step_, t.dump(2));
  }
  if (options_.snapshots) checkpointer_->snapshot(*options_.snapshots, step_, t.dump(2));
}

std::string Trainer::restore(const std::string& path, State& s) {
  std::string dir;
  const std::string text = options_.resume_snapshot
                               ? checkpointer_->restore(*options_.snapshots->latest())
                               : checkpointer_->restore(path, &dir);
  if (options_.resume_snapshot) dir = options_.snapshots->latest()->dir();
  try {
    const json t = json::parse(text);
    step_ = t.at("step").get<int64_t>();
    s.epoch = t.at("epoch").get<int64_t>();
    s.batch_in_epoch = t.at("batch_in_epoch").get<int64_t>();
    s.epoch_sums.loss = t.at("epoch_loss_sum").get<double>();
    s.epoch_sums.accuracy = t.at("epoch_correct_sum").get<double>();
    s.epoch_sums.samples = t.at("epoch_samples").get<int64_t>();
    s.train_seconds = t.at("train_seconds").get<double>();
    s.wall_seconds = t.value("wall_seconds", s.train_seconds);  // absent before it was saved
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
    // fp16's loss scale continues; a checkpoint of another precision starts from the default.
    if (optim::LossScaler* ls = engine_->loss_scaler(); ls && t.contains("loss_scaler")) {
      const json& l = t.at("loss_scaler");
      ls->restore(l.at("scale").get<float>(), l.at("growth_tracker").get<int64_t>(),
                  l.at("skipped").get<int64_t>());
    }
    if (deal_ && t.contains("balance") && !deal_->load(t.at("balance")))
      progress_->info(str("ddp.balance: ", dir,
                          " holds a deal for another ddp.balance, "
                          "micro-shard or rank count; dealing evenly until measured again"));
    check_restored_params(*engine_, t.value("params_sha256", ""), dir);
  } catch (const json::exception& e) {
    throw IoError(str("checkpoint: ", dir, "/trainer.json is corrupt (", e.what(),
                      "); resume from an older checkpoint"));
  }
  if (!engine_->is_main()) {  // rank 0 carries the saved global totals
    s.epoch_sums = EvalResult{};
    s.train_samples = 0;
  }
  if (s.batch_in_epoch > loader_->batches_per_epoch())
    throw IoError(str("checkpoint: ", dir, " is at batch ", s.batch_in_epoch, " of an epoch of ",
                      loader_->batches_per_epoch(),
                      " batches; train.batch or the dataset changed since it was saved"));
  progress_->info(str("resumed from ", dir, " at step ", step_, " (epoch ", s.epoch + 1, ", batch ",
                      s.batch_in_epoch, ")"));
  return dir;
}

// One epoch of a layout that is not lockstep: this worker claims batches [first, limit) of the
// epoch one at a time, trains each as a whole worker batch and pushes it (the claim of the
// next rides on the push), until the range is exhausted. Progress lines are rank 0's own
// view: its running sums, and samples/s from the claim indices (which count every worker's
// batches). An interrupt closes this worker's claims after the batch in hand; --stop-after
// and train.max_steps cut the range, so every batch handed out is trained. Ends with one
// collective that counts the batches trained and agrees on stopping. Returns whether the run
// stops.
bool Trainer::train_claimed_epoch(State& s) {
  parallel::BatchClaims& claims = *engine_->claims();
  const int64_t workers = engine_->data_size();
  const int64_t first = s.batch_in_epoch;
  int64_t limit = std::min(loader_->batches_per_epoch(), first + claim_budget_ - batches_done_);
  bool cut = false;  // --stop-after ends this invocation inside (or at the end of) this range
  if (options_.stop_after > 0) {
    const int64_t left = start_batches_ + options_.stop_after * workers - batches_done_;
    if (first + left <= limit) limit = first + left, cut = true;
  }
  const int64_t epoch_step = step_;
  auto interrupted = [&] { return options_.interrupt != nullptr && options_.interrupt->load(); };
  claims.set_claims({s.epoch, first, limit, epoch_step, !interrupted()});
  double window_start = now_seconds(), t0 = window_start;
  int64_t b = claims.claim(), window_first = b, mine = 0;
  EvalResult window_sums = s.epoch_sums;  // at rank 0's last record
  int64_t next_log = (epoch_step / config_.train.log_every + 1) * config_.train.log_every;
  bool stop = b < 0 && interrupted();
  untaken_s_ += now_seconds() - t0;
  s.train_seconds += now_seconds() - t0;
  while (b >= 0) {
    const data::Batch batch = loader_->batch_at(s.epoch, b);
    t0 = now_seconds();  // time reading data is not training time
    step_ = epoch_step + (b - first) / workers;
    if (trace_) trace_->tracer()->at_step(step_);
    const int64_t counted = s.epoch_sums.samples;
    {
      TraceSpan span("step", "step");
      if (TraceArgs* args = span.args())
        args->num("step", static_cast<double>(step_)).num("batch", b);
      train_piece({batch.x, batch.y, nn::Context{true, config_.seed, step_, batch.first_sample},
                   1.0 / static_cast<double>(workers), true},
                  s.epoch_sums);
      stop = interrupted();
      if (stop) claims.set_claims({});  // this step claims nothing more
      engine_->step(lr_at(step_), config_.train.clip_norm, step_);
    }
    ++mine;
    const int64_t done = b;
    b = stop ? -1 : claims.claim();
    const double now = now_seconds(), dt = now - t0;
    s.train_seconds += dt;
    untaken_s_ += dt;
    ++untaken_steps_;
    s.train_samples += s.epoch_sums.samples - counted;
    progress_->tick(step_ + 1);
    // A line when rank 0's batch reaches the next multiple of train.log_every steps.
    if (!engine_->is_main() || step_ + 1 < next_log) continue;
    next_log = ((step_ + 1) / config_.train.log_every + 1) * config_.train.log_every;
    const double sps = static_cast<double>((done + 1 - window_first) * batch_rows_) /
                       std::max(1e-9, now - window_start);
    progress_->train_line({s.epoch, step_ + 1, mean_of(s.epoch_sums),
                           mean_of(minus(s.epoch_sums, window_sums)), lr_at(step_), sps});
    window_sums = s.epoch_sums;
    window_start = now;
    window_first = done + 1;
  }
  // Traced or not alike on every worker: as the range's last step.
  if (trace_)
    trace_->tracer()->at_step((batches_done_ + limit - first + workers - 1) / workers - 1);
  // Collective: every worker's batches (each claimed batch was trained), and whether to stop.
  double v[2] = {static_cast<double>(mine), stop ? 1.0 : 0.0};
  engine_->sum(v, 2);
  const int64_t trained = static_cast<int64_t>(v[0]);
  if (v[1] == 0 && first + trained != limit)
    throw Error(str("trainer: the workers trained ", trained, " batches of epoch ", s.epoch + 1,
                    "'s range [", first, ", ", limit, ") (this is a bug)"));
  s.batch_in_epoch = first + trained;
  batches_done_ += trained;
  step_ = (batches_done_ + workers - 1) / workers;  // a partial step counts, as a short batch does
  return v[1] > 0 || cut;
}

}  // namespace tessel::train
