// The answering side of a parameter server's loop (server_loop.h): batch claims (async and
// ssp, server 0), pulls answered when the mode allows, replies unit by unit, stats, checkpoints
// and the values of an evaluation or a final read. The protocol is described at the top of
// parameter_server_serve.cc.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "server_loop.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/trace.h"

namespace tessel::parallel {

void ServerLoop::open_claims(int w) {
  Worker& k = workers_[static_cast<size_t>(w)];
  const Request& h = k.request;
  k.wants_claim = h.claim_epoch > 0;
  if (!k.wants_claim) return;
  if (sync() || ps_.server_index() != 0)
    throw Error(str("parameter server: server rank ", ps_.rank(),
                    " got a batch claim from worker "
                    "rank ",
                    w, "; only server 0 of async and ssp hands out batches (this is a bug)"));
  const int64_t epoch = h.claim_epoch - 1;
  if (epoch > claim_epoch_) {  // the epoch's first claim opens its range
    claim_epoch_ = epoch, claim_first_ = h.claim_first, claim_next_ = h.claim_first,
    claim_limit_ = h.claim_limit;
  } else if (epoch < claim_epoch_ || h.claim_first != claim_first_ ||
             h.claim_limit != claim_limit_) {
    throw Error(str("parameter server: worker rank ", w, " claims batches [", h.claim_first, ", ",
                    h.claim_limit, ") of epoch ", epoch, " while server rank ", ps_.rank(),
                    " hands out [", claim_first_, ", ", claim_limit_, ") of epoch ", claim_epoch_,
                    "; the workers disagree on the epoch (this is a bug)"));
  }
}

int64_t ServerLoop::oldest_held(const Worker* except) const {
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (const Worker& o : workers_)
    if (&o != except && !o.done && o.holds >= 0) oldest = std::min(oldest, o.holds);
  return oldest;
}

int64_t ServerLoop::grant(Worker& k) {
  k.wants_claim = false;
  if (claim_next_ >= claim_limit_) return -1;
  const int64_t step = grants_ / W_, oldest = oldest_held(&k);
  if (oldest != std::numeric_limits<int64_t>::max())
    stats_[ParameterServer::kMaxLead] =
        std::max(stats_[ParameterServer::kMaxLead], static_cast<double>(step - oldest));
  k.holds = step;
  ++grants_;
  return claim_next_++;
}

bool ServerLoop::allowed(const Worker& k) const {
  if (sync()) return k.pull_kind == ParameterServer::kHello || steps_clock() >= k.pull_clock;
  // Async and ssp: only an ssp claim may wait (server 0), for the staleness bound.
  if (ps_.mode_ != ParameterServer::Mode::kSsp || !k.wants_claim || claim_next_ >= claim_limit_)
    return true;
  return oldest_held(&k) >= grants_ / W_ - ps_.spec_.ps_staleness;
}

void ServerLoop::answer_pulls() {
  for (int w = 0; w < W_; ++w) {
    Worker& k = workers_[static_cast<size_t>(w)];
    if (k.pending && allowed(k)) {
      k.pending = false;
      if (sync() && k.pull_kind == ParameterServer::kPushPull) {
        int64_t slowest = k.pull_clock;
        for (const Worker& o : workers_)
          if (!o.done) slowest = std::min(slowest, o.clock);
        stats_[ParameterServer::kMaxLead] = std::max(stats_[ParameterServer::kMaxLead],
                                                     static_cast<double>(k.pull_clock - slowest));
      }
      reply(w);
    }
  }
}

void ServerLoop::reply(int w) {
  Worker& k = workers_[static_cast<size_t>(w)];
  k.reply_work.wait(deadline());  // the previous reply was received long ago
  wait_all(k.data_works);
  const bool changed = version() != k.pull_held;
  const int64_t claimed = k.wants_claim ? grant(k) : -1;
  if (Tracer* tracer = active_tracer()) {
    TraceArgs args;
    args.num("worker", w).num("version", static_cast<double>(version())).num("with_data", changed);
    if (claimed >= 0) args.num("claimed_batch", static_cast<double>(claimed));
    tracer->instant("pull reply", "ps", now_seconds(), std::move(args));
  }
  k.reply = Reply{ParameterServer::kWireVersion, version(), changed ? 1 : 0, opt_.steps(), claimed};
  k.reply_work = world_.isend(&k.reply, ParameterServer::kReplyWords, comm::ElemType::kI64, peer(w),
                              ParameterServer::kTagReply);
  stats_[ParameterServer::kPulls] += 1;
  if (!changed) return;
  const float* src = params();
  if (!sync()) {  // later pushes change the shard while this send may still be pending
    std::memcpy(k.snapshot.data<float>(), src, len_ * sizeof(float));
    src = k.snapshot.data<float>();
  }
  // Unit by unit, the first layers' first: the worker's forward starts on a unit once it landed.
  for (auto p = unit_shards_.rbegin(); p != unit_shards_.rend(); ++p)
    k.data_works.push_back(world_.isend(src + p->lo, static_cast<size_t>(p->size()),
                                        comm::ElemType::kF32, peer(w),
                                        ParameterServer::kTagParams));
  stats_[ParameterServer::kPullsWithData] += 1;
  stats_[ParameterServer::kBytesOut] += 4.0 * static_cast<double>(len_);
}

void ServerLoop::send_stats(int w) {
  if (const auto& ledger = current_ledger()) {
    stats_[ParameterServer::kMemoryPeakTotal] = static_cast<double>(ledger->peak_total());
    for (int c = 0; c < kMemCategories; ++c)
      stats_[static_cast<size_t>(ParameterServer::kMemoryPeak + c)] =
          static_cast<double>(ledger->peak(MemCategory(c)));
  }
  world_.send(stats_.data(), stats_.size(), comm::ElemType::kF64, peer(w),
              ParameterServer::kTagState);
}

// A checkpoint: the shard and its optimizer state into rank w's folder, then its description.
void ServerLoop::write_checkpoint(int w, int64_t path_bytes) {
  std::string dir(static_cast<size_t>(path_bytes), '\0');
  const comm::Deadline d = deadline();
  world_.irecv(dir.data(), dir.size(), comm::ElemType::kU8, peer(w), ParameterServer::kTagState)
      .wait(d);
  const ckpt::ShardFile f = write_state_shard(dir, ps_.rank(), ps_.state(nullptr), ps_.model_);
  const std::string text =
      nlohmann::json{{"file", f.file}, {"bytes", f.bytes}, {"sha256", f.sha256}}.dump();
  Reply r{ParameterServer::kWireVersion, version(), static_cast<int64_t>(text.size()), opt_.steps(),
          -1};
  world_
      .isend(&r, ParameterServer::kReplyWords, comm::ElemType::kI64, peer(w),
             ParameterServer::kTagReply)
      .wait(d);
  world_.isend(text.data(), text.size(), comm::ElemType::kU8, peer(w), ParameterServer::kTagState)
      .wait(d);
}

void ServerLoop::send_values(int w) {
  const comm::Deadline d = deadline();
  Reply r{ParameterServer::kWireVersion, version(), 1, opt_.steps(), -1};
  world_
      .isend(&r, ParameterServer::kReplyWords, comm::ElemType::kI64, peer(w),
             ParameterServer::kTagReply)
      .wait(d);
  world_.isend(params(), len_, comm::ElemType::kF32, peer(w), ParameterServer::kTagParams).wait(d);
}

}  // namespace tessel::parallel
