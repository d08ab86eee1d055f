// ParameterServer: the parameter-server part of an Engine (ps.servers = S). The last S ranks
// are servers, the others workers. Server k owns a contiguous element range of the parameter
// arena (balanced by bytes, cut at parameter boundaries where that costs little), keeps its
// values and the optimizer state of that range and applies every update to it; workers hold a
// full copy of the parameters, compute gradients on their slice of each batch, push them to the
// servers and pull the shards that changed. Every message carries a version: a server's version
// is the number of updates it has applied (its optimizer's step count), a worker's clock the
// number of steps it has pushed.
// Modes (docs/parameter_server.md): sync (lockstep: every worker trains its slice of every
// batch; one averaged update per step: equals data parallel), async and ssp (not lockstep: the
// first server hands each epoch's worker batches out one claim at a time, riding on the pulls;
// each push is applied at once; in ssp a claim at step c is granted only while every batch in
// progress is at step c - ps.staleness or later). To the Engine it is the store (a remote one:
// a worker's update pushes its gradient and pulls the values, a server rank serves) and, when
// not lockstep, the worker's batch claims. One object per rank, used by that rank's thread; a
// server rank spends its whole run inside serve().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/core/memory.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/engine.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

namespace compress {
class PushCodec;
}  // namespace compress
class ExactPushSync;  // grad_syncs.h
class ServerLoop;     // server_loop.h

// Server k's range of the arena: contiguous, about n / servers elements each, a cut moved to
// the nearest parameter boundary when that changes a shard by at most an eighth (the planner
// sizes a server's memory with it too).
std::vector<nn::Range> server_shards(const nn::Model& model, int servers);

class ParameterServer final : public ParamStore, public BatchClaims, public BlockHooks {
 public:
  using Mode = PsMode;

  // Throws InvalidArgument for a mode or staleness that cannot work. A worker materializes the
  // whole model (values initialised from seed; held() is the whole arena, it owns and updates
  // nothing); a server its range of values, gradients and optimizer state.
  ParameterServer(const ParallelSpec& spec, Mesh& mesh, nn::Model& model, uint64_t seed,
                  const optim::OptimSpec& optim);
  // A worker that got as far as talking to the servers and did not finish() tells them it is
  // done (unless an exception is unwinding: the servers then fail at their deadline or with
  // the aborted group).
  ~ParameterServer() override;
  // A worker's gradient sync over `units` (the whole model): its own rows' gradient, nothing to
  // reduce (the servers sum the pushes); its norm is that of the worker's estimate of the whole
  // gradient, W x its own for W workers, which train.clip_norm bounds (so in sync mode the sum
  // of the pushes stays within it). fp16 in sync mode: the norm is non-finite on every worker
  // when any worker's gradient overflowed (one flag all-reduced over the workers), so that
  // they all skip the step, as one worker's loss scaling would.
  // The worker's pushes go out through its buckets (the units of ddp.bucket_mb, the same on
  // every rank): each unit's gradient is sent to the servers holding it as soon as the backward
  // is done with it (on_block), overlapped with the rest of the backward; the step's request
  // then carries the factor (loss scale, clipping) the servers multiply it by. Compressed
  // pushes (compress.kind) go the same way: each unit shard (a unit's part of one server's
  // range) is encoded unscaled by its own codec, which keeps its own top-k residual (in raw
  // gradient units), and the server decodes it before applying the factor.
  // train.deterministic (sync mode): the worker keeps every micro-shard's
  // gradient apart; at the step the workers agree the scales one worker would pick and each
  // pushes its shards' int64 sums at them and the scales; the servers add the integers of every
  // worker (any order, the same sums), turn them back to floats as data parallel's exact sum
  // does (exact_sum.h) and apply the request's factor as the optimizer's gradient scale: one
  // worker's bits. Its norm only says whether fp16 overflowed (clip_norm is refused).
  std::unique_ptr<GradSync> worker_sync(nn::Model& model, const Units& units);
  void on_block(nn::Phase phase, size_t block, bool last) override;

  bool is_server() const { return mesh_.is_server(); }
  // Lockstep (sync): every worker trains its slice of every global batch. Otherwise (async,
  // ssp) the Trainer trains whole worker batches claimed one at a time (set_claims, claim).
  bool lockstep() const { return mode_ == Mode::kSync; }
  // BatchClaims: the claim of the next batch rides on the push.
  void set_claims(const Range& claims) override;
  int64_t claim() override;

