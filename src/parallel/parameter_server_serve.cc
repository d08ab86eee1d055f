// The server side of the parameter server: serve() runs one server's event loop until every
// worker has said goodbye.
//
// Terms: a server's version is the number of updates it has applied (its optimizer's step
// count, so a resumed run continues the count); a worker's clock is the number of steps it has
// pushed; staleness of a push is the server's version when it is applied minus the version the
// worker computed on. One request per worker is always posted, and so are the gradient
// receives straight into that worker's buffer, one per unit shard its buckets send (a push's
// payload then lands while the worker's backward still runs and the server is busy elsewhere;
// compressed messages are decoded as they arrive); the loop polls them in worker order,
// handles whatever arrived, then answers the pulls that the mode now allows:
//   sync:  a pull at clock c waits for step c (every worker's gradient of step c - 1 summed in
//          worker order, one update: the data-parallel step);
//   async: a push is applied at once, the pull answered at once;
//   ssp:   as async, but server 0 grants a claim only within the staleness bound (below).
// A push may be a skip (train.precision = fp16 skipped the worker's step on an overflow): its
// gradient (sent during the backward) is dropped; sync skips the whole step (the workers agree on
// it), async and ssp apply nothing for it. Either way the version stays, so its pull brings nothing
// new. An evaluation pull at clock c waits until every worker has reached c in sync; in async and
// ssp it is answered at once (workers evaluate after the epoch-end collective, when every push
// of the epoch has been applied).
//
// Claims (async and ssp; server 0 only): a pull or push that claims names the epoch's range
// [first, limit) of worker batches; the first claim of an epoch opens it, and each reply that
// grants hands out the next index (-1 once the range is exhausted). Grants are numbered across
// the run; grant n is at step n / W. A worker *holds* the step of its last grant until it
// pushes. ssp grants a claim at step c only while every batch held by another worker is at step
// c - staleness or later: no gradient in progress is more than staleness steps behind the
// newest one. A worker waiting for a grant holds nothing, so the oldest holder can always
// finish and nobody waits forever.
// A reply's parameters go out as one message per unit shard, the first layers' units first, so
// that the worker's forward starts on a unit once it landed. They are sent from a per-worker
// snapshot in async and ssp (later pushes change the shard while the send is pending); in sync
// the shard cannot change before every worker has received.
#include <sched.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "exact_sum.h"
#include "server_loop.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/trace.h"

namespace tessel::parallel {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  for (int i = 0; i < 64; ++i) __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}
}  // namespace

// The next push's payload from worker w, one message per unit shard: f32 straight into its
// gradient buffer, deterministic mode's integer sums, or the compressed messages.
void ServerLoop::post_grad(int w) {
  Worker& k = workers_[static_cast<size_t>(w)];
  k.grad_works.clear();
  k.decoded = 0;
  for (size_t i = 0; i < unit_shards_.size(); ++i) {
    const nn::Range& p = unit_shards_[i];
    const size_t n = static_cast<size_t>(p.size());
    const int from = peer(w), tag = ParameterServer::kTagGrad;
    k.grad_works.push_back(
        compressed() ? world_.irecv(k.msg.data<uint8_t>() + msg_at_[i], codecs_[i]->message_bytes(),
                                    comm::ElemType::kU8, from, tag)
        : exact() ? world_.irecv(k.sums.data<int64_t>() + p.lo, n, comm::ElemType::kI64, from, tag)
                  : world_.irecv(k.grad.data<float>() + p.lo, n, comm::ElemType::kF32, from, tag));
  }
  if (exact())
    k.grad_works.push_back(world_.irecv(k.scales.data(), k.scales.size(), comm::ElemType::kF64,
                                        peer(w), ParameterServer::kTagGrad));
}

