#include "tessel/parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/nn/layers.h"
#include "tessel/optim/schedule.h"

namespace tessel::parallel {

namespace {

constexpr int kHeaderWords = 8;  // dtype, ndim, up to 6 dimensions
constexpr int kValueTag = 1;     // the tied table's values after a step
constexpr int kGatherTag = 2;    // consolidate()

uint64_t fnv(uint64_t h, int64_t v) { return (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; }

}  // namespace

struct Pipeline::Link {
  comm::Communicator comm;  // the two ranks of this path: sender and receiver
  int peer = 0;             // the other end's rank in comm
  int peer_stage = 0;
  bool first = true;  // the first message carries a header with dtype and shape
  DType dtype = DType::kF32;
  Shape tail;  // dimensions after the rows, learned from the header
};

struct Pipeline::Inflight {
  std::vector<nn::Module*> slot;
  Shape out_shape;  // the activation sent on, whose gradient comes back
  Tensor dlogits;   // last chunk: the loss gradient, computed right after the forward
  double bytes = 0;
};

Pipeline::Pipeline(const ParallelSpec& spec, comm::Communicator& world, nn::Model& model)
    : Strategy(model, spec), world_(world), layout_(Layout::resolve(spec, world.size())) {
  if (spec_.deterministic && spec_.pp_microbatches > 1)
    throw InvalidArgument(
        str("config: train.deterministic runs each ddp.micro_shard micro-shard "
            "through the pipeline as one micro-batch, got pp.microbatches = ",
            spec_.pp_microbatches, "; set pp.microbatches = 1 or train.deterministic = false"));
  stage_ = layout_.stage(world_.rank());
  // Everything that can be wrong with the config is checked before the first collective, on
  // every rank alike (each holds the whole model).
  part_ = make_partition(spec_, model_, layout_.pp);
  for (size_t i = 0; i < model_.num_blocks(); ++i)
    if (!model_.block(i).clone())
      throw InvalidArgument(str("pipeline: block '", model_.block_name(i), "' (",
                                model_.block(i).kind(), ") cannot be cloned, but a stage keeps ",
                                "one copy per micro-batch in flight; implement Module::clone()"));
  find_tied_table();
  schedule_for(static_cast<int>(spec_.pp_microbatches), true);  // a bad schedule fails here
  schedule_for(static_cast<int>(spec_.pp_microbatches), false);
  groups_ = std::make_unique<Groups>(world_, layout_);
  for (int c = 0; c < static_cast<int>(part_.chunks()); ++c) {
    if (part_.stage[c] != stage_) continue;
    my_chunks_.push_back(c);
    // Slot 0 of every chunk is the model's own modules; more are cloned on demand.
    std::vector<nn::Module*> slot;
    for (size_t i = part_.begin[c]; i < part_.begin[c + 1]; ++i) slot.push_back(&model_.block(i));
    free_[c].push_back(slot);
  }
  owned_ = ranges_of_stage(stage_);
  build_links();
  // Deterministic mode uses the whole model's buckets, as DataParallel does, so that the
  // quantisation scales, and so the bits, equal a single worker's.
  if (spec_.deterministic) exact_.emplace(make_buckets(model_, spec_.bucket_mb));
}

Pipeline::~Pipeline() {
  for (Pending& p : pending_) {
    try {
      p.work.wait();
    } catch (...) {  // the group failed; the error was reported where it happened
    }
  }
}

void Pipeline::find_tied_table() {
  auto chunk_of = [&](size_t block) {
    int c = 0;
    while (part_.begin[c + 1] <= block) ++c;
    return c;
  };
  // A tied LM head borrows the embedding's table: find the block that owns it.
  const auto& params = model_.parameters();
  for (size_t i = 0; i < model_.num_blocks(); ++i) {
    auto* head = dynamic_cast<nn::LmHead*>(&model_.block(i));
    if (!head) continue;
    auto it = std::find(params.begin(), params.end(), head->token_table());
    TESSEL_CHECK(it != params.end(), "pipeline: the LM head's table is not a model parameter");
    const size_t k = static_cast<size_t>(it - params.begin());
    for (size_t b = 0; b < model_.num_blocks(); ++b) {
      auto [first, last] = model_.block_parameters(b);
      if (k >= first && k < last && part_.stage[chunk_of(b)] != part_.stage[chunk_of(i)]) {
        tied_from_ = chunk_of(i);
        tied_to_ = chunk_of(b);
        tied_grad_ = (*it)->grad;
        tied_value_ = (*it)->value;
      }
    }
  }
}

void Pipeline::build_links() {
  // One two-rank communicator per boundary and direction: a rank's sends on a link queue on
  // that link's progress thread and never hold up its receives on another link.
  comm::Communicator& pp = groups_->pp;
  auto make = [&](int from, int to, int color) {
    const bool mine = stage_ == from || stage_ == to;
    auto link = std::make_unique<Link>();
    link->comm = pp.split(mine ? color : -1, stage_ == from ? 0 : 1);
    if (!mine) return std::unique_ptr<Link>();
    link->peer = 1 - link->comm.rank();
    link->peer_stage = stage_ == from ? to : from;
    return link;
  };
  const int C = static_cast<int>(part_.chunks());
  for (int c = 0; c + 1 < C; ++c) {
    fwd_.push_back(make(part_.stage[c], part_.stage[c + 1], c));
    bwd_.push_back(make(part_.stage[c + 1], part_.stage[c], c));
  }
  if (tied_from_ >= 0) tied_ = make(part_.stage[tied_from_], part_.stage[tied_to_], 0);
}

Ranges Pipeline::ranges_of_stage(int stage) const {
  Ranges r;
  const auto& entries = model_.params().entries();
  for (size_t c = 0; c < part_.chunks(); ++c) {
    if (part_.stage[c] != stage) continue;
    size_t first = model_.block_parameters(part_.begin[c]).first;
    size_t last = model_.block_parameters(part_.begin[c + 1] - 1).second;
    if (first == last) continue;
    const int64_t lo = entries[first].offset;
    const int64_t hi = entries[last - 1].offset + shape_numel(entries[last - 1].shape);
    if (!r.empty() && r.back().second == lo)
      r.back().second = hi;
    else
      r.emplace_back(lo, hi);
  }
  return r;
}

const std::vector<std::vector<Task>>& Pipeline::schedule_for(int micro, bool training) {
  auto key = std::make_pair(micro, training);
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  auto s = make_schedule(part_, layout_.pp, micro, training ? spec_.pp_schedule : "forward");
  check_schedule(part_, s, micro, training ? tied_from_ : -1, tied_to_);
  return schedules_[key] = std::move(s);
}

void Pipeline::on_start() {
  // Every stage of a pipeline must run the same schedule (same config), and the replicas of a
  // stage must start from the same parameters.
  const auto& sched = schedule_for(static_cast<int>(spec_.pp_microbatches), true);
  uint64_t h = fnv(1469598103934665603ull, static_cast<int64_t>(part_.chunks()));
  for (size_t c = 0; c <= part_.chunks(); ++c) h = fnv(h, static_cast<int64_t>(part_.begin[c]));
  for (const auto& order : sched)
    for (const Task& t : order) h = fnv(fnv(fnv(h, static_cast<int>(t.op)), t.chunk), t.micro);
  std::vector<int64_t> all(static_cast<size_t>(layout_.pp));
  const int64_t mine = static_cast<int64_t>(h >> 1);
  groups_->pp.allgather(&mine, all.data(), 1, comm::ElemType::kI64);
  for (int s = 0; s < layout_.pp; ++s)
    if (all[s] != all[0])
      throw Error(str("pipeline: stage ", s, " of replica ", layout_.replica(rank()),
                      " computed a different partition or schedule than stage 0; every rank must "
                      "run the same config"));
  check_replicas(0);
}

void Pipeline::check_replicas(int64_t step) {
  if (layout_.dp == 1) return;
  uint64_t p = 1469598103934665603ull;
  const float* v = model_.params().flat().data<float>();
  for (auto [lo, hi] : owned_)
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t bits;
      std::memcpy(&bits, v + i, 4);
      p = fnv(p, bits);
    }
  std::vector<int64_t> sums(static_cast<size_t>(layout_.dp));
  const int64_t mine = static_cast<int64_t>(p >> 1);
  groups_->dp.allgather(&mine, sums.data(), 1, comm::ElemType::kI64);
  for (int r = 1; r < layout_.dp; ++r)
    if (sums[r] != sums[0])
      throw Error(str("pipeline: at step ", step, " stage ", stage_, " of replica ", r,
                      " holds other parameters than replica 0; every rank must start from the "
                      "same seed and checkpoint (this is a bug if they did)"));
}

std::vector<nn::Module*> Pipeline::acquire(int chunk) {
  auto& free = free_[chunk];
  if (free.empty()) {
    const double t0 = now_seconds();
    std::vector<std::unique_ptr<nn::Module>> copy;
    std::vector<nn::Module*> slot;
    for (size_t i = part_.begin[chunk]; i < part_.begin[chunk + 1]; ++i) {
      copy.push_back(model_.block(i).clone());
      slot.push_back(copy.back().get());
    }
    clones_[chunk].push_back(std::move(copy));
    free.push_back(slot);
    clone_s_ += now_seconds() - t0;
  }
  std::vector<nn::Module*> slot = free.back();
  free.pop_back();
  return slot;
}

void Pipeline::release(int chunk, const std::vector<nn::Module*>& slot) {
  free_[chunk].push_back(slot);
}

void Pipeline::send(Link& link, const Tensor& t) {
  const double t0 = now_seconds();
  Pending p;
  p.keep = t.clone();  // the module may overwrite its buffer before the receiver copies it
  if (link.first) {
    TESSEL_CHECK(t.ndim() >= 1 && t.ndim() <= kHeaderWords - 2, "pipeline: cannot send a ",
                 t.ndim(), "-d tensor");
    auto h = std::make_shared<std::vector<int64_t>>(kHeaderWords, 0);
    (*h)[0] = static_cast<int64_t>(t.dtype());
    (*h)[1] = t.ndim();
    for (int i = 0; i < t.ndim(); ++i) (*h)[2 + i] = t.dim(i);
    pending_.push_back(
        {link.comm.isend(h->data(), kHeaderWords, comm::ElemType::kI64, link.peer), Tensor(), h});
    link.first = false;
  }
  p.work = link.comm.isend(p.keep.raw(), static_cast<size_t>(p.keep.numel()),
                           comm::elem_type(p.keep.dtype()), link.peer);
  sent_bytes_ += static_cast<double>(p.keep.nbytes());
  pending_.push_back(std::move(p));
  // Drop finished sends so that the list stays short.
  auto finished = [](const Pending& q) {
    if (!q.work.done()) return false;
    q.work.wait();  // rethrows a failed send
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), finished), pending_.end());
  send_s_ += now_seconds() - t0;
}

