#include "tessel/parallel/pipeline.h"

#include <algorithm>
#include <cstring>

#include "engine_device.h"
#include "offload.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/trace.h"
#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

constexpr int kValueTag = 1;  // the tied table's values after a step

// The first message on a link: what the tensors that follow look like.
struct TensorHeader {
  static constexpr int64_t kVersion = 1;
  static constexpr int kMaxDims = 6;
  int64_t version = kVersion;
  int64_t dtype = 0;
  int64_t ndim = 0;
  int64_t dims[kMaxDims] = {};
};
constexpr size_t kHeaderWords = sizeof(TensorHeader) / sizeof(int64_t);

uint64_t fnv(uint64_t h, int64_t v) { return (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; }

}  // namespace

struct PipelineExecutor::Link {
  comm::Communicator comm;  // the two ranks of this path: sender and receiver
  // On device ranks the tensors' path (over comm: NCCL, or staged through the host); the
  // headers still go over comm. Released (collective with the peer) before comm goes.
  std::unique_ptr<comm::DeviceCollectives> device;
  int peer = 0;  // the other end's rank in comm
  int peer_stage = 0;
  bool first = true;  // the first message carries a header with dtype and shape
  DType dtype = DType::kF32;
  Shape tail;  // dimensions after the rows, learned from the header

  ~Link() {
    if (device) release_device_collectives(*device);
  }
};

struct PipelineExecutor::Inflight {
  nn::Activations* acts = nullptr;
  Shape out_shape;  // the activation sent on, whose gradient comes back (of out_type)
  DType out_type = DType::kF32;
  Tensor dlogits;  // last chunk: the loss gradient, computed right after the forward
};

PipelineExecutor::PipelineExecutor(const ParallelSpec& spec, comm::Communicator& pp,
                                   nn::Model& model, DeviceLinks device_links)
    : spec_(spec),
      pp_(pp),
      model_(model),
      stage_(pp.rank()),
      stages_(pp.size()),
      split_(spec.pp_schedule == PpSchedule::kZbH1),
      device_links_(std::move(device_links)) {
  // Everything that can be wrong with the config is checked before the first message, on
  // every rank alike (each knows the whole model's structure).
  part_ = make_partition(spec_, model_, stages_);
  local_.assign(model_.num_blocks(), false);
  for (size_t c = 0; c < part_.chunks(); ++c)
    if (part_.stage[c] == stage_)
      for (size_t b = part_.begin[c]; b < part_.begin[c + 1]; ++b) local_[b] = true;
  find_tied_table();
  schedule_for(static_cast<int>(spec_.pp_microbatches), true);  // a bad schedule fails here
  schedule_for(static_cast<int>(spec_.pp_microbatches), false);
  model_.set_defer_weights(split_);
  build_links();
  if (offloads_activations(spec_.offload)) offload_ = std::make_unique<ActivationOffload>();
}

PipelineExecutor::~PipelineExecutor() {
  for (Pending& p : pending_) {
    try {
      p.work.wait();
      p.device_work.wait();
    } catch (...) {  // the group failed; the error was reported where it happened
    }
  }
  // Device links close with their peer: every rank in one order (boundaries, then the tie).
  for (size_t c = 0; c < fwd_.size(); ++c) {
    fwd_[c].reset();
    bwd_[c].reset();
  }
  tied_.reset();
}

void PipelineExecutor::find_tied_table() {
  auto chunk_of = [&](size_t block) {
    int c = 0;
    while (part_.begin[c + 1] <= block) ++c;
    return c;
  };
  // A block that reads another block's parameters (a tied LM head) on another stage.
  for (size_t i = 0; i < model_.num_blocks(); ++i)
    for (nn::Parameter* p : model_.borrowed(i)) {
      const auto& params = model_.parameters();
      const size_t k =
          static_cast<size_t>(std::find(params.begin(), params.end(), p) - params.begin());
      size_t owner = 0;
      while (model_.block_parameters(owner).second <= k) ++owner;
      if (part_.stage[chunk_of(owner)] == part_.stage[chunk_of(i)]) continue;
      if (tied_from_ >= 0)
        throw InvalidArgument(
            "pipeline: more than one parameter is shared across stages; "
            "put the blocks that share them on one stage (pp.cuts)");
      tied_from_ = chunk_of(i);
      tied_to_ = chunk_of(owner);
      tied_owner_ = owner;
      tied_param_ = p;
      tied_range_ = model_.param_range(k);
    }
  if (tied_from_ < 0 || part_.stage[tied_from_] != stage_) return;
  // The head's stage reads (in train.precision) and accumulates into a copy of the table.
  tied_value_ = flat_zeros(tied_range_.size(), MemCategory::kParameters, precision_type(spec_));
  tied_grad_ = flat_zeros(tied_range_.size(), MemCategory::kGradients);
  model_.bind_values(tied_range_, tied_value_);
  model_.bind_grads(tied_range_, tied_grad_);
}