// Compressed: decodes worker w's unit shards that have arrived, in order (all of them, waiting
// for each, with `wait`), while the worker's backward still runs. Returns whether it decoded.
bool ServerLoop::decode_arrived(int w, bool wait) {
  Worker& k = workers_[static_cast<size_t>(w)];
  const size_t before = k.decoded;
  for (; compressed() && k.decoded < k.grad_works.size(); ++k.decoded) {
    comm::Work& g = k.grad_works[k.decoded];
    if (!wait && !g.done()) break;
    g.wait(deadline());  // rethrows a failed receive (aborted group)
    codecs_[k.decoded]->decode(k.msg.data<uint8_t>() + msg_at_[k.decoded],
                               k.grad.data<float>() + unit_shards_[k.decoded].lo);
  }
  return k.decoded > before;
}

void ServerLoop::post(int w) {
  Worker& k = workers_[static_cast<size_t>(w)];
  k.request_work = world_.irecv(&k.request, ParameterServer::kRequestWords, comm::ElemType::kI64,
                                peer(w), ParameterServer::kTagRequest);
}

nlohmann::json ServerLoop::run(const std::function<float(int64_t)>& lr) {
  lr_ = &lr;
  for (int w = 0; w < W_; ++w) {
    post(w);
    post_grad(w);
  }
  // Polls: spin a few microseconds (a reply is often due at once), then yield the core to the
  // workers computing on it, then nap; a vCPU that goes idle is slow to wake
  // (milliseconds on the reference VM).
  double idle_since = now_seconds();
  Tracer* tracer = scoped_tracer();  // records the steps of its window (Tracer::at_step)
  while (done_ < W_) {
    if (tracer) tracer->at_step(steps_clock());
    bool progress = false, decoded = false;
    for (int w = 0; w < W_; ++w) {
      Worker& k = workers_[static_cast<size_t>(w)];
      if (!k.done) decoded |= decode_arrived(w, false);
      if (k.done || !k.request_work.done()) continue;
      k.request_work.wait(deadline());  // rethrows a failed receive (aborted group)
      handle(w);
      if (!k.done) post(w);
      progress = true;
    }
    const double now = now_seconds();
    if (progress) answer_pulls();
    if (progress || decoded) {
      idle_since = now_seconds();
      continue;
    }
    const double idle = now - idle_since;
    if (idle > ps_.timeout()) stuck(idle);
    if (idle < 20e-6) {
      cpu_relax();
    } else if (idle < 2e-3) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    stats_[ParameterServer::kIdleSeconds] += now_seconds() - now;
  }
  for (Worker& k : workers_) {
    k.reply_work.wait(deadline());  // the last replies
    wait_all(k.data_works);
    k.grad_works.clear();  // cancels the gradient receives nobody will match
  }
  nlohmann::json out = {{"role", "server"}, {"rank", ps_.rank()}, {"version", version()}};
  out["pushes"] = stats_[ParameterServer::kPushes];
  out["updates"] = stats_[ParameterServer::kUpdates];
  return out;
}

void ServerLoop::handle(int w) {
  Worker& k = workers_[static_cast<size_t>(w)];
  const Request h = k.request;
  if (h.wire != ParameterServer::kWireVersion)
    throw CommError(str("parameter server: server rank ", ps_.rank(), " got wire version ", h.wire,
                        " from worker rank ", w, ", it speaks ", ParameterServer::kWireVersion,
                        "; run one tessel build on every rank"));
  switch (h.kind) {
    case ParameterServer::kHello:
      if (base_clock_ < 0) base_clock_ = h.clock >= 0 ? h.clock : opt_.steps();
      k.hello = true;
      k.clock = h.clock >= 0 ? h.clock : steps_clock();
      k.pending = true, k.pull_kind = h.kind, k.pull_clock = k.clock, k.pull_held = h.held;
      break;
    case ParameterServer::kPull:
    case ParameterServer::kEvalPull:
      k.pending = true, k.pull_kind = h.kind, k.pull_clock = h.clock, k.pull_held = h.held;
      open_claims(w);
      break;
    case ParameterServer::kPushPull:
      push(w);
      k.pending = true, k.pull_kind = h.kind, k.pull_clock = h.clock, k.pull_held = h.held;
      open_claims(w);
      break;
    case ParameterServer::kStats:
      send_stats(w);
      break;
    case ParameterServer::kCheckpoint:
      write_checkpoint(w, h.clock);
      break;
    case ParameterServer::kValues:
      send_values(w);
      break;
    case ParameterServer::kDone:
      k.done = true;
      ++done_;
      if (sync() && arrived_ > 0)
        throw Error(str("parameter server: worker rank ", w,
                        " finished while other workers "
                        "pushed step ",
                        steps_clock(),
                        "; in sync mode every worker runs the same "
                        "steps (this is a bug)"));
      break;
    default:
      throw CommError(str("parameter server: server rank ", ps_.rank(), " got request kind ",
                          h.kind, " from rank ", w,
                          "; is that rank running the parameter-server "
                          "layout with the same config?"));
  }
}