Tensor Pipeline::recv(Link& link, int64_t rows, const Shape* expect, const std::string& what) {
  const double t0 = now_seconds();
  if (link.first) {
    std::vector<int64_t> h(kHeaderWords);
    link.comm.recv(h.data(), kHeaderWords, comm::ElemType::kI64, link.peer);
    if (h[0] < 0 || h[0] > static_cast<int64_t>(DType::kU8) || h[1] < 1 || h[1] > kHeaderWords - 2)
      throw Error(str("pipeline: stage ", stage_, " got a malformed header for the ", what,
                      " from stage ", link.peer_stage, " (dtype ", h[0], ", ", h[1], " dims)"));
    const DType dtype = static_cast<DType>(h[0]);
    Shape got(h.begin() + 2, h.begin() + 2 + h[1]);
    Shape want = expect ? *expect : got;
    if (!expect) want[0] = rows;
    if (got != want || (expect && dtype != DType::kF32))
      throw Error(str("pipeline: stage ", stage_, " expected the ", what, " from stage ",
                      link.peer_stage, " as ", expect ? "f32 " : "", shape_str(want), ", got ",
                      dtype_name(dtype), " ", shape_str(got),
                      "; the stages disagree on the model or the micro-batch size"));
    link.dtype = dtype;
    link.tail.assign(got.begin() + 1, got.end());
    link.first = false;
  }
  Shape shape = {rows};
  shape.insert(shape.end(), link.tail.begin(), link.tail.end());
  Tensor t = Tensor::empty(shape, link.dtype);
  link.comm.recv(t.raw(), static_cast<size_t>(t.numel()), comm::elem_type(link.dtype), link.peer);
  if (expect && *expect != shape)
    throw Error(str("pipeline: stage ", stage_, " expected the ", what, " from stage ",
                    link.peer_stage, " as ", shape_str(*expect), ", got ", shape_str(shape)));
  recv_s_ += now_seconds() - t0;
  return t;
}

