#include "compress_sync.h"

#include <algorithm>

#include "tessel/core/clock.h"
#include "tessel/core/memory.h"

namespace tessel::parallel {

using compress::Codec;
using compress::Exchange;
using compress::Segment;

namespace {

// Every unit whose last backward pass ended with block b, from the last block to the first.
template <typename F>
void for_units_in_completion_order(const Units& units, F&& f) {
  for (size_t b = units.used_by_block.size(); b-- > 0;)
    for (int u : units.completed_by(b)) f(u);
}

}  // namespace

CompressSync::CompressSync(nn::Model& model, const Units& units, comm::Communicator& dp,
                           comm::Communicator* workers, bool async, const CompressSpec& spec,
                           uint64_t seed)
    : model_(model),
      units_(units),
      dp_(dp),
      workers_(workers),
      async_(async),
      spec_(spec),
      kind_(compress_kind(spec.kind)),
      seed_(seed),
      launched_(units.list.size(), 0) {
  {
    MemoryScope scope(MemCategory::kGradients);
    arena_ = Tensor::zeros({std::max<int64_t>(units.span.size(), 1)});
  }
  model.bind_grads(units.span, arena_);
  for (size_t k = 0; k < units.list.size(); ++k)
    plans_.push_back(plan(units.list[k], static_cast<int>(k), seed));
}

// A unit's parameters as segments (a tensor whose run holds all of it keeps its matrix shape),
// split into those the kind compresses and the f32 rest.
CompressSync::Plan CompressSync::plan(const Unit& u, int unit, uint64_t seed) const {
  std::vector<Segment> packed, rest, all;
  for (const nn::Run& run : model_.runs(u.range)) {
    const nn::Parameter& p = *model_.parameters()[run.param];
    Segment s{run.local - u.range.lo, 1, run.count};
    if (p.shape.size() >= 2 && run.count == shape_numel(p.shape)) s.rows = p.shape[0], s.cols = run.count / s.rows;
    all.push_back(s);
    (compress::worth_compressing(kind_, s, spec_, dp_.size()) ? packed : rest).push_back(s);
  }
  Plan out;
  if (!rest.empty()) out.codecs.push_back(compress::dense_codec(rest, DType::kF32));
  if (!packed.empty()) out.codecs.push_back(compress::make_codec(kind_, packed, spec_, seed, unit));
  out.warm = compress::dense_codec(all, DType::kF32);
  return out;
}

void CompressSync::post(Flight f, const Exchange& ex) {
  const bool all = ex.op == Exchange::Op::kAllreduce;
  const size_t bytes = ex.count * comm::elem_size(ex.elem) * (all ? 1 : static_cast<size_t>(dp_.size()));
  formula_ += ex.bytes(dp_.size(), dp_.choose(all ? comm::OpKind::kAllreduce : comm::OpKind::kAllgather, bytes));
  comm::CallOptions call;
  call.label = static_cast<uint32_t>(f.unit + 1);
  if (async_) {
    f.work = all ? dp_.allreduce_async(ex.in, ex.count, ex.elem, comm::ReduceOp::kSum, call)
                 : dp_.allgather_async(ex.in, ex.out, std::vector<size_t>(static_cast<size_t>(dp_.size()), ex.count),
                                       ex.elem, call);
    flights_.push_back(f);
    return;
  }
  const double t0 = now_seconds();  // blocking: the exchange runs now, on the compute thread
  if (all)
    dp_.allreduce(ex.in, ex.count, ex.elem, comm::ReduceOp::kSum, call);
  else
    dp_.allgather(ex.in, ex.out, ex.count, ex.elem, call);
  exposed_s_ += now_seconds() - t0;
  advance(f);
}

void CompressSync::advance(Flight& f) {
  double t0 = now_seconds();
  f.work.wait();
  exposed_s_ += now_seconds() - t0;
  t0 = now_seconds();
  const Unit& u = units_.list[static_cast<size_t>(f.unit)];
  std::optional<Exchange> ex = f.codec->next(arena_.data<float>() + (u.range.lo - units_.span.lo));
  (ex ? encode_s_ : decode_s_) += now_seconds() - t0;
  if (!ex) return;
  ++f.phase;
  post(Flight{f.unit, f.codec, f.phase, comm::Work()}, *ex);
}

void CompressSync::launch(int unit) {
  const size_t k = static_cast<size_t>(unit);
  if (std::none_of(launched_.begin(), launched_.end(), [](char c) { return c != 0; }))
    sent_at_start_ = dp_.transport().sent_bytes();
  launched_[k] = 1;
  const Unit& u = units_.list[k];
  float* g = arena_.data<float>() + (u.range.lo - units_.span.lo);
  f32_ += 2.0 * (dp_.size() - 1) / dp_.size() * 4.0 * static_cast<double>(u.range.size());
  // Older flights with another exchange to come move on first (a fixed order on every rank).
  const size_t older = flights_.size();
  Plan& p = plans_[k];
  const bool warm = step_ < spec_.start_step;
  std::vector<Codec*> codecs;
  if (warm) codecs.push_back(p.warm.get());
  for (auto& c : p.codecs)
    if (!warm) codecs.push_back(c.get());
  const compress::CodecKey key{seed_, step_, unit, dp_.rank(), dp_.size()};
  for (Codec* c : codecs) {
    const double t0 = now_seconds();
    const Exchange ex = c->encode(g, key);
    encode_s_ += now_seconds() - t0;
    post(Flight{unit, c, 0, comm::Work()}, ex);
  }
  for (size_t i = 0; i < older; ++i) {
    Flight f = std::move(flights_.front());
    flights_.pop_front();
    if (f.phase + 1 < f.codec->phases())
      advance(f);
    else
      flights_.push_back(std::move(f));
  }
}

void CompressSync::on_block(nn::Phase phase, size_t block, bool last) {
  if (phase != nn::Phase::kAfterBackward || !last) return;
  for (int u : units_.completed_by(block)) launch(u);
}

void CompressSync::reduce() {
  // A rank without rows in this step (a short last batch) still takes part in every unit.
  for_units_in_completion_order(units_, [this](int u) {
    if (!launched_[static_cast<size_t>(u)]) launch(u);
  });
  while (!flights_.empty()) {
    Flight f = std::move(flights_.front());
    flights_.pop_front();
    advance(f);
  }
  sent_ += static_cast<double>(dp_.transport().sent_bytes() - sent_at_start_);
  std::fill(launched_.begin(), launched_.end(), 0);
  ++step_;
}

double CompressSync::sq_norm() { return pieces_sq_norm(units_, *this, workers_); }

float* CompressSync::grads(nn::Range r) {
  return arena_.data<float>() + (r.lo - units_.span.lo);
}

void CompressSync::clear() { arena_.zero_(); }

void CompressSync::take_stats(RankStats& s) {
  s.comm_exposed_s += exposed_s_;
  s.comm_bytes += sent_;
  s.compress_bytes += sent_;
  s.compress_formula_bytes += formula_;
  s.compress_f32_bytes += f32_;
  s.encode_s += encode_s_;
  s.decode_s += decode_s_;
  exposed_s_ = encode_s_ = decode_s_ = sent_ = formula_ = f32_ = 0;
}

std::vector<float> CompressSync::save_state() {
  std::vector<float> out = {0.0f, static_cast<float>(step_)};
  for (Plan& p : plans_)
    for (auto& c : p.codecs)
      if (const std::vector<float>* s = c->state()) out.insert(out.end(), s->begin(), s->end());
  out[0] = static_cast<float>(out.size());
  return out;
}

void CompressSync::load_state(const std::vector<float>& state) {
  size_t need = 2;
  for (Plan& p : plans_)
    for (auto& c : p.codecs)
      if (const std::vector<float>* s = c->state()) need += s->size();
  if (state.size() != need)
    throw IoError(str("compress: the checkpoint's compression state has ", state.size(),
                      " values, this layout needs ", need, "; resume with the config and worker "
                      "count it was saved with"));
  step_ = static_cast<int64_t>(state[1]);
  size_t at = 2;
  for (Plan& p : plans_)
    for (auto& c : p.codecs)
      if (std::vector<float>* s = c->state()) {
        std::copy_n(state.begin() + static_cast<std::ptrdiff_t>(at), s->size(), s->begin());
        at += s->size();
      }
}

}  // namespace tessel::parallel
