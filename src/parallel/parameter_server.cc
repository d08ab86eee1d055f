// The worker side of the parameter server and what both sides share (partition, metrics).
// The server side is in parameter_server_serve.cc.
//
// A worker's life: the first piece of work sends a hello to every server and receives the
// shards (start); every step pushes the gradient with the version it was computed on and, in
// the same request, asks for the next parameters, which the servers send once the mode allows
// (await_replies); evaluation first pulls with the rule "every worker has reached my clock";
// consolidate copies the servers' shards and optimizer state into rank 0; the destructor says
// goodbye so that serve() returns. In async and ssp a pull or push to server 0 also claims the
// worker's next batch of the epoch (set_claims, claim): the reply carries its index.
#include "tessel/parallel/parameter_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/optim/schedule.h"

namespace tessel::parallel {

namespace {

ParameterServer::Mode parse_mode(const std::string& m) {
  if (m == "sync") return ParameterServer::Mode::kSync;
  if (m == "async") return ParameterServer::Mode::kAsync;
  if (m == "ssp") return ParameterServer::Mode::kSsp;
  throw InvalidArgument(str("config: ps.mode must be sync, async or ssp, got '", m, "'"));
}

// Contiguous ranges of the arena, one per server, of about n / servers elements each. A cut
// moves to the nearest parameter boundary when that changes a shard by at most an eighth, so
// that most parameters live on one server; a large parameter is cut inside instead.
std::vector<std::pair<int64_t, int64_t>> partition(const Arena& arena, int servers) {
  const int64_t n = arena.numel();
  std::vector<int64_t> bounds;
  for (const Arena::Entry& e : arena.entries()) bounds.push_back(e.offset);
  bounds.push_back(n);
  std::vector<std::pair<int64_t, int64_t>> out;
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
    out.emplace_back(lo, cut);
    lo = cut;
  }
  return out;
}

}  // namespace

ParameterServer::ParameterServer(const ParallelSpec& spec, comm::Communicator& world,
                                 const Layout& layout, nn::Model& model)
    : Strategy(model, spec), world_(world), layout_(layout), groups_(world, layout) {
  mode_ = parse_mode(spec_.ps_mode);
  if (spec_.ps_staleness < 0)
    throw InvalidArgument(str("config: ps.staleness must be >= 0, got ", spec_.ps_staleness));
  if (spec_.ps_stale_lr != "none" && spec_.ps_stale_lr != "inverse")
    throw InvalidArgument(
        str("config: ps.stale_lr must be none or inverse, got '", spec_.ps_stale_lr, "'"));
  if (spec_.deterministic)
    throw InvalidArgument(
        "config: train.deterministic cannot be combined with ps.servers > 0 (the servers sum "
        "whole pushes); turn one of them off");
  if (spec_.slow_rank >= layout_.workers())
    throw InvalidArgument(str("config: debug.slow_rank = ", spec_.slow_rank,
                              " is not a worker rank; workers are ranks 0..",
                              layout_.workers() - 1, " (the last ", layout_.servers,
                              " ranks are servers)"));
  shards_ = partition(model_.params(), layout_.servers);
  held_.assign(static_cast<size_t>(layout_.servers), -1);
  request_.resize(static_cast<size_t>(layout_.servers));
  reply_.resize(static_cast<size_t>(layout_.servers));
}

ParameterServer::~ParameterServer() {
  // An exception on its way out: saying "done" would let a server finish as if all went well.
  if (is_server() || !started_ || std::uncaught_exceptions() > 0) return;
  try {
    for (int k = 0; k < layout_.servers; ++k) {
      Header h{kDone, clock_, held_[static_cast<size_t>(k)], 0};
      world_.send(h.data(), h.size(), comm::ElemType::kI64, server_rank(k), kTagRequest);
    }
  } catch (const std::exception& e) {
    log_warn("parameter server: worker rank ", rank(), " could not say goodbye: ", e.what());
  }
}

void ParameterServer::request(Kind kind, int64_t clock) {
  for (int k = 0; k < layout_.servers; ++k) {
    Header& h = request_[static_cast<size_t>(k)];
    h = {kind, clock, held_[static_cast<size_t>(k)], 0, 0, 0};
    if (k == 0 && claims_.open && (kind == kPull || kind == kPushPull)) {
      h[3] = claims_.epoch + 1, h[4] = claims_.first, h[5] = claims_.limit;
      claiming_ = true;
    }
    sends_.push_back(world_.isend(h.data(), h.size(), comm::ElemType::kI64, server_rank(k),
                                  kTagRequest));
  }
}