void PipelineExecutor::build_links() {
  // One two-rank communicator per boundary and direction: a rank's sends on a link queue on
  // that link's progress thread and never hold up its receives on another link.
  auto make = [&](int from, int to, int color) {
    const bool mine = stage_ == from || stage_ == to;
    auto link = std::make_unique<Link>();
    link->comm = pp_.split(mine ? color : -1, stage_ == from ? 0 : 1);
    if (!mine) return std::unique_ptr<Link>();
    link->peer = 1 - link->comm.rank();
    link->peer_stage = stage_ == from ? to : from;
    if (device_links_) link->device = device_links_(link->comm, &device_comm_);
    return link;
  };
  const int C = static_cast<int>(part_.chunks());
  for (int c = 0; c + 1 < C; ++c) {
    fwd_.push_back(make(part_.stage[c], part_.stage[c + 1], c));
    bwd_.push_back(make(part_.stage[c + 1], part_.stage[c], c));
  }
  if (tied_from_ >= 0) tied_ = make(part_.stage[tied_from_], part_.stage[tied_to_], 0);
}

const std::vector<std::vector<Task>>& PipelineExecutor::schedule_for(int micro, bool training) {
  auto key = std::make_pair(micro, training);
  auto it = schedules_.find(key);
  if (it != schedules_.end()) return it->second;
  auto s = training ? make_schedule(part_, stages_, micro, spec_.pp_schedule)
                    : forward_schedule(part_, stages_, micro);
  check_schedule(
      part_, s, micro, training ? tied_from_ : -1, tied_to_,
      training ? inflight_bound(part_, stages_, micro, spec_.pp_schedule) : std::vector<int>());
  return schedules_[key] = std::move(s);
}

void PipelineExecutor::start(ParamStore& store) {
  // Every stage of a pipeline must run the same schedule (same config).
  const auto& sched = schedule_for(static_cast<int>(spec_.pp_microbatches), true);
  uint64_t h = fnv(1469598103934665603ull, static_cast<int64_t>(part_.chunks()));
  for (size_t c = 0; c <= part_.chunks(); ++c) h = fnv(h, static_cast<int64_t>(part_.begin[c]));
  for (const auto& order : sched)
    for (const Task& t : order) h = fnv(fnv(fnv(h, static_cast<int>(t.op)), t.chunk), t.micro);
  std::vector<int64_t> all(static_cast<size_t>(stages_));
  const int64_t mine = static_cast<int64_t>(h >> 1);
  pp_.allgather(&mine, all.data(), 1, comm::ElemType::kI64);
  for (int s = 0; s < stages_; ++s)
    if (all[s] != all[0])
      throw Error(str("pipeline: stage ", s,
                      " computed a different partition or schedule than "
                      "stage 0; every rank must run the same config"));
  sync_tied_table(store);
}

void PipelineExecutor::sync_tied_table(ParamStore& store) {
  if (!tied_) return;
  const size_t n = static_cast<size_t>(tied_range_.size());
  if (stage_ == part_.stage[tied_to_]) {
    std::vector<float> table(n);
    store.copy_values(tied_range_, table.data());
    tied_->comm.send(table.data(), n, comm::ElemType::kF32, tied_->peer, kValueTag);
  } else {  // in train.precision, on this rank's device
    const Tensor table = Tensor::empty({tied_range_.size()});
    tied_->comm.recv(table.raw(), n, comm::ElemType::kF32, tied_->peer, kValueTag);
    tied_value_.copy_from(table.to_device(tied_value_.device()).to(tied_value_.dtype()));
  }
}

