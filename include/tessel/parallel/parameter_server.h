// ParameterServer: the strategy of a layout with ps.servers = S. The last S ranks are servers,
// the others workers. Server k owns a contiguous element range of the parameter arena (balanced
// by bytes, cut at parameter boundaries where that costs little), keeps the optimizer state of
// that range and applies every update to it; workers hold a full copy of the parameters, compute
// gradients on their slice of each batch, push them to the servers and pull the shards that
// changed. Every message carries a version: a server's version is the number of updates it has
// applied (its optimizer's step count), a worker's clock the number of steps it has pushed.
// Modes (docs/parameter_server.md): sync (lockstep: every worker trains its slice of every
// batch; one averaged update per step: equals data parallel), async and ssp (not lockstep: the
// first server hands each epoch's worker batches out one claim at a time, riding on the pulls;
// each push is applied at once; in ssp a claim at step c is granted only while every batch in
// progress is at step c - ps.staleness or later). One object per rank, used by that rank's
// thread; a server rank spends its whole run inside serve().
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/strategy.h"

namespace tessel::parallel {

class ParameterServer : public Strategy {
 public:
  enum class Mode { kSync, kAsync, kSsp };

  // Collective over world (servers included): builds the worker sub-communicator. Throws
  // InvalidArgument for a mode, staleness or debug.slow_rank that cannot work.
  ParameterServer(const ParallelSpec& spec, comm::Communicator& world, const Layout& layout,
                  nn::Model& model);
  // A worker that got as far as talking to the servers tells them it is done (unless an
  // exception is unwinding: the servers then fail at their deadline or with the aborted group).
  ~ParameterServer() override;

  std::string layout() const override { return layout_.str(); }
  int rank() const override { return world_.rank(); }
  int world_size() const override { return world_.size(); }
  int data_rank() const override { return is_server() ? 0 : rank(); }
  int data_size() const override { return layout_.workers(); }
  bool is_server() const override { return layout_.is_server(rank()); }
  bool lockstep() const override { return mode_ == Mode::kSync; }
  void set_claims(const Claims& claims) override;
  int64_t claim() override;
  nlohmann::json serve(optim::Optimizer& opt, const std::function<float(int64_t)>& lr) override;

  void on_start() override {}
  void begin_backward(bool) override {}
  void after_block_backward(size_t) override {}
  PieceResult train_piece(const Piece& piece, nn::CrossEntropyLoss& loss) override;
  PieceResult eval_piece(const Piece& piece, nn::CrossEntropyLoss& loss) override;
  void collect_shard() override;
  void step(optim::Optimizer& opt, float lr, float clip_norm, int64_t step) override;
  void consolidate(optim::Optimizer& opt) override;
  void sum(double* values, int n) override;
  void max(double* values, int n) override;
  std::vector<double> gather(double value) override;
  nlohmann::json take_metrics() override;

  Mode mode() const { return mode_; }
  // Server k's element range [lo, hi) of the parameter arena.
  std::pair<int64_t, int64_t> shard(int k) const { return shards_[static_cast<size_t>(k)]; }

  // Wire format, shared by the two sides (parameter_server.cc, parameter_server_serve.cc).
  // Per (worker, server) pair: requests and replies are 6 x int64 on their own tags; gradient,
  // parameter and optimizer-state payloads follow on theirs (matched in order per tag).
  enum Kind : int64_t { kHello = 1, kPull, kEvalPull, kPushPull, kConsolidate, kStats, kDone };
  static constexpr int kTagRequest = 101, kTagGrad = 102, kTagReply = 103, kTagParams = 104,
                       kTagState = 105;
  // request: kind, clock, held version, then (to server 0, claiming) epoch + 1, first, limit
  //          of the claimed range (0, 0, 0: no claim);
  // reply:   version, has data, optimizer steps, the batch claimed (-1: none left), 0, 0.
  using Header = std::array<int64_t, 6>;
  static constexpr int kStalenessBins = 32;  // 0..30 exact, the last counts 31 and more
  // Server counters (kStats payload): totals since serve() started.
  enum Stat : int {
    kPushes, kGradientsApplied, kUpdates, kPulls, kPullsWithData, kBytesIn, kBytesOut,
    kApplySeconds, kIdleSeconds, kMaxStaleness,
    // sync: largest (pulling worker's clock - slowest worker's clock) a pull was answered at;
    // async, ssp: largest (step of a granted claim - step of the oldest batch in progress)
    kMaxLead,
    kStatHistogram  // kStalenessBins histogram entries follow
  };
  static constexpr int kStatCount = kStatHistogram + kStalenessBins;

 private:
  int server_index() const { return rank() - layout_.workers(); }
  int server_rank(int k) const { return layout_.workers() + k; }
  double timeout() const { return world_.options().timeout_s; }
  void start(int64_t clock);               // the first contact: hello to every server
  void request(Kind kind, int64_t clock);  // sends a request to every server
  void await_replies(const char* what);    // receives every server's reply (and changed shards)
  void pull(Kind kind);
  friend class ServerLoop;  // parameter_server_serve.cc

  comm::Communicator& world_;
  Layout layout_;
  Groups groups_;
  Mode mode_ = Mode::kSync;
  std::vector<std::pair<int64_t, int64_t>> shards_;

  // Worker state.
  bool started_ = false;
  bool evaluated_ = false;  // pulled for evaluation since the last training step
  int64_t clock_ = 0;       // steps pushed (async, ssp: 1 + the global step of the last push)
  static constexpr int64_t kNotAsked = -2;
  Claims claims_;                // the range claimed from (async, ssp)
  bool claiming_ = false;        // the exchange in flight claims a batch
  int64_t claimed_ = kNotAsked;  // what the last exchange claimed (-1: none left)
  int64_t pushes_ = 0;           // batches pushed in this invocation
  std::vector<int64_t> held_;  // version of each server's shard held
  std::vector<Header> request_, reply_;
  std::vector<comm::Work> sends_;
  // Measurements since the last take_metrics() (comm_exposed_seconds) and, for the ps_*
  // figures, totals since this invocation started, like the servers' counters.
  double wait_s_ = 0;   // waiting for replies (pull, sync and ssp waits)
  double push_s_ = 0;   // clipping and handing gradients over
  double slow_s_ = 0;   // debug.delay_ms sleeps
  double total_wait_s_ = 0, total_slow_s_ = 0;
  int64_t pulls_with_data_ = 0;
};

}  // namespace tessel::parallel