void ParameterServer::await_replies(const char* what) {
  const double t0 = now_seconds();
  // A quarter longer than comm.timeout_s: a server that waits for a silent worker reports it
  // (and aborts the group) first, and it knows whom it waits for.
  const comm::Deadline deadline = comm::Deadline::after(1.25 * timeout());
  float* params = model_.params().flat().data<float>();
  int k = 0;
  try {
    std::vector<comm::Work> recvs;
    for (k = 0; k < layout_.servers; ++k)
      recvs.push_back(world_.irecv(reply_[static_cast<size_t>(k)].data(), reply_[0].size(),
                                   comm::ElemType::kI64, server_rank(k), kTagReply));
    std::vector<comm::Work> data;
    for (k = 0; k < layout_.servers; ++k) {
      recvs[static_cast<size_t>(k)].wait(deadline);
      const Header& r = reply_[static_cast<size_t>(k)];
      held_[static_cast<size_t>(k)] = r[0];
      if (k == 0 && claiming_) claimed_ = r[3], claiming_ = false;
      if (r[1] == 0) continue;  // this shard did not change since the version held
      auto [lo, hi] = shard(k);
      data.push_back(world_.irecv(params + lo, static_cast<size_t>(hi - lo), comm::ElemType::kF32,
                                  server_rank(k), kTagParams));
      ++pulls_with_data_;
    }
    k = -1;
    for (comm::Work& w : data) w.wait(deadline);
    for (comm::Work& w : sends_) w.wait(deadline);
    sends_.clear();
  } catch (const CommError& e) {
    // The transport says whether the deadline passed or the group was aborted (and why).
    throw CommError(str("parameter server: worker rank ", rank(), " (clock ", clock_,
                        ") waited for a ", what, " reply from ",
                        k >= 0 ? str("server rank ", server_rank(k)) : std::string("the servers"),
                        " (deadline 1.25 x comm.timeout_s = ", 1.25 * timeout(), " s): ",
                        e.what()));
  }
  wait_s_ += now_seconds() - t0;
}

void ParameterServer::start(int64_t clock) {
  if (started_) return;
  started_ = true;
  clock_ = clock;
  request(kHello, clock);
  await_replies("hello");
}

void ParameterServer::pull(Kind kind) {
  request(kind, clock_);
  await_replies(kind == kEvalPull ? "evaluation pull" : "pull");
}

void ParameterServer::set_claims(const Claims& claims) {
  if (lockstep()) Strategy::set_claims(claims);
  claims_ = claims;
  claimed_ = kNotAsked;
}

int64_t ParameterServer::claim() {
  if (lockstep()) return Strategy::claim();
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

PieceResult ParameterServer::train_piece(const Piece& piece, nn::CrossEntropyLoss& loss) {
  start(piece.ctx.step);
  evaluated_ = false;
  return Strategy::train_piece(piece, loss);
}

PieceResult ParameterServer::eval_piece(const Piece& piece, nn::CrossEntropyLoss& loss) {
  start(piece.ctx.step);
  // Evaluate what every worker's gradients of the steps so far have made: the servers answer
  // this pull once every worker has reached this worker's clock.
  if (!evaluated_) pull(kEvalPull);
  evaluated_ = true;
  return Strategy::eval_piece(piece, loss);
}

void ParameterServer::collect_shard() {
  throw Error("parameter server: deterministic mode is not supported (this is a bug: the "
              "constructor rejects it)");
}

void ParameterServer::step(optim::Optimizer&, float, float clip_norm, int64_t step) {
  start(step);  // a worker whose slices were all empty so far
  evaluated_ = false;
  if (spec_.slow_rank == rank() && spec_.delay_ms > 0) {
    const double t = now_seconds();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(spec_.delay_ms));
    slow_s_ += now_seconds() - t;
  }
  const double t0 = now_seconds();
  // The gradient holds this worker's share of the global mean (its rows weigh 1/global rows);
  // scaled by the worker count it estimates the whole gradient, and that estimate's norm is
  // what train.clip_norm bounds (so in sync mode the sum of the pushes stays within it).
  Tensor g = model_.grads().flat();
  if (clip_norm > 0) {
    const double norm = std::sqrt(optim::sum_squares(g.data<float>(), g.numel())) *
                        layout_.workers();
    optim::clip_scale(g.data<float>(), g.numel(), norm, clip_norm);
  }
  clock_ = step + 1;
  ++pushes_;
  request(kPushPull, clock_);
  for (int k = 0; k < layout_.servers; ++k) {
    auto [lo, hi] = shard(k);
    sends_.push_back(world_.isend(g.data<float>() + lo, static_cast<size_t>(hi - lo),
                                  comm::ElemType::kF32, server_rank(k), kTagGrad));
  }
  push_s_ += now_seconds() - t0;
  await_replies("push");
}