void ServerLoop::record_staleness(int64_t s, double count) {
  const int bin = static_cast<int>(
      std::min<int64_t>(std::max<int64_t>(s, 0), ParameterServer::kStalenessBins - 1));
  stats_[ParameterServer::kStatHistogram + bin] += count;
  stats_[ParameterServer::kMaxStaleness] =
      std::max(stats_[ParameterServer::kMaxStaleness], static_cast<double>(s));
}

// A push's gradient came in unit shards during the worker's backward (its buckets; compressed
// ones decoded as they arrived), and the request's factor scales it. A skip (fp16 skipped the
// worker's step: its gradient overflowed after the buckets had left) drops it.
void ServerLoop::push(int w) {
  Worker& k = workers_[static_cast<size_t>(w)];
  const bool skip = k.request.skip != 0;
  for (comm::Work& g : k.grad_works) g.wait(deadline());
  if (!skip) {
    decode_arrived(w, true);  // the rest of the compressed messages
    const float scale = std::bit_cast<float>(static_cast<uint32_t>(k.request.scale));
    k.factor = scale;  // deterministic: the optimizer's gradient scale
    if (!exact() && scale != 1.0f) {
      float* g = k.grad.data<float>();
      for (size_t i = 0; i < len_; ++i) g[i] *= scale;
    }
  }
  stats_[ParameterServer::kBytesIn] += compressed() ? static_cast<double>(msg_bytes_)
                                       : exact() ? 8.0 * static_cast<double>(len_ + k.scales.size())
                                                 : 4.0 * static_cast<double>(len_);
  stats_[ParameterServer::kPushes] += 1;
  const int64_t clock = k.request.clock, held = k.request.held;
  k.clock = clock;
  k.holds = -1;  // the batch it trained is done
  if (sync()) {
    if (clock - 1 != steps_clock() || k.arrived)
      throw Error(str("parameter server: worker rank ", w, " pushed the gradient of step ",
                      clock - 1, " computed on version ", held, " while server rank ", ps_.rank(),
                      " collects step ", steps_clock(),
                      "; sync workers must push every step "
                      "once (this is a bug)"));
    k.arrived = true;
    k.skipped = skip;
    if (++arrived_ == W_) apply_sync();
    return;
  }
  if (skip) {  // nothing to apply; the step counts towards the lr clock like an update
    ++applied_;
    post_grad(w);
    return;
  }
  // Async and ssp: apply now. The push is one worker's share of the global-mean gradient;
  // times W it estimates the whole gradient, so an update has the size of a sync update. An
  // update computed on a version `s` updates old is scaled by 1 / (1 + s) (ps.stale_lr).
  const double t0 = now_seconds();
  const int64_t staleness = version() - held;
  TraceSpan span("apply push", "ps");
  if (TraceArgs* args = span.args())
    args->num("worker", w)
        .num("staleness", static_cast<double>(staleness))
        .num("bytes", 4.0 * len_);
  record_staleness(staleness, 1);
  float lr = (*lr_)(steps_clock());
  if (inverse_) lr /= static_cast<float>(1 + std::max<int64_t>(staleness, 0));
  float* g = grads();
  const float scale = static_cast<float>(W_);
  const float* pushed = k.grad.data<float>();
  for (size_t i = 0; i < len_; ++i) g[i] = pushed[i] * scale;
  apply(lr);
  stats_[ParameterServer::kGradientsApplied] += 1;
  stats_[ParameterServer::kUpdates] += 1;
  ++applied_;
  post_grad(w);
  stats_[ParameterServer::kApplySeconds] += now_seconds() - t0;
}