nn::Activations* PipelineExecutor::acquire(int chunk) {
  auto& free = free_[chunk];
  if (free.empty()) {
    auto acts = std::make_unique<nn::Activations>();
    acts->recompute = spec_.recompute;
    acts->caches.resize(model_.num_blocks());
    nn::Activations& scratch = scratch_[chunk];
    if (scratch.caches.empty()) scratch.caches.resize(model_.num_blocks());
    for (size_t b = 0; b < acts->caches.size(); ++b)
      acts->caches[b].share_scratch(&scratch.caches[b]);
    free.push_back(acts.get());
    acts_[chunk].push_back(std::move(acts));
  }
  nn::Activations* a = free.back();
  free.pop_back();
  return a;
}

nn::Activations* PipelineExecutor::inflight_acts(int chunk, int micro) const {
  auto it = inflight_.find({chunk, micro});
  return it == inflight_.end() ? nullptr : it->second.acts;
}

void PipelineExecutor::send(Link& link, const Tensor& t) {
  const double t0 = now_seconds();
  MemoryScope scope(MemCategory::kComm);
  Pending p;
  p.keep = t.clone();  // the cache may overwrite its buffer before the receiver copies it
  if (link.first) {
    TESSEL_CHECK(t.ndim() >= 1 && t.ndim() <= TensorHeader::kMaxDims, "pipeline: cannot send a ",
                 t.ndim(), "-d tensor");
    TensorHeader h;
    h.dtype = static_cast<int64_t>(t.dtype());
    h.ndim = t.ndim();
    for (int i = 0; i < t.ndim(); ++i) h.dims[i] = t.dim(i);
    auto words = std::make_shared<std::vector<int64_t>>(kHeaderWords);
    std::memcpy(words->data(), &h, sizeof h);
    pending_.push_back(
        {link.comm.isend(words->data(), kHeaderWords, comm::ElemType::kI64, link.peer), Tensor(),
         words, comm::NcclWork()});
    link.first = false;
  }
  const size_t n = static_cast<size_t>(p.keep.numel());
  if (link.device)
    p.device_work =
        link.device->send(p.keep.raw(), n, comm::elem_type(p.keep.dtype()), link.peer, {});
  else
    p.work = link.comm.isend(p.keep.raw(), n, comm::elem_type(p.keep.dtype()), link.peer);
  sent_bytes_ += static_cast<double>(p.keep.nbytes());
  pending_.push_back(std::move(p));
  // Drop finished sends so that the list stays short.
  auto finished = [](const Pending& q) {
    if (!q.work.done() || !q.device_work.done()) return false;
    q.work.wait();  // rethrows a failed send
    q.device_work.wait();
    return true;
  };
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), finished), pending_.end());
  send_s_ += now_seconds() - t0;
}

Tensor PipelineExecutor::recv(Link& link, int64_t rows, const Shape* expect,
                              const std::string& what, DType expect_type) {
  const double t0 = now_seconds();
  if (link.first) {
    TensorHeader h;
    link.comm.recv(&h, kHeaderWords, comm::ElemType::kI64, link.peer);
    if (h.version != TensorHeader::kVersion || h.dtype < 0 ||
        h.dtype > static_cast<int64_t>(DType::kU8) || h.ndim < 1 || h.ndim > TensorHeader::kMaxDims)
      throw Error(str("pipeline: stage ", stage_, " got a malformed header for the ", what,
                      " from stage ", link.peer_stage, " (version ", h.version, ", dtype ", h.dtype,
                      ", ", h.ndim, " dims); every stage must run the same tessel build"));
    const DType dtype = static_cast<DType>(h.dtype);
    Shape got(h.dims, h.dims + h.ndim);
    Shape want = expect ? *expect : got;
    if (!expect) want[0] = rows;
    if (got != want || (expect && dtype != expect_type))
      throw Error(str("pipeline: stage ", stage_, " expected the ", what, " from stage ",
                      link.peer_stage, " as ", expect ? dtype_name(expect_type) : "",
                      expect ? " " : "", shape_str(want), ", got ", dtype_name(dtype), " ",
                      shape_str(got),
                      "; the stages disagree on the model, the micro-batch size or "
                      "train.precision"));
    link.dtype = dtype;
    link.tail.assign(got.begin() + 1, got.end());
    link.first = false;
  }
  Shape shape = {rows};
  shape.insert(shape.end(), link.tail.begin(), link.tail.end());
  Tensor t;
  {
    MemoryScope scope(MemCategory::kComm);
    t = Tensor::empty(shape, link.dtype, current_device());
  }
  {
    TraceSpan span("recv", "p2p");
    if (TraceArgs* args = span.args())
      args->text("what", what)
          .num("from_stage", link.peer_stage)
          .num("bytes", static_cast<double>(t.nbytes()));
    const size_t n = static_cast<size_t>(t.numel());
    if (link.device)
      link.device->recv(t.raw(), n, comm::elem_type(link.dtype), link.peer, {}).wait();
    else
      link.comm.recv(t.raw(), n, comm::elem_type(link.dtype), link.peer);
  }
  if (expect && *expect != shape)
    throw Error(str("pipeline: stage ", stage_, " expected the ", what, " from stage ",
                    link.peer_stage, " as ", shape_str(*expect), ", got ", shape_str(shape)));
  recv_s_ += now_seconds() - t0;
  return t;
}