void ParameterServer::consolidate(optim::Optimizer& opt) {
  start(-1);  // -1: the servers' own clock (nothing trained in this invocation)
  if (rank() == 0) {
    const double t0 = now_seconds();
    const comm::Deadline deadline = comm::Deadline::after(timeout());
    float* params = model_.params().flat().data<float>();
    auto state = opt.state();
    for (int k = 0; k < layout_.servers; ++k) {
      Header& h = request_[static_cast<size_t>(k)];
      h = {kConsolidate, clock_, held_[static_cast<size_t>(k)], 0, 0, 0};
      world_.send(h.data(), h.size(), comm::ElemType::kI64, server_rank(k), kTagRequest);
      Header& r = reply_[static_cast<size_t>(k)];
      world_.recv(r.data(), r.size(), comm::ElemType::kI64, server_rank(k), kTagReply);
      auto [lo, hi] = shard(k);
      const size_t len = static_cast<size_t>(hi - lo);
      std::vector<comm::Work> recvs;
      recvs.push_back(world_.irecv(params + lo, len, comm::ElemType::kF32, server_rank(k), kTagParams));
      for (auto& [name, t] : state)
        if (t.numel() == model_.params().numel())
          recvs.push_back(world_.irecv(t.data<float>() + lo, len, comm::ElemType::kF32,
                                       server_rank(k), kTagState));
      for (comm::Work& w : recvs) w.wait(deadline);
      held_[static_cast<size_t>(k)] = r[0];
      opt.set_steps(r[2]);  // every server applies every update: the counts agree
    }
    wait_s_ += now_seconds() - t0;
  }
  // Nobody pushes again before rank 0 holds the snapshot (async workers would otherwise race it).
  if (groups_.workers.size() > 1) groups_.workers.barrier();
}

void ParameterServer::sum(double* values, int n) {
  if (groups_.workers.size() > 1)
    groups_.workers.allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64);
}

void ParameterServer::max(double* values, int n) {
  if (groups_.workers.size() > 1)
    groups_.workers.allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64,
                              comm::ReduceOp::kMax);
}

std::vector<double> ParameterServer::gather(double value) {
  std::vector<double> all(static_cast<size_t>(groups_.workers.size()), value);
  if (groups_.workers.size() > 1)
    groups_.workers.allgather(&value, all.data(), 1, comm::ElemType::kF64);
  return all;
}

namespace {

nlohmann::json histogram_json(const double* bins, int count) {
  nlohmann::json h = nlohmann::json::object();
  for (int i = 0; i < count; ++i)
    if (bins[i] > 0)
      h[i + 1 == count ? str(i, "+") : std::to_string(i)] = static_cast<int64_t>(bins[i]);
  return h;
}

}  // namespace

nlohmann::json ParameterServer::take_metrics() {
  // Rank 0 asks every server for its counters; the workers then share them so that every
  // rank reports the same layout figures.
  start(-1);
  const int S = layout_.servers;
  std::vector<double> stats(static_cast<size_t>(S * kStatCount), 0.0);
  if (rank() == 0) {
    for (int k = 0; k < S; ++k) {
      Header& h = request_[static_cast<size_t>(k)];
      h = {kStats, clock_, held_[static_cast<size_t>(k)], 0, 0, 0};
      world_.send(h.data(), h.size(), comm::ElemType::kI64, server_rank(k), kTagRequest);
      world_.recv(stats.data() + k * kStatCount, kStatCount, comm::ElemType::kF64, server_rank(k),
                  kTagState);
    }
  }
  if (groups_.workers.size() > 1)
    groups_.workers.broadcast(stats.data(), stats.size(), comm::ElemType::kF64, 0);

  nlohmann::json servers = nlohmann::json::array();
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
    auto [lo, hi] = shard(k);
    servers.push_back({{"rank", server_rank(k)},
                       {"elements", hi - lo},
                       {"shard_bytes", 4 * (hi - lo)},
                       {"pushes", static_cast<int64_t>(s[kPushes])},
                       {"gradients_applied", static_cast<int64_t>(s[kGradientsApplied])},
                       {"updates", static_cast<int64_t>(s[kUpdates])},
                       {"pulls", static_cast<int64_t>(s[kPulls])},
                       {"pulls_with_data", static_cast<int64_t>(s[kPullsWithData])},
                       {"bytes_in", s[kBytesIn]},
                       {"bytes_out", s[kBytesOut]},
                       {"apply_seconds", s[kApplySeconds]},
                       {"idle_seconds", s[kIdleSeconds]},
                       {"staleness_histogram", histogram_json(bins, kStalenessBins)}});
  }
  nlohmann::json m = {{"comm_exposed_seconds", wait_s_ + push_s_},
                      {"comm_overlapped_seconds", 0.0},
                      {"optimizer_seconds", 0.0},  // the servers update; see ps_servers
                      {"ps_mode", spec_.ps_mode},
                      {"ps_servers", servers},
                      {"ps_staleness_histogram", histogram_json(total.data(), kStalenessBins)},
                      {"ps_staleness_mean", count > 0 ? weighted / count : 0.0},
                      {"ps_staleness_max", max_staleness},
                      {"ps_max_clock_lead", max_lead},
                      {"ps_worker_wait_seconds", gather(total_wait_s_ += wait_s_)},
                      {"ps_worker_delay_seconds", gather(total_slow_s_ += slow_s_)},
                      {"ps_worker_pulls_with_data", gather(static_cast<double>(pulls_with_data_))},
                      {"ps_worker_batches", gather(static_cast<double>(pushes_))}};
  if (mode_ == Mode::kSsp) m["ps_staleness_bound"] = spec_.ps_staleness;
  wait_s_ = push_s_ = slow_s_ = 0;
  return m;
}

}  // namespace tessel::parallel