void ServerLoop::apply_sync() {
  TraceSpan span("apply sync update", "ps");
  const double t0 = now_seconds();
  // A skip from any worker skips the step (the workers agree on overflows: worker_sync), so
  // that the version stays and the pulls bring nothing new.
  const bool skip =
      std::any_of(workers_.begin(), workers_.end(), [](const Worker& k) { return k.skipped; });
  if (!skip) {
    // The replies of the last version went out straight from the shard: they must have landed.
    for (Worker& k : workers_) wait_all(k.data_works);
    if (exact()) {
      sum_exact();
    } else {
      // Summed in worker order, so the result does not depend on arrival order. Each push
      // already carries its rows' share of the global mean: the sum is the global-mean gradient.
      float* g = grads();
      std::memcpy(g, workers_[0].grad.data<float>(), len_ * sizeof(float));
      for (int w = 1; w < W_; ++w) {
        const float* src = workers_[static_cast<size_t>(w)].grad.data<float>();
        for (size_t i = 0; i < len_; ++i) g[i] += src[i];
      }
    }
    apply((*lr_)(steps_clock()), exact() ? workers_[0].factor : 1.0f);
    stats_[ParameterServer::kGradientsApplied] += W_;
    stats_[ParameterServer::kUpdates] += 1;
    record_staleness(0, W_);
  }
  ++sync_updates_;
  arrived_ = 0;
  for (int w = 0; w < W_; ++w) {
    Worker& k = workers_[static_cast<size_t>(w)];
    k.arrived = false;
    post_grad(w);  // its payload was taken
    k.skipped = false;
  }
  stats_[ParameterServer::kApplySeconds] += now_seconds() - t0;
}

// Deterministic mode: the workers' integer sums added (exact: any order gives the same sums)
// and turned back into the gradient at the scales the workers agreed, as one worker's exact sum
// would; the factor (fp16's loss scale) is the optimizer's gradient scale.
void ServerLoop::sum_exact() {
  const Worker& first = workers_[0];
  for (const Worker& k : workers_)
    if (k.scales != first.scales ||
        std::bit_cast<uint32_t>(k.factor) != std::bit_cast<uint32_t>(first.factor))
      throw Error(str("parameter server: server rank ", ps_.rank(), ": the workers pushed step ",
                      steps_clock(),
                      " at different scales or factors; deterministic workers agree on them "
                      "(this is a bug)"));
  int64_t* sums = sums_.data<int64_t>();
  std::copy_n(first.sums.data<int64_t>(), len_, sums);
  for (int w = 1; w < W_; ++w) {
    const int64_t* src = workers_[static_cast<size_t>(w)].sums.data<int64_t>();
    for (size_t i = 0; i < len_; ++i) sums[i] += src[i];
  }
  ExactSum::dequantise(sums, ps_.server_.range, scale_buckets_, first.scales, grads());
}

void ServerLoop::stuck(double idle_s) {
  std::string waiting, silent;
  for (int w = 0; w < W_; ++w) {
    const Worker& k = workers_[static_cast<size_t>(w)];
    if (k.done) continue;
    if (k.pending)
      waiting += str(waiting.empty() ? "" : ", ", w, " (clock ", k.pull_clock, ")");
    else
      silent += str(silent.empty() ? "" : ", ", w, " (clock ", k.clock, ")");
  }
  const std::string msg =
      str("parameter server: server rank ", ps_.rank(), " (", name_of(ps_.spec_.ps_mode), ", step ",
          steps_clock(), ") heard nothing for ", idle_s,
          " s (comm.timeout_s); waiting for worker rank(s) ",
          silent.empty() ? std::string("none") : silent, "; worker rank(s) ",
          waiting.empty() ? std::string("none") : waiting,
          " wait for their reply; a silent worker is stuck or died");
  world_.abort(msg);
  throw CommError(msg);
}

nlohmann::json ParameterServer::serve(const std::function<float(int64_t)>& lr) {
  TESSEL_CHECK(is_server(), "parameter server: rank ", rank(), " is not a server");
  return loop_->run(lr);
}

}  // namespace tessel::parallel
