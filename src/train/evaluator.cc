#include "tessel/train/evaluator.h"

#include <algorithm>
#include <cstring>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/model_weights.h"
#include "tessel/data/loader.h"
#include "tessel/nn/models.h"

namespace tessel::train {

EvalResult mean_of(const EvalResult& sums) {
  EvalResult r = sums;
  if (sums.samples > 0) {
    r.loss = sums.loss / static_cast<double>(sums.samples);
    r.accuracy = sums.accuracy / static_cast<double>(sums.samples);
  }
  return r;
}

EvalResult evaluate(const data::Dataset& dataset, const EvalPass& pass,
                    const std::function<parallel::PieceStats(const parallel::Piece&)>& run,
                    const std::function<void(double*, int)>& sum) {
  data::LoaderOptions lo;
  lo.batch = pass.batch;
  lo.shuffle = false;
  lo.prefetch = pass.prefetch;
  lo.slice_rank = pass.slice_rank;
  lo.slice_count = pass.slice_count;
  // A non-owning shared_ptr: the dataset outlives this call.
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](const auto*) {}), lo);
  loader.start_epoch(0);
  double sums[3] = {0, 0, 0};  // loss x rows, correct rows, rows (as an EvalResult's sums)
  data::Batch batch;
  while (loader.next(batch)) {
    // Every rank runs every batch, an empty slice included (it may take part in collectives).
    const parallel::PieceStats r =
        run({batch.x, batch.y, nn::Context{false, pass.seed, pass.step, batch.first_sample}});
    sums[0] += r.loss_sum;
    sums[1] += r.correct;
    sums[2] += static_cast<double>(r.rows);
  }
  sum(sums, 3);
  return mean_of({sums[0], sums[1], static_cast<int64_t>(sums[2])});
}

Evaluator::Evaluator(const Config& config, const std::string& checkpoint) : config_(config) {
  const ckpt::CheckpointReader reader(checkpoint);
  data::DataSpec data = config_.data;  // text: read with the token ids the model was trained with
  data.tokenizer = reader.manifest().tokenizer;
  data_ = data::make_datasets(data);
  nn::ModelSpec spec = config_.model;
  spec.input_shape = data_.train->input_shape();
  spec.num_classes = data_.train->num_classes();
  spec.task = data_.train->task();
  model_ = nn::build_model(spec);
  loss_ = nn::make_loss(spec);
  model_->materialize(config_.seed);
  ckpt::load_weights(reader, *model_);
}

Evaluator::~Evaluator() = default;

EvalResult Evaluator::evaluate(const data::Dataset& dataset, comm::Communicator* world) {
  EvalPass pass;
  pass.batch = config_.train.batch;
  pass.seed = config_.seed;
  if (world != nullptr) {
    pass.slice_rank = world->rank();
    pass.slice_count = world->size();
  }
  return train::evaluate(
      dataset, pass,
      [&](const parallel::Piece& p) -> parallel::PieceStats {
        const int64_t rows = p.y.dim(0);
        if (rows == 0) return {};
        const nn::LossValue v = loss_->forward(model_->forward(p.x, p.ctx, nullptr), p.y);
        return {static_cast<double>(v.mean) * rows,
                static_cast<double>(v.correct) * rows / static_cast<double>(v.positions), rows};
      },
      [world](double* v, int n) {
        if (world != nullptr) world->allreduce(v, static_cast<size_t>(n), comm::ElemType::kF64);
      });
}

Tensor Evaluator::outputs(const data::Dataset& dataset, int64_t limit) {
  limit = std::min(limit, dataset.size());
  data::LoaderOptions lo;
  lo.batch = config_.train.batch;
  lo.shuffle = false;
  lo.prefetch = 0;
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](const auto*) {}), lo);
  loader.start_epoch(0);
  Tensor out;
  int64_t done = 0;
  data::Batch batch;
  while (done < limit && loader.next(batch)) {
    const Tensor y =
        model_->forward(batch.x, nn::Context{false, config_.seed, 0, batch.first_sample}, nullptr);
    if (!out.defined()) {
      Shape s = y.shape();
      s[0] = limit;
      out = Tensor::empty(s);
    }
    const int64_t rows = std::min(y.dim(0), limit - done), row = y.numel() / y.dim(0);
    std::memcpy(out.data<float>() + done * row, y.data<float>(),
                static_cast<size_t>(rows * row) * sizeof(float));
    done += rows;
  }
  return out;
}

}  // namespace tessel::train
