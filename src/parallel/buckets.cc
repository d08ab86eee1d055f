#include "buckets.h"

#include <algorithm>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::parallel {

using compress::Codec;
using compress::Exchange;
using compress::Segment;

int64_t largest_unit(const Units& units) {
  int64_t n = 0;
  for (const Unit& u : units.list) n = std::max(n, u.range.size());
  return n;
}

Buckets::Buckets(const nn::Model& model, const Units& units, comm::Communicator* dp,
                 const Spec& spec)
    : units_(units),
      dp_(dp != nullptr && dp->size() > 1 ? dp : nullptr),
      across_(spec.scatter && spec.across != nullptr && spec.across->size() > 1 ? spec.across
                                                                                : nullptr),
      spec_(spec),
      kind_(spec.compress.kind),
      pool_(largest_unit(units)),
      pending_(units.list.size(), 0),
      done_(units.list.size()) {
  TESSEL_CHECK(dp_ || !across_, "buckets: a shard group of one rank has nothing to scatter");
  if (dp_)
    for (size_t k = 0; k < units.list.size(); ++k) {
      plans_.push_back(plan(model, static_cast<int>(k)));
      // This rank's shard in place (an empty shard: the same on every rank across, skipped).
      const int64_t own = units.own(units.list[k]).size();
      if (across_ && own > 0)
        plans_.back().across = compress::dense_codec({{0, 1, own}}, spec.message, pool_);
    }
}

// A unit's parameters as segments (a tensor whose run holds all of it keeps its matrix shape),
// split into those the kind compresses and the rest.
Buckets::Plan Buckets::plan(const nn::Model& model, int unit) {
  const Unit& u = units_.list[static_cast<size_t>(unit)];
  Plan out;
  std::optional<compress::Scatter> scatter;
  if (spec_.scatter) scatter = compress::Scatter{u.counts, units_.dp_rank};
  auto whole = [&](DType type) {
    return compress::dense_codec({{0, 1, u.range.size()}}, type, pool_, scatter);
  };
  // Uncompressed, and 16-bit kinds under ZeRO: the whole unit as one message.
  if (!compressing()) {
    out.codecs.push_back(whole(spec_.message));
    return out;
  }
  if (spec_.scatter && (kind_ == CompressKind::kFp16 || kind_ == CompressKind::kBf16)) {
    out.codecs.push_back(whole(kind_ == CompressKind::kFp16 ? DType::kF16 : DType::kBF16));
    out.warm = whole(spec_.message);
    return out;
  }
  std::vector<Segment> packed, rest, all;
  for (const nn::Run& run : model.runs(u.range)) {
    const nn::Parameter& p = *model.parameters()[run.param];
    Segment s{run.local - u.range.lo, 1, run.count};
    if (p.shape.size() >= 2 && run.count == shape_numel(p.shape))
      s.rows = p.shape[0], s.cols = run.count / s.rows;
    all.push_back(s);
    const bool worth =
        compress::worth_compressing(kind_, s, spec_.compress, dp_->size(), spec_.scatter);
    (worth ? packed : rest).push_back(s);
  }
  if (!rest.empty()) out.codecs.push_back(compress::dense_codec(rest, spec_.message, pool_));
  if (!packed.empty())
    out.codecs.push_back(
        compress::make_codec(kind_, packed, spec_.compress, spec_.seed, unit, pool_));
  out.warm = compress::dense_codec(all, spec_.message, pool_);
  return out;
}

void Buckets::start(int unit, Codec* c, comm::Communicator* group, float* g) {
  const compress::CodecKey key{spec_.seed, step_, unit, group->rank(), group->size()};
  const double t0 = now_seconds();
  const Exchange ex = c->encode(g, key);
  if (compressing()) encode_s_ += now_seconds() - t0;
  post(Flight{unit, c, group, g, 0, comm::Work(), 0, 0, comm::NcclWork()}, ex);
}

void Buckets::post(Flight f, const Exchange& ex) {
  const double bytes = static_cast<double>(ex.count * comm::elem_size(ex.elem));
  bytes_ += bytes;
  if (f.group == across_) across_bytes_ += bytes;
  if (compressing()) {
    const double whole = ex.op == Exchange::Op::kAllgather ? bytes * dp_->size() : bytes;
    formula_ += ex.bytes(dp_->size(), dp_->choose(ex.kind(), static_cast<size_t>(whole)));
  }
  comm::CallOptions call;
  call.label = static_cast<uint32_t>(f.unit + 1);
  if (spec_.device) {  // on device memory: enqueued (NCCL) or done (staged) on return
    comm::DeviceCollectives* device = f.group == dp_ ? spec_.device : spec_.across_device;
    TESSEL_CHECK(ex.op != Exchange::Op::kAllgather && device != nullptr,
                 "buckets: a device rank's exchanges are dense, over dp or across its groups");
    const double t0 = now_seconds();  // enqueueing (NCCL), or the whole exchange (staged)
    f.device_work = ex.op == Exchange::Op::kAllreduce
                        ? device->allreduce(ex.in, ex.count, ex.elem, comm::ReduceOp::kSum, call)
                        : device->reduce_scatter(ex.in, ex.out, *ex.blocks, ex.elem,
                                                 comm::ReduceOp::kSum, call);
    f.launched = now_seconds();
    f.finished = 0;
    exposed_s_ += f.launched - t0;
    in_flight_.push_back(std::move(f));
    return;
  }
  if (!spec_.async) {  // blocking: the exchange runs now, on the compute thread
    const double t0 = now_seconds();
    ex.start(*f.group, false, call);
    exposed_s_ += now_seconds() - t0;
    complete(f, now_seconds());
    return;
  }
  f.work = ex.start(*f.group, true, call);
  f.launched = now_seconds();
  f.finished = 0;
  in_flight_.push_back(std::move(f));
}