void PipelineExecutor::wait_sends() {
  const double t0 = now_seconds();
  for (Pending& p : pending_) {
    p.work.wait();
    p.device_work.wait();
  }
  pending_.clear();
  send_s_ += now_seconds() - t0;
}

PieceStats PipelineExecutor::train(const Piece& piece, nn::Loss& loss, const Hooks& hooks) {
  return run(piece, loss, hooks, true);
}

PieceStats PipelineExecutor::eval(const Piece& piece, nn::Loss& loss, const Hooks& hooks) {
  for (auto& [chunk, sets] : acts_)  // no micro-batch is in flight between steps
    for (auto& acts : sets) acts->release_all();
  for (auto& [chunk, scratch] : scratch_) scratch.release_all();
  return run(piece, loss, hooks, false);
}

void PipelineExecutor::check_batch_rows(int64_t rows) const {
  const int64_t m_spec = spec_.pp_microbatches;
  if (rows % m_spec != 0)
    throw InvalidArgument(str("config: pp.microbatches = ", m_spec, " does not divide the ", rows,
                              " rows of each replica's batch (train.batch / dp",
                              spec_.deterministic ? ", or ddp.micro_shard" : "",
                              "); pick a divisor of ", rows, " or change train.batch"));
}

void PipelineExecutor::plan_micro_batches(int64_t rows) {
  const int64_t m_spec = spec_.pp_microbatches;
  // A short last batch may not divide evenly: the first micro-batches get one row more.
  int m = static_cast<int>(std::min<int64_t>(m_spec, std::max<int64_t>(rows, 1)));
  // The interleaved schedule takes whole groups of P micro-batches (or fewer than P).
  if (spec_.pp_schedule == PpSchedule::kInterleaved && m > stages_) m -= m % stages_;
  micro_rows_.assign(m, rows / m);
  micro_first_.assign(m, 0);
  for (int j = 0; j < m; ++j) {
    if (j < rows % m) ++micro_rows_[j];
    if (j > 0) micro_first_[j] = micro_first_[j - 1] + micro_rows_[j - 1];
  }
  piece_rows_ = rows;
}

PieceStats PipelineExecutor::run(const Piece& host_piece, nn::Loss& loss, const Hooks& hooks,
                                 bool training) {
  const Piece piece = on_current_device(host_piece);
  plan_micro_batches(piece.y.dim(0));
  const int m = static_cast<int>(micro_rows_.size());
  const auto& order = schedule_for(m, training)[stage_];
  PieceStats result;
  // Evaluation is not step time: its figures are not kept (take_stats() reports training).
  const double kept[] = {forward_s_, send_s_, recv_s_, sent_bytes_};
  if (training) {
    // Line the stages up so that each stage's idle time is the schedule's, not the skew left
    // by the previous step.
    const double b0 = now_seconds();
    pp_.barrier();
    recv_s_ += now_seconds() - b0;
    trace_.clear();
  }
  // An evaluation's working set is charged where its caller is (the Trainer: other), so that
  // the activations' peak is training's.
  MemoryScope scope(training ? MemCategory::kActivations : current_category());
  if (offload_) offload_->set_resident(piece.x);  // chunk 0's micro-batches view it
  t0_ = now_seconds();
  for (size_t k = 0; k < order.size(); ++k) {
    const Task& t = order[k];
    if (training) offload_before(order, k);
    if (t.op == TaskOp::kForward)
      forward_task(t, piece, loss, hooks, training, result);
    else if (t.op == TaskOp::kBackward)
      backward_task(t, piece, hooks);
    else
      weight_task(t, piece, hooks);
    if (training) offload_after(order, k);
    if (training) trace_.push_back({t.op, t.chunk, t.micro, task_start_ - t0_, task_end_ - t0_});
    if (Tracer* tracer = active_tracer()) trace_task(*tracer, t);
  }
  wait_sends();
  if (training) {
    // A stage that finishes early idles until the last one is done: the drain is bubble too.
    pp_.barrier();
    span_s_ += now_seconds() - t0_;
    TESSEL_CHECK(inflight_.empty(), "pipeline: ", inflight_.size(),
                 " micro-batches still in flight after the schedule");
  } else {
    forward_s_ = kept[0], send_s_ = kept[1], recv_s_ = kept[2], sent_bytes_ = kept[3];
  }
  return result;
}