void Pipeline::wait_sends() {
  const double t0 = now_seconds();
  for (Pending& p : pending_) p.work.wait();
  pending_.clear();
  send_s_ += now_seconds() - t0;
}

PieceResult Pipeline::train_piece(const Piece& piece, nn::CrossEntropyLoss& loss) {
  return run(piece, loss, true);
}

PieceResult Pipeline::eval_piece(const Piece& piece, nn::CrossEntropyLoss& loss) {
  return run(piece, loss, false);
}

PieceResult Pipeline::run(const Piece& piece, nn::CrossEntropyLoss& loss, bool training) {
  const int64_t rows = piece.y.dim(0);
  const int64_t m_spec = spec_.pp_microbatches;
  if (training && !checked_rows_) {  // the first piece is a full batch slice
    checked_rows_ = true;
    if (rows % m_spec != 0)
      throw InvalidArgument(str("config: pp.microbatches = ", m_spec, " does not divide the ", rows,
                                " rows of each replica's batch (train.batch / dp",
                                spec_.deterministic ? ", or ddp.micro_shard" : "",
                                "); pick a divisor of ", rows, " or change train.batch"));
  }
  // A short last batch may not divide evenly: the first micro-batches get one row more.
  const int m = static_cast<int>(std::min<int64_t>(m_spec, std::max<int64_t>(rows, 1)));
  micro_rows_.assign(m, rows / m);
  micro_first_.assign(m, 0);
  for (int j = 0; j < m; ++j) {
    if (j < rows % m) ++micro_rows_[j];
    if (j > 0) micro_first_[j] = micro_first_[j - 1] + micro_rows_[j - 1];
  }
  piece_rows_ = rows;
  piece_weight_ = piece.weight;
  const auto& order = schedule_for(m, training)[stage_];
  PieceResult result;
  if (training) {
    // Line the stages up so that each stage's idle time is the schedule's, not the skew left
    // by the previous step.
    const double b0 = now_seconds();
    groups_->pp.barrier();
    recv_s_ += now_seconds() - b0;
    trace_.clear();
  }
  t0_ = now_seconds();
  for (const Task& t : order) {
    if (t.op == TaskOp::kForward)
      forward_task(t, piece, loss, training, result);
    else
      backward_task(t);
    if (training) trace_.push_back({t.op, t.chunk, t.micro, task_start_ - t0_, task_end_ - t0_});
  }
  wait_sends();
  if (training) {
    // A stage that finishes early idles until the last one is done: the drain is bubble too.
    groups_->pp.barrier();
    span_s_ += now_seconds() - t0_;
    TESSEL_CHECK(inflight_.empty(), "pipeline: ", inflight_.size(),
                 " micro-batches still in flight after the schedule");
  }
  return result;
}

