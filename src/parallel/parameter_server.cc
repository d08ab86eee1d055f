// The worker side of the parameter server and what both sides share (partition, state,
// report). The server side is ServerLoop (server_loop.h): parameter_server_serve.cc and
// parameter_server_replies.cc.
//
// A worker's life: the first piece of work sends a hello to every server and receives the
// shards (start); during the backward each bucket's gradient goes to its servers as soon as it
// is complete (on_block); every step then sends the request of the push, with the version the
// gradient was computed on and its factor, which in the same request asks for the next
// parameters, which the servers send once the mode allows, unit by unit in the order the
// forward reads them (await_replies), and the next forward waits for each unit as it reaches
// it (on_block, land); evaluation first pulls with the rule "every worker has reached my clock";
// the destructor says goodbye so that serve() returns. In async and ssp a pull or push to
// server 0 also claims the worker's next batch of the epoch (set_claims, claim): the reply
// carries its index. Checkpoints are written by the servers, each its own range.
#include "tessel/parallel/parameter_server.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <exception>
#include <limits>
#include <optional>

#include "compress/push_codec.h"
#include "grad_syncs.h"
#include "server_loop.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/core/trace.h"
#include "tessel/optim/schedule.h"
#include "tessel/tensor/device.h"
#include "working_copy.h"

namespace tessel::parallel {

namespace {

// A worker's gradient (worker_sync): its rows' gradient in an ArenaSync of one rank. agree:
// the workers, when an overflow on any of them must make every one's norm non-finite.
class WorkerSync final : public GradSync {
 public:
  WorkerSync(nn::Model& model, const Units& units, int workers, comm::Communicator* agree)
      : local_(model, units, ArenaSync::Reduction::kAllReduce, nullptr, nullptr),
        all_{0, model.arena_numel()},
        workers_(workers),
        agree_(agree) {}

  void reduce() override {}  // the servers sum the pushes
  double sq_norm() override {
    // The gradient holds this worker's share of the global mean (its rows weigh 1/global rows);
    // scaled by the worker count it estimates the whole gradient.
    const double norm = std::sqrt(optim::sum_squares(grads(all_), all_.size())) * workers_;
    double sq = norm * norm;
    if (agree_) {
      double overflow = std::isfinite(sq) ? 0 : 1;
      agree_->allreduce(&overflow, 1, comm::ElemType::kF64, comm::ReduceOp::kMax);
      if (overflow > 0) sq = std::numeric_limits<double>::infinity();
    }
    return sq;
  }
  float* grads(nn::Range r) override { return local_.grads(r); }
  void clear() override { local_.clear(); }
  void take_stats(RankStats& s) override { local_.take_stats(s); }