  // ParamStore, worker: the step clips this worker's gradient by grad_scale, pushes it and
  // pulls new values; a step that fp16's loss scaling skipped (no update() before end_step())
  // pushes a skip instead: the servers apply nothing for it (sync: the whole step is skipped)
  // and its pull brings nothing new but what other workers' updates made; before a training or
  // evaluation piece the first contact says hello (an
  // evaluation first pulls what every worker's steps so far have made); finish() tells the
  // servers it is done, so that serve() returns. The values are held in f32; with a working
  // copy (bf16) it is refreshed after every pull that brings new ones.
  void update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
              int64_t step) override;
  float* values(nn::Range r) override;
  void copy_values(nn::Range r, float* dst) override;
  void begin_pass(bool training, int64_t step) override;
  void end_step(int64_t step) override;
  void finish() override;
  // Checkpoints: a server owns its range; a worker nothing (it pulls after a restore).
  StateView state(optim::Optimizer* opt) override;
  // Worker: what its compressed pushes carry from step to step (the top-k residuals) as one
  // vector whose first value is its length, then one value per arena element (arena order, so
  // it does not depend on ddp.bucket_mb or the server count); empty when they carry none.
  std::vector<float> save_state() override;
  void load_state(const std::vector<float>& state) override;
  // Rank 0: asks every server to write its shard of a checkpoint into dir; returns them and
  // the servers' optimizer step count.
  std::vector<ckpt::ShardFile> write_remote(const std::string& dir,
                                            int64_t* optimizer_steps) override;
  // Rank 0: feeds every server's values, in arena order, to `consume(range, values)`.
  void read_remote(const std::function<void(nn::Range, const float*)>& consume) override;
  // Collective over the workers (rank 0 asks the servers): the layout's figures for the report.
  nlohmann::json report() override;
  // A server rank: serves pushes and pulls until every worker has said goodbye. `lr(step)` is
  // the schedule. Returns the server's figures.
  nlohmann::json serve(const std::function<float(int64_t)>& lr) override;
  // Worker: adds the time waited for the servers since the last call; reads the sync's
  // debug.delay_ms sleeps (RankStats::delay_s) into ps_worker_delay_seconds, so the Engine
  // takes the store's stats after the sync's.
  void take_stats(RankStats& s) override;

  // Wire format, shared by the two sides (parameter_server.cc, parameter_server_serve.cc). Per
  // (worker, server) pair a request and a reply travel on their own tags as int64 words;
  // gradient, parameter and optimizer-state payloads follow on theirs (matched in order per tag).
  // kCheckpoint: `clock` is the length of the folder path that follows on kTagState; the reply
  // is followed by the shard's description (JSON, has_data bytes) on kTagState. kValues: the
  // reply is followed by the server's values on kTagParams.
  enum Kind : int64_t {
    kHello = 1,
    kPull,
    kEvalPull,
    kPushPull,
    kStats,
    kCheckpoint,
    kValues,
    kDone
  };
  static constexpr int64_t kWireVersion = 5;  // 5: the servers' memory peaks in kStats
  struct Request {
    int64_t wire = kWireVersion;
    int64_t kind = 0;
    int64_t clock = 0;  // the worker's clock (hello: its step, -1: the servers' own)
    int64_t held = -1;  // the server version of the shard the worker holds
    // A claim (to server 0, async/ssp): epoch + 1 (0: no claim) and the range [first, limit).
    int64_t claim_epoch = 0, claim_first = 0, claim_limit = 0;
    // kPushPull: 1 for a step skipped on overflow (the servers drop its gradient, which its
    // buckets sent during the backward).
    int64_t skip = 0;
    // kPushPull: the float bits of the factor the servers multiply the pushed (decoded)
    // gradient by (the loss scale's inverse times the clipping).
    int64_t scale = 0;
  };
  struct Reply {
    int64_t wire = kWireVersion;
    int64_t version = 0;          // the server's version
    int64_t has_data = 0;         // the shard follows on kTagParams
    int64_t optimizer_steps = 0;  // the server's optimizer step count
    int64_t claimed = -1;         // the batch claimed (-1: none left)
  };
  static constexpr size_t kRequestWords = sizeof(Request) / sizeof(int64_t);
  static constexpr size_t kReplyWords = sizeof(Reply) / sizeof(int64_t);
  static constexpr int kTagRequest = 101, kTagGrad = 102, kTagReply = 103, kTagParams = 104,
                       kTagState = 105;
  static constexpr int kStalenessBins = 32;  // 0..30 exact, the last counts 31 and more
  // Server counters (kStats payload): totals since serve() started.
  enum Stat : int {
    kPushes,
    kGradientsApplied,
    kUpdates,
    kPulls,
    kPullsWithData,
    kBytesIn,
    kBytesOut,
    kApplySeconds,
    kIdleSeconds,
    kMaxStaleness,
    // sync: largest (pulling worker's clock - slowest worker's clock) a pull was answered at;
    // async, ssp: largest (step of a granted claim - step of the oldest batch in progress)
    kMaxLead,
    kMemoryPeakTotal,  // the server's ledger peak, then its peak per memory category
    kMemoryPeak,
    kStatHistogram = kMemoryPeak + kMemCategories  // kStalenessBins histogram entries follow
  };
  static constexpr int kStatCount = kStatHistogram + kStalenessBins;

  // Server k's element range [lo, hi) of the parameter arena.
  nn::Range shard(int k) const { return shards_[static_cast<size_t>(k)]; }

 private:
  // A server's range: values, the gradient being applied, and the optimizer over it.
  struct ServerShard {
    nn::Range range;
    Tensor values, grads;
    std::unique_ptr<optim::Optimizer> optimizer;
  };

  int rank() const { return mesh_.rank(); }
  int workers() const { return mesh_.layout().workers(); }
  int servers() const { return mesh_.layout().servers; }
  int server_index() const { return rank() - workers(); }
  int server_rank(int k) const { return workers() + k; }
  double timeout() const { return mesh_.world().options().timeout_s; }
  // How long a worker waits for a server: half as long again as a server waits for a worker,
  // so that a server waiting for a silent worker reports it (it knows whom it waits for) first,
  // even when its thread gets a crowded CPU late.
  static constexpr double kWorkerPatience = 1.5;  // x comm.timeout_s
  double worker_patience() const { return kWorkerPatience * timeout(); }
  void start(int64_t clock);  // the first contact: hello to every server
  // Sends a request to every server (a push's skip and factor: Request).
  void request(Kind kind, int64_t clock, bool skip = false, float scale = 1.0f);
  // A unit's part of server k's range (arena elements): one push message. Compressed
  // (compress.kind), a worker's codec encodes it and keeps its top-k residual.
  struct UnitShard {
    int server = 0;
    int index = 0;  // its place among every unit's unit shards, in model order (int8's key)
    nn::Range range;
    std::unique_ptr<compress::PushCodec> codec;
  };
  // Worker: sends unit u's gradient to the servers holding parts of it (once per step).
  void send_unit(int u);
  // Server k's shard of each unit the workers send, in the order they go out (as offsets in
  // server k's shard): each arrives as one message.
  std::vector<nn::Range> unit_shards(int k) const;
  // Receives every server's reply; the changed shards land unit by unit (land), in the order
  // the forward reads them: lazy (a push, a forward follows), as the forward reaches each unit
  // (on_block), else all before it returns.
  void await_replies(const char* what, bool lazy = false);
  void land(int u);  // waits until unit u's pulled parameters have landed (working copy too)
  void land_all();
  void pull(Kind kind);
  void push(float grad_scale, int64_t step, bool skip);
  std::vector<double> gather(double value);
  friend class ServerLoop;  // server_loop.h

  ParallelSpec spec_;
  Mesh& mesh_;
  comm::Communicator& world_;
  nn::Model& model_;
  Mode mode_ = Mode::kSync;
  std::vector<nn::Range> shards_;
  ServerShard server_;  // server ranks
  // Server ranks: its event loop (serve()) and receive buffers, built with the shard.
  std::unique_ptr<ServerLoop> loop_;
  Tensor values_;  // worker ranks: the whole model
  uint64_t seed_ = 0;
  std::vector<std::vector<UnitShard>> by_unit_;  // every unit's unit shards (model order)

  // Worker state.
  bool started_ = false;
  bool finished_ = false;   // said goodbye
  bool evaluated_ = false;  // pulled for evaluation since the last training step
  int64_t clock_ = 0;       // steps pushed (async, ssp: 1 + the global step of the last push)
  static constexpr int64_t kNotAsked = -2;
  Range claims_;                    // the range claimed from (async, ssp)
  bool claiming_ = false;           // the exchange in flight claims a batch
  int64_t claimed_ = kNotAsked;     // what the last exchange claimed (-1: none left)
  int64_t step_ = 0;                // the step being trained (begin_pass): int8's key
  int64_t pushes_ = 0;              // batches pushed in this invocation
  bool pushed_ = false;             // this step pushed (end_step)
  Units units_;                     // the buckets, in completion order below
  std::vector<int> order_;          // units in the order the backward completes them
  GradSync* sync_ = nullptr;        // worker: its gradient (worker_sync)
  ExactPushSync* exact_ = nullptr;  // worker, train.deterministic: sync_, its integer sums
  std::vector<char> sent_;          // worker, per unit: sent in this step
  std::vector<int64_t> versions_;   // version of each server's shard held
  std::vector<Request> request_;
  std::vector<Reply> reply_;
  std::vector<comm::Work> sends_;
  std::vector<std::vector<comm::Work>> landing_;  // per unit: its pulled shards still in flight
  // Measurements since the last report() (comm_exposed_seconds) and, for the ps_* figures,
  // totals since this invocation started, like the servers' counters.
  double wait_s_ = 0;  // waiting for replies (pull, sync and ssp waits)
  double push_s_ = 0;  // encoding and handing gradients over
  // Compressed pushes since the last take_stats (RankStats' compress_* and encode_s): bytes the
  // transport counted, the messages' formula, an f32 push's bytes, encoding time.
  double sent_bytes_ = 0, formula_ = 0, f32_ = 0, encode_s_ = 0;
  double total_wait_s_ = 0, total_slow_s_ = 0;
  int64_t pulls_with_data_ = 0;
};

}  // namespace tessel::parallel