void Pipeline::forward_task(const Task& t, const Piece& piece, nn::CrossEntropyLoss& loss,
                            bool training, PieceResult& result) {
  const int c = t.chunk, j = t.micro;
  const int C = static_cast<int>(part_.chunks());
  const int64_t rows = micro_rows_[j];
  Tensor x;
  if (c == 0) {
    Shape s = piece.x.shape();
    s[0] = rows;
    x = piece.x.view(micro_first_[j] * (piece.x.numel() / piece.x.dim(0)), s);
  } else {
    x = recv(*fwd_[c - 1], rows, nullptr, "activation");
  }
  const double t0 = task_start_ = now_seconds();
  nn::Context ctx = piece.ctx;
  ctx.first_sample += micro_first_[j];  // dropout masks follow the global sample index
  // Evaluation keeps nothing for a backward: the model's own modules serve every micro-batch.
  std::vector<nn::Module*> slot = training ? acquire(c) : free_[c].front();
  Tensor h = x;
  double bytes = static_cast<double>(x.nbytes());
  for (nn::Module* mod : slot) {
    h = mod->forward(h, ctx);
    bytes += static_cast<double>(h.nbytes());
  }
  Inflight fl;
  if (c + 1 == C) {
    Shape ys = piece.y.shape();
    ys[0] = rows;
    const Tensor y = piece.y.view(micro_first_[j] * (piece.y.numel() / piece.y.dim(0)), ys);
    const float l = loss.forward(h, y);
    if (training) check_loss(l, piece.ctx.step);
    result.loss_sum += static_cast<double>(l) * rows;
    result.correct += static_cast<double>(loss.correct()) * rows / loss.count();
    result.rows += rows;
    if (training) {  // this micro-batch's share of the piece's loss gradient
      fl.dlogits = loss.backward(static_cast<float>(piece_weight_ * rows / piece_rows_)).clone();
      bytes += static_cast<double>(fl.dlogits.nbytes());
    }
  }
  task_end_ = now_seconds();
  forward_s_ += task_end_ - t0;
  if (c + 1 < C) send(*fwd_[c], h);
  if (!training) return;
  fl.slot = std::move(slot);
  fl.out_shape = h.shape();
  fl.bytes = bytes;
  inflight_[{c, j}] = std::move(fl);
  act_bytes_ += bytes;
  peak_act_bytes_ = std::max(peak_act_bytes_, act_bytes_);
  peak_inflight_ = std::max(peak_inflight_, static_cast<int>(inflight_.size()));
}

