#include "tessel/parallel/strategy.h"

#include <cmath>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/optim/schedule.h"
#include "tessel/parallel/data_parallel.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/parallel/parameter_server.h"

namespace tessel::parallel {

nlohmann::json Strategy::serve(optim::Optimizer&, const std::function<float(int64_t)>&) {
  throw Error(str("parallel: rank ", rank(), " of layout ", layout(), " is not a server"));
}

void Strategy::check_loss(double loss, int64_t step) {
  if (!std::isfinite(loss))
    throw Error(str("train: loss is ", loss, " at step ", step,
                    "; lower optim.lr or set train.clip_norm"));
}

PieceResult Strategy::forward_loss(const Piece& piece, nn::CrossEntropyLoss& loss) {
  const float l = loss.forward(model_.forward(piece.x, piece.ctx), piece.y);
  const int64_t rows = piece.y.dim(0);
  return {static_cast<double>(l) * rows,
          static_cast<double>(loss.correct()) * rows / loss.count(), rows};
}

PieceResult Strategy::train_piece(const Piece& piece, nn::CrossEntropyLoss& loss) {
  const PieceResult r = forward_loss(piece, loss);
  check_loss(r.rows > 0 ? r.loss_sum / static_cast<double>(r.rows) : 0.0, piece.ctx.step);
  begin_backward(piece.sync);
  model_.backward(loss.backward(static_cast<float>(piece.weight)),
                  [this](size_t block) { after_block_backward(block); });
  return r;
}

PieceResult Strategy::eval_piece(const Piece& piece, nn::CrossEntropyLoss& loss) {
  return forward_loss(piece, loss);
}

void Strategy::consolidate(optim::Optimizer&) {}

void Strategy::update(optim::Optimizer& opt, float lr, float clip_norm, int64_t lo, int64_t hi,
                      const std::function<void(double*)>& sum_norm) {
  const double t0 = now_seconds();
  Tensor grads = model_.grads().flat();
  if (clip_norm > 0) {
    double sq = optim::sum_squares(grads.data<float>() + lo, hi - lo);
    if (sum_norm) sum_norm(&sq);
    optim::clip_scale(grads.data<float>() + lo, hi - lo, std::sqrt(sq), clip_norm);
  }
  Tensor params = model_.params().flat();
  opt.step(params, grads, lr, lo, hi);
  optimizer_seconds_ += now_seconds() - t0;
}

std::unique_ptr<Strategy> make_strategy(const ParallelSpec& spec, comm::Communicator* world,
                                        nn::Model& model) {
  const Layout layout = Layout::resolve(spec, world ? world->size() : 1);
  if (layout.servers > 0)
    return std::make_unique<ParameterServer>(spec, *world, layout, model);
  if (layout.pp > 1)
    return std::make_unique<Pipeline>(spec, *world, model);
  return std::make_unique<DataParallel>(spec, world, model);
}

}  // namespace tessel::parallel
