#include "tessel/infer/replica.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "tessel/ckpt/model_weights.h"
#include "tessel/core/log.h"
#include "tessel/core/memory.h"
#include "tessel/data/dataset.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/pipeline.h"

namespace tessel::infer {
namespace {

// The executors hand the last stage's outputs to a Loss; this one keeps them. Its targets are
// the rows' indices within the piece (i32), so the micro-batches of a pipeline land in place.
class OutputSink final : public nn::Loss {
 public:
  explicit OutputSink(int64_t rows) : rows_(rows) {}
  nn::LossValue forward(const Tensor& output, const Tensor& targets) override {
    const int64_t n = targets.dim(0), row = output.numel() / std::max<int64_t>(output.dim(0), 1);
    if (!out_.defined()) {
      Shape s = output.shape();
      s[0] = rows_;
      out_ = Tensor::empty(s);
    }
    const int32_t* index = targets.data<int32_t>();
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(out_.data<float>() + index[r] * row, output.data<float>() + r * row,
                  static_cast<size_t>(row) * sizeof(float));
    return {0.0f, 0, 1};
  }
  Tensor backward(float) override {
    throw Error("infer: forward-only replicas have no loss gradient");
  }
  const Tensor& outputs() const { return out_; }

 private:
  int64_t rows_;
  Tensor out_;
};

}  // namespace

ModelInfo model_info(const train::Config& config, const std::string& checkpoint) {
  ModelInfo info;
  info.checkpoint = std::make_shared<const ckpt::CheckpointReader>(checkpoint);
  const ckpt::Manifest& m = info.checkpoint->manifest();
  info.spec = config.model;
  info.tokenizer = m.tokenizer;
  std::optional<ckpt::ModelIo> io = m.io;
  if (!io) {
    log_info("infer: ", info.checkpoint->dir(), " predates model_io in manifest.json (version 3); ",
             "loading the training data to learn the model's shapes (a newer checkpoint skips "
             "this)");
    data::DataSpec spec = config.data;  // text: the token ids the model was trained with
    spec.tokenizer = m.tokenizer;
    const data::Splits data = data::make_datasets(spec);
    const data::Dataset& train = *data.train;
    io = ckpt::ModelIo{train.input_shape(), train.input_dtype(), train.num_classes(),
                       data.input_mean,     data.input_std,      train.task(),
                       data.input_names,    data.target_names};
    info.tokenizer = data.tokenizer;
  }
  info.spec.input_shape = io->input_shape;
  info.spec.num_classes = io->num_classes;
  info.spec.task = io->task;
  info.input_dtype = io->input_dtype;
  info.input_mean = io->input_mean;
  info.input_std = io->input_std;
  info.input_names = io->input_names;
  info.target_names = io->target_names;
  return info;
}

Replica::Replica(const train::Config& config, const ModelInfo& info, comm::Communicator* pp,
                 comm::Communicator* tp)
    : config_(config),
      tp_(tp && tp->size() > 1 ? parallel::make_tensor_parallel(*tp, config.parallel.tp_sequence)
                               : nullptr),
      model_(nn::build_model(info.spec, tp_.get())),
      input_mean_(info.input_mean),
      input_std_(info.input_std) {
  if (pp != nullptr && pp->size() > 1) {
    parallel::ParallelSpec spec = config.parallel;
    spec.deterministic = false;  // a training setting; inference has no gradient sums
    executor_ = std::make_unique<parallel::PipelineExecutor>(spec, *pp, *model_);
    stage_ = pp->rank();
    stages_ = pp->size();
  } else {
    executor_ = std::make_unique<parallel::LocalExecutor>(*model_);
  }
  try {
    load(*info.checkpoint);
  } catch (const MemoryLimitError& e) {
    throw MemoryLimitError(str(e.what(),
                               ". Inference holds parameter values only: split them "
                               "over more ranks with pp.stages (now ",
                               stages_, ") or tp.size (now ", tp_ ? tp_->size() : 1,
                               ") and --workers or mpirun -np"));
  }
}

Replica::Replica(const train::Config& config, const ModelInfo& info, const Replica& weights)
    : config_(config),
      model_(nn::build_model(info.spec, nullptr)),
      executor_(std::make_unique<parallel::LocalExecutor>(*model_)),
      input_mean_(info.input_mean),
      input_std_(info.input_std),
      values_(weights.values_),
      ranges_(weights.ranges_) {
  TESSEL_CHECK(weights.stages_ == 1 && !weights.tp_,
               "infer: a replica shares the values of a whole-model replica only");
  for (size_t i = 0; i < values_.size(); ++i) model_->bind_values(ranges_[i], values_[i]);
  freeze(false);  // the values are `weights`', frozen already
}

Replica::~Replica() = default;

void Replica::load(const ckpt::CheckpointReader& checkpoint) {
  // One tensor per run of consecutive local blocks; a pipeline's head stage already holds its
  // copy of a tied table (bound by the executor), which the checkpoint fills too.
  const std::vector<bool>& local = executor_->local_blocks();
  const size_t n = model_->num_blocks();
  MemoryScope scope(MemCategory::kParameters);
  for (size_t b = 0; b < n;) {
    if (!local[b]) {
      ++b;
      continue;
    }
    nn::Range r{INT64_MAX, 0};  // the parameters of blocks [b, e); blocks without any add none
    size_t e = b;
    for (; e < n && local[e]; ++e) {
      const nn::Range br = model_->block_range(e);
      if (!br.empty()) r = {std::min(r.lo, br.lo), std::max(r.hi, br.hi)};
    }
    if (r.lo < r.hi) {
      values_.push_back(Tensor::zeros({r.size()}));
      ranges_.push_back(r);
      model_->bind_values(r, values_.back());
      parameter_bytes_ += static_cast<int64_t>(values_.back().nbytes());
    }
    b = e;
  }
  ckpt::load_weights(checkpoint, *model_);
  freeze(true);
}

void Replica::freeze(bool values_too) {
  for (size_t i = 0; i < model_->num_blocks(); ++i) model_->block(i).freeze(values_too);
}

Tensor Replica::forward(const Tensor& x, int64_t rows, int64_t first_row) {
  OutputSink sink(rows);
  const parallel::Hooks no_hooks = [](nn::Phase, size_t, bool) {};
  const int64_t batch = config_.infer.batch;
  const bool normalise = first_stage() && !input_mean_.empty();
  Tensor normalised;  // one batch of rows through the map the training rows went through
  for (int64_t lo = 0; lo < rows; lo += batch) {
    const int64_t n = std::min(batch, rows - lo);
    parallel::Piece piece;
    if (first_stage()) {
      Shape s = x.shape();
      s[0] = n;
      const int64_t row = x.numel() / x.dim(0);
      piece.x = x.view(lo * row, s);
      if (normalise) {
        if (!normalised.defined()) normalised = Tensor::empty({std::min(batch, rows) * row});
        // A mean and std per feature of the row (the manifest's check), row by row: without a
        // modulo per value the loop vectorises (it was 2% of a batched server's time).
        const float *in = piece.x.data<float>(), *mean = input_mean_.data(),
                    *std = input_std_.data();
        float* out = normalised.data<float>();
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < row; ++j) out[r * row + j] = (in[r * row + j] - mean[j]) / std[j];
        piece.x = normalised.view(0, s);
      }
    }
    piece.y = Tensor::empty({n}, DType::kI32);
    for (int64_t r = 0; r < n; ++r) piece.y.data<int32_t>()[r] = static_cast<int32_t>(lo + r);
    piece.ctx = nn::Context{false, config_.seed, 0, first_row + lo};
    executor_->eval(piece, sink, no_hooks);
  }
  return last_stage() ? sink.outputs() : Tensor();
}

nn::Model& Replica::model() {
  TESSEL_CHECK(stages_ == 1, "infer: the whole model is not on this rank (pp.stages = ", stages_,
               ")");
  return *model_;
}

}  // namespace tessel::infer