 private:
  ArenaSync local_;
  nn::Range all_;
  int workers_;
  comm::Communicator* agree_;
};

}  // namespace

// Contiguous ranges of the arena, one per server, of about n / servers elements each. A cut
// moves to the nearest parameter boundary when that changes a shard by at most an eighth, so
// that most parameters live on one server; a large parameter is cut inside instead.
std::vector<nn::Range> server_shards(const nn::Model& model, int servers) {
  const int64_t n = model.arena_numel();
  std::vector<int64_t> bounds;
  for (size_t k = 0; k < model.parameters().size(); ++k) bounds.push_back(model.offset(k));
  bounds.push_back(n);
  std::vector<nn::Range> out;
  int64_t lo = 0;
  for (int k = 1; k <= servers; ++k) {
    int64_t cut = n * k / servers;
    if (k < servers) {
      auto it = std::lower_bound(bounds.begin(), bounds.end(), cut);
      int64_t best = it == bounds.end() ? n : *it;
      if (it != bounds.begin() && cut - *(it - 1) < best - cut) best = *(it - 1);
      if (std::llabs(best - cut) * 8 * servers <= n) cut = best;
    }
    cut = std::max(cut, lo);
    out.push_back({lo, cut});
    lo = cut;
  }
  return out;
}

std::unique_ptr<GradSync> ParameterServer::worker_sync(nn::Model& model, const Units& units) {
  bool same = units.list.size() == units_.list.size();
  for (size_t u = 0; same && u < units.list.size(); ++u)
    same = units.list[u].range.lo == units_.list[u].range.lo &&
           units.list[u].range.hi == units_.list[u].range.hi;
  TESSEL_CHECK(same, "parameter server: the worker's units (", units.list.size(),
               ") are not the servers' (", units_.list.size(), "; this is a bug)");
  if (spec_.deterministic) {
    auto sync = std::make_unique<ExactPushSync>(model, units, mesh_.workers(),
                                                spec_.precision == Precision::kFp16);
    sync_ = exact_ = sync.get();
    return sync;
  }
  const bool agree = lockstep() && spec_.precision == Precision::kFp16 && workers() > 1;
  auto sync =
      std::make_unique<WorkerSync>(model, units, workers(), agree ? &mesh_.workers() : nullptr);
  sync_ = sync.get();
  return sync;
}

std::vector<nn::Range> ParameterServer::unit_shards(int k) const {
  const nn::Range s = shard(k);
  std::vector<nn::Range> out;
  for (int u : order_)
    for (const UnitShard& p : by_unit_[static_cast<size_t>(u)])
      if (p.server == k) out.push_back({p.range.lo - s.lo, p.range.hi - s.lo});
  return out;
}

// Each unit shard as one message: f32, deterministic mode's integer sums, or the codec's
// message of the unscaled gradient (int8's key: the unit shard's place in the model).
void ParameterServer::send_unit(int u) {
  TraceSpan span("push unit", "ps");
  if (TraceArgs* args = span.args()) args->num("unit", u);
  sent_[static_cast<size_t>(u)] = 1;
  const nn::Range r = units_.list[static_cast<size_t>(u)].range;
  for (UnitShard& p : by_unit_[static_cast<size_t>(u)]) {
    const size_t n = static_cast<size_t>(p.range.size());
    const int to = server_rank(p.server);
    if (exact_) {
      sends_.push_back(
          world_.isend(exact_->sums() + p.range.lo, n, comm::ElemType::kI64, to, kTagGrad));
      continue;
    }
    float* g = sync_->grads(r) + (p.range.lo - r.lo);
    if (!p.codec) {
      sends_.push_back(world_.isend(g, n, comm::ElemType::kF32, to, kTagGrad));
      continue;
    }
    const double t0 = now_seconds();
    const void* msg = p.codec->encode(g, {seed_, step_, p.index, rank(), 1});
    encode_s_ += now_seconds() - t0;
    const uint64_t before = world_.transport().sent_bytes();
    sends_.push_back(
        world_.isend(msg, p.codec->message_bytes(), comm::ElemType::kU8, to, kTagGrad));
    sent_bytes_ += static_cast<double>(world_.transport().sent_bytes() - before);
    formula_ += static_cast<double>(p.codec->message_bytes());
    f32_ += 4.0 * static_cast<double>(n);
  }
}

void ParameterServer::on_block(nn::Phase phase, size_t block, bool last) {
  if (phase == nn::Phase::kBeforeForward) {  // the block's parameters have landed
    const double t0 = now_seconds();
    for (int u : units_.used_by_block[block]) land(u);
    wait_s_ += now_seconds() - t0;
    return;
  }
  if (exact_) {  // deterministic: every pass is a micro-shard, kept apart until the step
    if (phase == nn::Phase::kAfterBackward) exact_->collect(block);
    return;
  }
  if (phase != nn::Phase::kAfterBackward || !last || !sync_) return;
  const double t0 = now_seconds();
  for (int u : units_.completed_by(block)) send_unit(u);
  push_s_ += now_seconds() - t0;
}

ParameterServer::ParameterServer(const ParallelSpec& spec, Mesh& mesh, nn::Model& model,
                                 uint64_t seed, const optim::OptimSpec& optim)
    : spec_(spec), mesh_(mesh), world_(mesh.world()), model_(model), seed_(seed) {
  mode_ = spec_.ps_mode;
  shards_ = server_shards(model_, servers());
  units_ = make_units(model_, spec_.bucket_mb, {}, 1, 0);
  for (size_t b = units_.used_by_block.size(); b-- > 0;)
    for (int u : units_.completed_by(b)) order_.push_back(u);
  const CompressKind kind = spec_.compress.kind;
  int index = 0;
  for (const Unit& unit : units_.list) {
    std::vector<UnitShard>& v = by_unit_.emplace_back();
    for (int k = 0; k < servers(); ++k) {
      const int64_t lo = std::max(unit.range.lo, shard(k).lo);
      const int64_t hi = std::min(unit.range.hi, shard(k).hi);
      if (lo >= hi) continue;
      v.push_back({k, index++, {lo, hi}, nullptr});
      if (kind != CompressKind::kNone && !is_server())
        v.back().codec = std::make_unique<compress::PushCodec>(kind, hi - lo, spec_.compress);
    }
  }
  sent_.assign(units_.list.size(), 0);
  landing_.resize(units_.list.size());
  versions_.assign(static_cast<size_t>(servers()), -1);
  request_.resize(static_cast<size_t>(servers()));
  reply_.resize(static_cast<size_t>(servers()));
  if (is_server()) {
    if (const auto& ledger = current_ledger())
      ledger->set_advice(
          "a parameter server holds its range's parameters, gradient and optimizer state and a "
          "receive buffer per worker: more servers (ps.servers) share the model out, fewer "
          "workers need fewer buffers (tessel plan predicts a server's memory)");
    server_.range = shard(server_index());
    server_.values = flat_zeros(server_.range.size(), MemCategory::kParameters);
    server_.grads = flat_zeros(server_.range.size(), MemCategory::kGradients);
    model_.init_values(server_.values.data<float>(), server_.range, seed);
    server_.optimizer = optim::make_optimizer(optim, server_.range.size());
    loop_ = std::make_unique<ServerLoop>(*this);
  } else {
    values_ = flat_zeros(model_.arena_numel(), MemCategory::kParameters);
    model_.init_values(values_.data<float>(), {0, model_.arena_numel()}, seed);
    model_.bind_values({0, model_.arena_numel()}, values_);
    held_ = {{0, model_.arena_numel()}};
  }
}

ParameterServer::~ParameterServer() {
  // An exception on its way out: saying "done" would let a server finish as if all went well.
  if (is_server() || !started_ || finished_ || std::uncaught_exceptions() > 0) return;
  try {
    finish();
  } catch (const std::exception& e) {
    log_warn("parameter server: worker rank ", rank(), " could not say goodbye: ", e.what());
  }
}

void ParameterServer::finish() {
  if (is_server() || !started_ || finished_) return;
  finished_ = true;
  land_all();  // no receive may stay posted into values_ after the servers are told
  for (int k = 0; k < servers(); ++k) {
    Request h{kWireVersion, kDone, clock_, versions_[static_cast<size_t>(k)]};
    world_.send(&h, kRequestWords, comm::ElemType::kI64, server_rank(k), kTagRequest);
  }
}

StateView ParameterServer::state(optim::Optimizer*) {
  if (!is_server()) return {};
  const nn::Range r = server_.range;
  return {{r},
          {r},
          {r},
          [this](nn::Range q) { return server_.values.data<float>() + (q.lo - server_.range.lo); },
          server_.optimizer.get(),
          [this](nn::Range q) { return q.lo - server_.range.lo; },
          {}};
}

// The residuals in arena order, one value per element (0 between units): the layout of the
// earlier one residual per server's shard, so such a checkpoint loads as it is.
std::vector<float> ParameterServer::save_state() {
  const bool any = std::any_of(by_unit_.begin(), by_unit_.end(), [](const auto& v) {
    return std::any_of(v.begin(), v.end(),
                       [](const UnitShard& p) { return p.codec && p.codec->state(); });
  });
  if (!any) return {};
  std::vector<float> out(static_cast<size_t>(1 + model_.arena_numel()), 0.0f);
  out[0] = static_cast<float>(out.size());
  for (auto& v : by_unit_)
    for (UnitShard& p : v)
      if (const std::vector<float>* s = p.codec ? p.codec->state() : nullptr)
        std::copy(s->begin(), s->end(), out.begin() + 1 + p.range.lo);
  return out;
}

void ParameterServer::load_state(const std::vector<float>& state) {
  const size_t need = save_state().size();
  if (state.size() != need)
    throw IoError(str("compress: the checkpoint's push residuals of worker rank ", rank(), " have ",
                      state.size(), " values, parameter-server pushes need ", need,
                      " (the length, then one per parameter element), so another model or "
                      "layout saved them; resume with the model and layout it was saved with"));
  for (auto& v : by_unit_)
    for (UnitShard& p : v)
      if (std::vector<float>* s = p.codec ? p.codec->state() : nullptr)
        std::copy_n(state.begin() + 1 + p.range.lo, s->size(), s->begin());
}

std::vector<ckpt::ShardFile> ParameterServer::write_remote(const std::string& dir,
                                                           int64_t* optimizer_steps) {
  start(-1);
  std::vector<ckpt::ShardFile> out;
  const comm::Deadline deadline = comm::Deadline::after(timeout());
  for (int k = 0; k < servers(); ++k) {
    Request h{kWireVersion, kCheckpoint, static_cast<int64_t>(dir.size()),
              versions_[static_cast<size_t>(k)]};
    world_.send(&h, kRequestWords, comm::ElemType::kI64, server_rank(k), kTagRequest);
    world_.send(dir.data(), dir.size(), comm::ElemType::kU8, server_rank(k), kTagState);
    Reply r;
    world_.irecv(&r, kReplyWords, comm::ElemType::kI64, server_rank(k), kTagReply).wait(deadline);
    std::string text(static_cast<size_t>(r.has_data), ' ');
    world_.irecv(text.data(), text.size(), comm::ElemType::kU8, server_rank(k), kTagState)
        .wait(deadline);
    const nlohmann::json j = nlohmann::json::parse(text);
    out.push_back({j.at("file").get<std::string>(), j.at("bytes").get<int64_t>(),
                   j.at("sha256").get<std::string>()});
    *optimizer_steps = r.optimizer_steps;  // every server applies every update: they agree
  }
  return out;
}

void ParameterServer::read_remote(const std::function<void(nn::Range, const float*)>& consume) {
  start(-1);
  const comm::Deadline deadline = comm::Deadline::after(timeout());
  std::vector<float> buf;
  for (int k = 0; k < servers(); ++k) {
    Request h{kWireVersion, kValues, clock_, versions_[static_cast<size_t>(k)]};
    world_.send(&h, kRequestWords, comm::ElemType::kI64, server_rank(k), kTagRequest);
    Reply r;
    world_.irecv(&r, kReplyWords, comm::ElemType::kI64, server_rank(k), kTagReply).wait(deadline);
    buf.resize(static_cast<size_t>(shard(k).size()));
    world_.irecv(buf.data(), buf.size(), comm::ElemType::kF32, server_rank(k), kTagParams)
        .wait(deadline);
    consume(shard(k), buf.data());
  }
}

void ParameterServer::request(Kind kind, int64_t clock, bool skip, float scale) {
  for (int k = 0; k < servers(); ++k) {
    Request& h = request_[static_cast<size_t>(k)];
    h = Request{kWireVersion, kind, clock, versions_[static_cast<size_t>(k)]};
    h.skip = skip ? 1 : 0;
    h.scale = std::bit_cast<uint32_t>(scale);
    if (k == 0 && claims_.open && (kind == kPull || kind == kPushPull)) {
      h.claim_epoch = claims_.epoch + 1, h.claim_first = claims_.first,
      h.claim_limit = claims_.limit;
      claiming_ = true;
    }
    sends_.push_back(
        world_.isend(&h, kRequestWords, comm::ElemType::kI64, server_rank(k), kTagRequest));
  }
}

void ParameterServer::await_replies(const char* what, bool lazy) {
  TraceSpan span("wait for servers", "ps");
  if (TraceArgs* args = span.args()) args->text("reply", what);
  const double t0 = now_seconds();
  const comm::Deadline deadline = comm::Deadline::after(worker_patience());
  float* params = values_.data<float>();
  int k = 0;
  try {
    land_all();  // the last pull's units the forward has not read yet
    std::vector<comm::Work> recvs;
    for (k = 0; k < servers(); ++k)
      recvs.push_back(world_.irecv(&reply_[static_cast<size_t>(k)], kReplyWords,
                                   comm::ElemType::kI64, server_rank(k), kTagReply));
    for (k = 0; k < servers(); ++k) {
      recvs[static_cast<size_t>(k)].wait(deadline);
      const Reply& r = reply_[static_cast<size_t>(k)];
      if (r.wire != kWireVersion)
        throw CommError(str("parameter server: server rank ", server_rank(k),
                            " speaks wire version ", r.wire, ", this worker ", kWireVersion,
                            "; run one tessel build on every rank"));
      versions_[static_cast<size_t>(k)] = r.version;
      if (k == 0 && claiming_) claimed_ = r.claimed, claiming_ = false;
      if (r.has_data == 0) continue;  // this shard did not change since the version held
      // Unit by unit in the order the forward reads them (the server sends them so).
      for (auto u = order_.rbegin(); u != order_.rend(); ++u) {
        const nn::Range ur = units_.list[static_cast<size_t>(*u)].range;
        const int64_t lo = std::max(ur.lo, shard(k).lo), hi = std::min(ur.hi, shard(k).hi);
        if (lo < hi)
          landing_[static_cast<size_t>(*u)].push_back(
              world_.irecv(params + lo, static_cast<size_t>(hi - lo), comm::ElemType::kF32,
                           server_rank(k), kTagParams));
      }
      ++pulls_with_data_;
    }
    k = -1;
    if (!lazy) land_all();
    for (comm::Work& w : sends_) w.wait(deadline);
    sends_.clear();
  } catch (const CommError& e) {
    // The transport says whether the deadline passed or the group was aborted (and why).
    throw CommError(str("parameter server: worker rank ", rank(), " (clock ", clock_,
                        ") waited for a ", what, " reply from ",
                        k >= 0 ? str("server rank ", server_rank(k)) : std::string("the servers"),
                        " (deadline ", kWorkerPatience, " x comm.timeout_s = ", worker_patience(),
                        " s): ", e.what()));
  }
  wait_s_ += now_seconds() - t0;
}

float* ParameterServer::values(nn::Range r) {
  if (is_server()) return server_.values.data<float>() + (r.lo - server_.range.lo);
  land_all();
  return values_.data<float>() + r.lo;
}

void ParameterServer::land(int u) {
  std::vector<comm::Work>& works = landing_[static_cast<size_t>(u)];
  if (works.empty()) return;
  TraceSpan span("wait for parameters", "ps");
  const comm::Deadline deadline = comm::Deadline::after(worker_patience());
  const nn::Range r = units_.list[static_cast<size_t>(u)].range;
  try {
    for (comm::Work& w : works) w.wait(deadline);
  } catch (const CommError& e) {
    throw CommError(str("parameter server: worker rank ", rank(), " (clock ", clock_,
                        ") waited for the parameters [", r.lo, ", ", r.hi,
                        ") from the servers (deadline ", kWorkerPatience,
                        " x comm.timeout_s = ", worker_patience(), " s): ", e.what()));
  }
  works.clear();
  if (working_) working_->refresh(r, values_.data<float>() + r.lo, values_.device());
}

void ParameterServer::land_all() {
  for (int u : order_) land(u);
}

void ParameterServer::copy_values(nn::Range r, float* dst) {
  std::copy_n(values(r), r.size(), dst);
}

void ParameterServer::start(int64_t clock) {
  if (started_) return;
  started_ = true;
  clock_ = clock;
  request(kHello, clock);
  await_replies("hello");
}

void ParameterServer::pull(Kind kind) {
  const double counted = wait_s_;
  request(kind, clock_);
  await_replies(kind == kEvalPull ? "evaluation pull" : "pull");
  if (kind == kEvalPull) wait_s_ = counted;  // evaluation is not step time (RankStats)
}

void ParameterServer::set_claims(const Range& claims) {
  TESSEL_CHECK(!lockstep(), "parameter server: sync mode hands out no claims (this is a bug)");
  claims_ = claims;
  claimed_ = kNotAsked;
}

int64_t ParameterServer::claim() {
  TESSEL_CHECK(!lockstep(), "parameter server: sync mode hands out no claims (this is a bug)");
  if (!claims_.open) return -1;
  if (claimed_ == kNotAsked) {  // the range's first claim: nothing to push yet
    start(claims_.step);
    pull(kPull);
  }
  const int64_t b = claimed_;
  claimed_ = kNotAsked;
  if (b >= 0 && (b < claims_.first || b >= claims_.limit))
    throw Error(str("parameter server: worker rank ", rank(), " was handed batch ", b,
                    " outside its range [", claims_.first, ", ", claims_.limit, ") of epoch ",
                    claims_.epoch, " (this is a bug)"));
  return b;
}

void ParameterServer::begin_pass(bool training, int64_t step) {
  start(step);
  if (training) step_ = step;
  // Evaluate what every worker's gradients of the steps so far have made: the servers answer
  // this pull once every worker has reached this worker's clock.
  if (!training && !evaluated_) pull(kEvalPull);
  evaluated_ = !training;
}

void ParameterServer::update(optim::Optimizer&, float, float grad_scale, GradSync&, int64_t step) {
  push(grad_scale, step, false);
}

void ParameterServer::end_step(int64_t step) {
  if (!pushed_) push(1.0f, step, true);  // fp16 skipped the update: push a skip
  pushed_ = false;
}

// grad_scale: the loss scale's inverse and the clipping of worker_sync()'s norm, applied by
// the servers (the buckets went out during the backward, compressed or not).
void ParameterServer::push(float grad_scale, int64_t step, bool skip) {
  start(step);  // a worker whose slices were all empty so far
  evaluated_ = false;
  pushed_ = true;
  std::optional<TraceSpan> span(std::in_place, skip ? "push skip" : "push", "ps");
  if (TraceArgs* args = span->args()) args->num("step", static_cast<double>(step));
  const double t0 = now_seconds();
  clock_ = step + 1;
  ++pushes_;
  for (int u : order_)  // a worker without rows in this step launched nothing
    if (!sent_[static_cast<size_t>(u)]) send_unit(u);
  std::fill(sent_.begin(), sent_.end(), 0);
  if (exact_)  // the scales its integer sums were taken at
    for (int k = 0; k < servers(); ++k)
      sends_.push_back(world_.isend(exact_->scales().data(), exact_->scales().size(),
                                    comm::ElemType::kF64, server_rank(k), kTagGrad));
  request(kPushPull, clock_, skip, grad_scale);
  push_s_ += now_seconds() - t0;
  span.reset();
  await_replies("push", true);
}

std::vector<double> ParameterServer::gather(double value) {
  comm::Communicator& w = mesh_.workers();
  std::vector<double> all(static_cast<size_t>(w.size()), value);
  w.allgather(&value, all.data(), 1, comm::ElemType::kF64);
  return all;
}

void ParameterServer::take_stats(RankStats& s) {
  s.comm_exposed_s += wait_s_ + push_s_;
  s.compress_bytes += sent_bytes_;
  s.compress_formula_bytes += formula_;
  s.compress_f32_bytes += f32_;
  s.encode_s += encode_s_;
  total_wait_s_ += wait_s_;
  total_slow_s_ += s.delay_s;
  wait_s_ = push_s_ = sent_bytes_ = formula_ = f32_ = encode_s_ = 0;
}

namespace {

nlohmann::json histogram_json(const double* bins, int count) {
  nlohmann::json h = nlohmann::json::object();
  for (int i = 0; i < count; ++i)
    if (bins[i] > 0)
      h[i + 1 == count ? str(i, "+") : std::to_string(i)] = static_cast<int64_t>(bins[i]);
  return h;
}

// A server's ledger peaks, in the shape of a training rank's (progress.cc's memory_json).
nlohmann::json server_memory_json(const double* s) {
  nlohmann::json peak = nlohmann::json::object();
  for (int c = 0; c < kMemCategories; ++c)
    peak[mem_category_name(MemCategory(c))] =
        static_cast<int64_t>(s[ParameterServer::kMemoryPeak + c]);
  return {{"peak_bytes", peak},
          {"peak_total_bytes", static_cast<int64_t>(s[ParameterServer::kMemoryPeakTotal])}};
}

}  // namespace

nlohmann::json ParameterServer::report() {
  // Rank 0 asks every server for its counters; the workers then share them so that every
  // rank reports the same layout figures.
  start(-1);
  const int S = servers();
  std::vector<double> stats(static_cast<size_t>(S * kStatCount), 0.0);
  if (rank() == 0) {
    for (int k = 0; k < S; ++k) {
      Request h{kWireVersion, kStats, clock_, versions_[static_cast<size_t>(k)]};
      world_.send(&h, kRequestWords, comm::ElemType::kI64, server_rank(k), kTagRequest);
      world_.recv(stats.data() + k * kStatCount, kStatCount, comm::ElemType::kF64, server_rank(k),
                  kTagState);
    }
  }
  mesh_.workers().broadcast(stats.data(), stats.size(), comm::ElemType::kF64, 0);
  nlohmann::json list = nlohmann::json::array();
  std::vector<double> total(kStalenessBins, 0.0);
  double weighted = 0, count = 0, max_staleness = 0, max_lead = 0;
  for (int k = 0; k < S; ++k) {
    const double* s = stats.data() + k * kStatCount;
    const double* bins = s + kStatHistogram;
    for (int i = 0; i < kStalenessBins; ++i) {
      total[static_cast<size_t>(i)] += bins[i];
      weighted += i * bins[i];
      count += bins[i];
    }
    max_staleness = std::max(max_staleness, s[kMaxStaleness]);
    max_lead = std::max(max_lead, s[kMaxLead]);
    const nn::Range r = shard(k);
    list.push_back({{"rank", server_rank(k)},
                    {"elements", r.size()},
                    {"shard_bytes", 4 * r.size()},
                    {"pushes", static_cast<int64_t>(s[kPushes])},
                    {"gradients_applied", static_cast<int64_t>(s[kGradientsApplied])},
                    {"updates", static_cast<int64_t>(s[kUpdates])},
                    {"pulls", static_cast<int64_t>(s[kPulls])},
                    {"pulls_with_data", static_cast<int64_t>(s[kPullsWithData])},
                    {"bytes_in", s[kBytesIn]},
                    {"bytes_out", s[kBytesOut]},
                    {"apply_seconds", s[kApplySeconds]},
                    {"idle_seconds", s[kIdleSeconds]},
                    {"memory", server_memory_json(s)},
                    {"staleness_histogram", histogram_json(bins, kStalenessBins)}});
  }
  nlohmann::json m = {{"ps_mode", name_of(spec_.ps_mode)},
                      {"ps_servers", list},
                      {"ps_staleness_histogram", histogram_json(total.data(), kStalenessBins)},
                      {"ps_staleness_mean", count > 0 ? weighted / count : 0.0},
                      {"ps_staleness_max", max_staleness},
                      {"ps_max_clock_lead", max_lead},
                      {"ps_worker_wait_seconds", gather(total_wait_s_)},
                      {"ps_worker_delay_seconds", gather(total_slow_s_)},
                      {"ps_worker_pulls_with_data", gather(static_cast<double>(pulls_with_data_))},
                      {"ps_worker_batches", gather(static_cast<double>(pushes_))}};
  if (mode_ == Mode::kSsp) m["ps_staleness_bound"] = spec_.ps_staleness;
  return m;
}

}  // namespace tessel::parallel