void PipelineExecutor::trace_task(Tracer& tracer, const Task& t) {
  TraceArgs args;
  args.num("micro", t.micro).num("chunk", t.chunk).num("stage", stage_);
  static const char* names[] = {"F", "B", "W"};
  static const char* categories[] = {"pipeline_forward", "pipeline_backward", "pipeline_weights"};
  const int op = static_cast<int>(t.op);
  tracer.span(str(names[op], t.micro), categories[op], task_start_, task_end_, std::move(args));
}

void PipelineExecutor::forward_task(const Task& t, const Piece& piece, nn::Loss& loss,
                                    const Hooks& hooks, bool training, PieceStats& result) {
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
  Inflight fl;
  if (training) fl.acts = acquire(c);
  const nn::BlockHook hook = [&](nn::Phase p, size_t b) {
    hooks(p, b, false);
    if (offload_ && fl.acts) offload_block(p, b, c, *fl.acts);
  };
  Tensor h = model_.forward(x, ctx, fl.acts, hook, part_.begin[c], part_.begin[c + 1]);
  if (c + 1 == C) {
    Shape ys = piece.y.shape();
    ys[0] = rows;
    const Tensor y = piece.y.view(micro_first_[j] * (piece.y.numel() / piece.y.dim(0)), ys);
    const nn::LossValue v = loss.forward(h, y);
    if (training) check_loss(v.mean, piece.ctx.step);
    result.loss_sum += static_cast<double>(v.mean) * rows;
    result.correct += static_cast<double>(v.correct) * rows / static_cast<double>(v.positions);
    result.rows += rows;
    if (training)  // this micro-batch's share of the piece's loss gradient
      fl.dlogits = loss.backward(static_cast<float>(piece.weight * rows / piece_rows_)).clone();
    if (offload_ && training) offload_->computed();
  }
  task_end_ = now_seconds();
  forward_s_ += task_end_ - t0;
  if (c + 1 < C) send(*fwd_[c], h);
  if (!training) return;
  fl.out_shape = h.shape();
  fl.out_type = h.dtype();
  inflight_[{c, j}] = std::move(fl);
  peak_inflight_ = std::max(peak_inflight_, static_cast<int>(inflight_.size()));
}

void PipelineExecutor::backward_task(const Task& t, const Piece& piece, const Hooks& hooks) {
  const int c = t.chunk, j = t.micro;
  const int C = static_cast<int>(part_.chunks());
  auto it = inflight_.find({c, j});
  TESSEL_CHECK(it != inflight_.end(), "pipeline: backward of chunk ", c, " micro-batch ", j,
               " before its forward");
  Inflight& fl = it->second;
  Tensor dy = c + 1 == C ? fl.dlogits
                         : recv(*bwd_[c], micro_rows_[j], &fl.out_shape, "activation gradient",
                                fl.out_type);
  // Under zb-h1 the blocks' gradients are complete after the W task: it fires kAfterBackward
  // and moves the tied table's gradient.
  Tensor tied_grad;
  if (!split_ && c == tied_to_ && tied_) tied_grad = recv_tied_grad();
  const bool last = piece.last && j + 1 == static_cast<int>(micro_rows_.size());
  const nn::BlockHook hook = [&](nn::Phase p, size_t b) {
    if (split_ && p == nn::Phase::kAfterBackward) return;
    hooks(p, b, last);
    if (offload_) offload_block(p, b, c, *fl.acts);
    add_tied_grad(p, b, tied_grad);
  };
  const double t0 = task_start_ = now_seconds();
  Tensor g = model_.backward(dy, *fl.acts, hook, part_.begin[c], part_.begin[c + 1]);
  task_end_ = now_seconds();
  backward_s_ += task_end_ - t0;
  if (!split_) send_tied_grad(c);
  if (c > 0) send(*bwd_[c - 1], g);
  if (split_) {  // the blocks keep what their W reads: the loss gradient can go
    fl.dlogits = Tensor();
    return;
  }
  free_[c].push_back(fl.acts);
  inflight_.erase(it);
}