void Buckets::complete(Flight& f, double now) {
  f.work.wait();
  f.device_work.wait();
  if (spec_.async || spec_.device) {
    if (f.finished == 0) f.finished = now;
    overlapped_s_ += std::max(0.0, std::min(f.finished, now) - f.launched);
  }
  const double t0 = now_seconds();
  const std::optional<Exchange> ex = f.codec->next(f.g);
  if (compressing()) (ex ? encode_s_ : decode_s_) += now_seconds() - t0;
  if (ex) {
    ++f.phase;
    post(f, *ex);
    return;
  }
  const size_t k = static_cast<size_t>(f.unit);
  if (--pending_[k] > 0) return;
  // The group's sum of this rank's shard, summed over the other groups.
  if (Codec* across = plans_[k].across.get(); across && f.group != across_) {
    pending_[k] = 1;
    const Unit& u = units_.list[k];
    start(f.unit, across, across_, f.g + (units_.own(u).lo - u.range.lo));
    return;
  }
  if (done_[k]) {
    const Done done = std::move(done_[k]);
    done_[k] = {};
    done();
  }
}

void Buckets::wait_front() {
  Flight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  wait(f);
}

void Buckets::wait(Flight& f) {
  const double t0 = now_seconds();
  const bool was_done = done(f);
  complete(f, t0);
  if (!was_done) exposed_s_ += now_seconds() - t0;
}

void Buckets::launch(int unit, float* g, Done done, size_t max_in_flight) {
  if (!dp_) {
    if (done) done();
    return;
  }
  const size_t k = static_cast<size_t>(unit);
  if (!started_ && compressing()) sent_at_start_ = dp_->transport().sent_bytes();
  started_ = true;
  while (pending_[k] > 0) wait_front();  // its codecs' buffers are still travelling
  while (max_in_flight > 0 && in_flight_.size() >= max_in_flight) wait_front();
  Plan& p = plans_[k];
  std::vector<Codec*> codecs;
  if (p.warm && step_ < spec_.compress.start_step) {
    codecs.push_back(p.warm.get());
  } else {
    for (auto& c : p.codecs) codecs.push_back(c.get());
  }
  pending_[k] = static_cast<int>(codecs.size());
  done_[k] = std::move(done);
  const int w = dp_->size();
  if (compressing())
    f32_ += (spec_.scatter ? 1.0 : 2.0) * (w - 1) / w * 4.0 *  // the f32 exchange's bytes
            static_cast<double>(units_.list[k].range.size());
  // Older flights with another exchange to come move on after this unit's first exchanges
  // (a fixed order on every rank).
  const size_t older = in_flight_.size();
  for (Codec* c : codecs) start(unit, c, dp_, g);
  for (size_t i = 0; i < older; ++i) {
    Flight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (f.phase + 1 < f.codec->phases())
      wait(f);
    else
      in_flight_.push_back(std::move(f));
  }
}

void Buckets::poll() {
  const double now = now_seconds();
  for (Flight& f : in_flight_)
    if (f.finished == 0 && done(f)) f.finished = now;
}

void Buckets::wait_all() {
  const double end_of_backward = now_seconds();
  for (Flight& f : in_flight_)
    if (f.finished == 0 && done(f)) f.finished = end_of_backward;
  while (!in_flight_.empty()) {  // a codec's next exchange joins the back
    Flight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    complete(f, end_of_backward);
  }
  exposed_s_ += now_seconds() - end_of_backward;
  if (started_ && compressing())
    sent_ += static_cast<double>(dp_->transport().sent_bytes() - sent_at_start_);
  started_ = false;
  ++step_;
}

void Buckets::take_stats(RankStats& s) {
  s.comm_exposed_s += exposed_s_;
  s.comm_overlapped_s += overlapped_s_;
  s.comm_bytes += bytes_;
  s.comm_across_bytes += across_bytes_;
  s.compress_bytes += sent_;
  s.compress_formula_bytes += formula_;
  s.compress_f32_bytes += f32_;
  s.encode_s += encode_s_;
  s.decode_s += decode_s_;
  exposed_s_ = overlapped_s_ = bytes_ = across_bytes_ = 0;
  encode_s_ = decode_s_ = sent_ = formula_ = f32_ = 0;
}

std::vector<float> Buckets::save_state() {
  if (!compressing() || !dp_) return {};
  std::vector<float> out = {0.0f, static_cast<float>(step_)};
  for (Plan& p : plans_)
    for (auto& c : p.codecs)
      if (const std::vector<float>* s = c->state()) out.insert(out.end(), s->begin(), s->end());
  out[0] = static_cast<float>(out.size());
  return out;
}

void Buckets::load_state(const std::vector<float>& state) {
  size_t need = 2;
  for (Plan& p : plans_)
    for (auto& c : p.codecs)
      if (const std::vector<float>* s = c->state()) need += s->size();
  if (state.size() != need)
    throw IoError(str("compress: the checkpoint's compression state has ", state.size(),
                      " values, this layout needs ", need,
                      "; resume with the config and worker "
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