void Pipeline::backward_task(const Task& t) {
  const int c = t.chunk, j = t.micro;
  const int C = static_cast<int>(part_.chunks());
  auto it = inflight_.find({c, j});
  TESSEL_CHECK(it != inflight_.end(), "pipeline: backward of chunk ", c, " micro-batch ", j,
               " before its forward");
  Inflight& fl = it->second;
  Tensor dy = c + 1 == C ? fl.dlogits
                         : recv(*bwd_[c], micro_rows_[j], &fl.out_shape, "activation gradient");
  if (c == tied_to_ && tied_) {  // the LM head's share of the table gradient comes first
    Tensor g = recv(*tied_, tied_grad_.dim(0), &tied_grad_.shape(), "tied-table gradient");
    float* dst = tied_grad_.data<float>();
    const float* src = g.data<float>();
    for (int64_t i = 0; i < g.numel(); ++i) dst[i] += src[i];
  }
  const double t0 = task_start_ = now_seconds();
  Tensor g = dy;
  for (size_t k = fl.slot.size(); k-- > 0;) g = fl.slot[k]->backward(g);
  task_end_ = now_seconds();
  backward_s_ += task_end_ - t0;
  if (c == tied_from_ && tied_) {
    send(*tied_, tied_grad_);
    tied_grad_.zero_();
  }
  if (c > 0) send(*bwd_[c - 1], g);
  release(c, fl.slot);
  act_bytes_ -= fl.bytes;
  inflight_.erase(it);
}

void Pipeline::collect_shard() { exact_->collect(model_.grads().flat()); }

void Pipeline::step(optim::Optimizer& opt, float lr, float clip_norm, int64_t step) {
  const double t0 = now_seconds();
  float* g = model_.grads().flat().data<float>();
  if (spec_.deterministic) {
    // Scales agreed over every rank (a bucket may span stages); integers summed over the dp
    // group, on the owned ranges only.
    Tensor grads = model_.grads().flat();
    exact_->reduce(grads, &groups_->workers, layout_.dp > 1 ? &groups_->dp : nullptr, owned_);
  } else if (layout_.dp > 1) {
    for (auto [lo, hi] : owned_)
      groups_->dp.allreduce(g + lo, static_cast<size_t>(hi - lo), comm::ElemType::kF32);
  }
  // The global norm: each element is owned by one stage, and the dp replicas already agree.
  double sq = 0;
  if (clip_norm > 0) {
    for (auto [lo, hi] : owned_) sq += optim::sum_squares(g + lo, hi - lo);
    groups_->pp.allreduce(&sq, 1, comm::ElemType::kF64);
  }
  reduce_s_ += now_seconds() - t0;
  // One optimizer step over several ranges (round_robin): AdamW counts calls.
  const int64_t steps = opt.steps();
  for (auto [lo, hi] : owned_) {
    opt.set_steps(steps);
    update(opt, lr, clip_norm, lo, hi, [sq](double* s) { *s = sq; });
  }
  if (owned_.empty()) opt.set_steps(steps + 1);
  if (tied_) {  // the head's copy of the table follows the embedding's update
    const double t1 = now_seconds();
    if (stage_ == part_.stage[tied_to_])
      tied_->comm.send(tied_value_.raw(), static_cast<size_t>(tied_value_.numel()),
                       comm::ElemType::kF32, tied_->peer, kValueTag);
    else
      tied_->comm.recv(tied_value_.raw(), static_cast<size_t>(tied_value_.numel()),
                       comm::ElemType::kF32, tied_->peer, kValueTag);
    reduce_s_ += now_seconds() - t1;
  }
  if (spec_.check_every > 0 && (step + 1) % spec_.check_every == 0) check_replicas(step + 1);
}