void PipelineExecutor::weight_task(const Task& t, const Piece& piece, const Hooks& hooks) {
  const int c = t.chunk, j = t.micro;
  auto it = inflight_.find({c, j});
  TESSEL_CHECK(it != inflight_.end(), "pipeline: weight gradients of chunk ", c, " micro-batch ", j,
               " before its forward");
  // The head's share of the tied table's gradient, summed over the micro-batches, comes with
  // the last micro-batch: the embedding's W adds it before its own share.
  const bool last_micro = j + 1 == static_cast<int>(micro_rows_.size());
  Tensor tied_grad;
  if (last_micro && c == tied_to_ && tied_) tied_grad = recv_tied_grad();
  const bool last = piece.last && last_micro;
  const nn::BlockHook hook = [&](nn::Phase p, size_t b) {
    hooks(p, b, last);
    add_tied_grad(p, b, tied_grad);
  };
  const double t0 = task_start_ = now_seconds();
  model_.backward_weights(*it->second.acts, hook, part_.begin[c], part_.begin[c + 1]);
  task_end_ = now_seconds();
  backward_s_ += task_end_ - t0;
  if (last_micro) send_tied_grad(c);
  free_[c].push_back(it->second.acts);
  inflight_.erase(it);
}

Tensor PipelineExecutor::recv_tied_grad() {
  const Shape table{tied_range_.size()};
  return recv(*tied_, tied_range_.size(), &table, "tied-table gradient");
}

// The table's gradient memory is bound by the gradient sync's hook: the head's share goes in
// right after it, before the embedding's own share.
void PipelineExecutor::add_tied_grad(nn::Phase p, size_t block, const Tensor& tied_grad) {
  if (p != nn::Phase::kBeforeBackward || block != tied_owner_ || !tied_grad.defined()) return;
  ops::accumulate(tied_param_->grad.kernel_data<float>(), tied_grad.kernel_data<float>(),
                  tied_grad.numel(), DType::kF32);
}

void PipelineExecutor::send_tied_grad(int chunk) {
  if (chunk != tied_from_ || !tied_) return;
  send(*tied_, tied_grad_);
  tied_grad_.zero_();
}

void PipelineExecutor::idle(const Hooks& hooks, bool training, bool last) {
  // The schedule of one micro-batch, without compute or messages (the whole replica is idle).
  for (const Task& t : schedule_for(1, training)[stage_]) {
    const size_t lo = part_.begin[t.chunk], hi = part_.begin[t.chunk + 1];
    if (t.op == TaskOp::kForward) {
      for (size_t b = lo; b < hi; ++b) {
        hooks(nn::Phase::kBeforeForward, b, last);
        hooks(nn::Phase::kAfterForward, b, last);
      }
    } else {  // under zb-h1 a B fires kBeforeBackward only, its W both (backward_task)
      for (size_t b = hi; b-- > lo;) {
        hooks(nn::Phase::kBeforeBackward, b, last);
        if (!split_ || t.op == TaskOp::kWeight) hooks(nn::Phase::kAfterBackward, b, last);
      }
    }
  }
}

void PipelineExecutor::take_stats(RankStats& s) {
  s.stage = stage_;
  s.forward_s += forward_s_;
  s.backward_s += backward_s_;
  s.send_s += send_s_;
  s.recv_wait_s += recv_s_;
  s.schedule_s += span_s_;
  s.sent_bytes += sent_bytes_;
  s.comm_exposed_s += send_s_ + recv_s_;
  s.peak_inflight = std::max(s.peak_inflight, static_cast<double>(peak_inflight_));
  forward_s_ = backward_s_ = send_s_ = recv_s_ = span_s_ = sent_bytes_ = 0;
  peak_inflight_ = 0;
}

}  // namespace tessel::parallel
