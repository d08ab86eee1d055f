// Evaluation: a forward-only pass over a whole dataset in order, each rank taking its
// contiguous slice of every batch, and the mean loss and accuracy over every sample. The
// Trainer evaluates through its engine at epoch ends; `tessel eval` evaluates a checkpoint in
// this one process with Evaluator: the model and its weights, no optimizer, no gradients, no
// activation caches.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/config/config.h"
#include "tessel/data/dataset.h"
#include "tessel/nn/model.h"
#include "tessel/parallel/executor.h"

namespace tessel::train {

struct EvalResult {
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

// a - b, field by field (sums since b was taken).
inline EvalResult minus(const EvalResult& a, const EvalResult& b) {
  return {a.loss - b.loss, a.accuracy - b.accuracy, a.samples - b.samples};
}
// Loss and accuracy sums (loss x samples, correct samples) turned into means.
EvalResult mean_of(const EvalResult& sums);

// Which slice of each batch this rank evaluates, and the facts of the pass.
struct EvalPass {
  int64_t batch = 128;
  int slice_rank = 0, slice_count = 1;
  int prefetch = 0;
  uint64_t seed = 0;
  int64_t step = 0;
};

// run: one piece's forward and loss on this rank; sum: adds n values over the ranks (a
// collective; identity for one rank). Returns the global means.
EvalResult evaluate(const data::Dataset& dataset, const EvalPass& pass,
                    const std::function<parallel::PieceStats(const parallel::Piece&)>& run,
                    const std::function<void(double*, int)>& sum);

class Evaluator {
 public:
  // The model of `config` (shapes from the dataset) with the weights of the checkpoint at
  // `checkpoint` (a run folder, checkpoints folder or step folder), whatever layout wrote it.
  Evaluator(const Config& config, const std::string& checkpoint);
  ~Evaluator();

  const data::Splits& datasets() const { return data_; }
  // world (may be null: this process alone): each of its ranks evaluates its slice of every
  // batch and the means are over all of them (collective), e.g. `tessel eval` under mpirun.
  EvalResult evaluate(const data::Dataset& dataset, comm::Communicator* world = nullptr);
  // The model's outputs for the first `limit` samples of the dataset, in order: [limit, ...].
  Tensor outputs(const data::Dataset& dataset, int64_t limit);
  std::string params_sha256() const { return model_->params_sha256(); }

 private:
  Config config_;
  data::Splits data_;
  std::unique_ptr<nn::Model> model_;
  std::unique_ptr<nn::Loss> loss_;  // cross-entropy, or the mean squared error (regression)
};

}  // namespace tessel::train