void Pipeline::consolidate(optim::Optimizer& opt) {
  if (layout_.replica(rank()) != 0) return;  // replica 0 holds every stage
  comm::Communicator& pp = groups_->pp;
  float* params = model_.params().flat().data<float>();
  auto state = opt.state();
  const int64_t n = model_.params().numel();
  for (int s = 1; s < layout_.pp; ++s) {
    if (stage_ != 0 && stage_ != s) continue;
    for (auto [lo, hi] : ranges_of_stage(s)) {
      std::vector<float*> bufs = {params + lo};
      for (auto& [name, t] : state)
        if (t.numel() == n) bufs.push_back(t.data<float>() + lo);
      for (float* b : bufs) {
        if (stage_ == 0)
          pp.recv(b, static_cast<size_t>(hi - lo), comm::ElemType::kF32, s, kGatherTag);
        else
          pp.send(b, static_cast<size_t>(hi - lo), comm::ElemType::kF32, 0, kGatherTag);
      }
    }
  }
}

void Pipeline::sum(double* values, int n) {
  groups_->workers.allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64);
}

void Pipeline::max(double* values, int n) {
  groups_->workers.allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64,
                             comm::ReduceOp::kMax);
}

std::vector<double> Pipeline::gather(double value) {
  std::vector<double> all(static_cast<size_t>(groups_->workers.size()));
  groups_->workers.allgather(&value, all.data(), 1, comm::ElemType::kF64);
  return all;
}

nlohmann::json Pipeline::take_metrics() {
  // Per rank: the figures every rank reports, gathered so that every rank returns the same.
  std::vector<double> mine = {static_cast<double>(stage_),
                              forward_s_,
                              backward_s_,
                              send_s_,
                              recv_s_,
                              span_s_,
                              peak_act_bytes_,
                              static_cast<double>(peak_inflight_),
                              reduce_s_,
                              sent_bytes_,
                              clone_s_};
  const size_t k = mine.size();
  std::vector<double> all(k * static_cast<size_t>(groups_->workers.size()));
  groups_->workers.allgather(mine.data(), all.data(), k, comm::ElemType::kF64);
  nlohmann::json stages = nlohmann::json::array();
  double bubble_sum = 0;
  for (int r = 0; r < groups_->workers.size(); ++r) {
    const double* v = all.data() + k * r;
    const double bubble = v[5] > 0 ? std::max(0.0, 1.0 - (v[1] + v[2]) / v[5]) : 0.0;
    bubble_sum += bubble;
    stages.push_back({{"rank", r},
                      {"stage", static_cast<int>(v[0])},
                      {"replica", layout_.replica(r)},
                      {"forward_seconds", v[1]},
                      {"backward_seconds", v[2]},
                      {"send_seconds", v[3]},
                      {"recv_wait_seconds", v[4]},
                      {"idle_seconds", std::max(0.0, v[5] - v[1] - v[2])},
                      {"schedule_seconds", v[5]},
                      {"bubble_fraction", bubble},
                      {"peak_activation_bytes", v[6]},
                      {"peak_inflight_microbatches", static_cast<int>(v[7])},
                      {"grad_reduce_seconds", v[8]},
                      {"sent_bytes", v[9]},
                      {"clone_seconds", v[10]}});
  }
  const double P = layout_.pp, m = static_cast<double>(spec_.pp_microbatches);
  std::vector<std::vector<std::string>> blocks(static_cast<size_t>(layout_.pp));
  for (size_t c = 0; c < part_.chunks(); ++c)
    for (size_t i = part_.begin[c]; i < part_.begin[c + 1]; ++i)
      blocks[part_.stage[c]].push_back(model_.block_name(i));
  nlohmann::json out = {{"comm_exposed_seconds", send_s_ + recv_s_ + reduce_s_},
                        {"comm_overlapped_seconds", 0.0},
                        {"optimizer_seconds", optimizer_seconds_},
                        {"pipeline_schedule", spec_.pp_schedule},
                        {"pipeline_microbatches", spec_.pp_microbatches},
                        {"pipeline_partition", spec_.pp_cuts.empty() ? spec_.pp_partition : "cuts"},
                        {"pipeline_stage_blocks", blocks},
                        {"pipeline_bubble_fraction_model", (P - 1) / (m + P - 1)},
                        {"pipeline_bubble_fraction_measured", bubble_sum / groups_->workers.size()},
                        {"pipeline_stages", stages}};
  forward_s_ = backward_s_ = send_s_ = recv_s_ = span_s_ = reduce_s_ = clone_s_ = 0;
  sent_bytes_ = optimizer_seconds_ = peak_act_bytes_ = 0;
  peak_inflight_ = 0;
  return out;
}

}  // namespace tessel::parallel
