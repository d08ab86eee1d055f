// ServerLoop: one parameter server's event loop (ParameterServer::serve). Private to the
// parallel area: parameter_server_serve.cc receives and applies pushes, parameter_server_replies.cc
// answers pulls (claims, replies, stats, checkpoints). The protocol is described at the top of
// parameter_server_serve.cc.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "compress/push_codec.h"
#include "grad_syncs.h"
#include "tessel/parallel/parameter_server.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

using Request = ParameterServer::Request;
using Reply = ParameterServer::Reply;

// Built with the server's shard at set-up (its receive buffers count against
// runtime.memory_limit_mb there, and in the dry run's memory); run() is serve().
class ServerLoop {
 public:
  explicit ServerLoop(ParameterServer& ps)
      : ps_(ps),
        world_(ps.world_),
        opt_(*ps.server_.optimizer),
        W_(ps.workers()),
        inverse_(ps.spec_.ps_stale_lr == StaleLr::kInverse),
        stats_(ParameterServer::kStatCount, 0.0) {
    len_ = static_cast<size_t>(ps.server_.range.size());
    unit_shards_ = ps.unit_shards(ps.server_index());
    if (const CompressKind kind = ps.spec_.compress.kind; kind != CompressKind::kNone)
      for (const nn::Range& p : unit_shards_) {
        msg_at_.push_back(msg_bytes_);
        codecs_.push_back(std::make_unique<compress::PushCodec>(kind, p.size(), ps.spec_.compress));
        msg_bytes_ += codecs_.back()->message_bytes();
      }
    if (ps.spec_.deterministic) {
      scale_buckets_ = ranges_of(ps.units_);
      sums_ = flat_zeros(static_cast<int64_t>(len_), MemCategory::kGradients, DType::kI64);
    }
    // Each worker's receive buffers, charged to the server's comm buffers.
    const int64_t n = static_cast<int64_t>(len_);
    const MemCategory comm = MemCategory::kComm;
    workers_.resize(static_cast<size_t>(W_));
    for (Worker& w : workers_) {
      if (exact()) {
        w.sums = flat_zeros(n, comm, DType::kI64);
        w.scales.resize(scale_buckets_.size());
      } else {
        w.grad = flat_zeros(n, comm);
      }
      if (compressed()) w.msg = flat_zeros(static_cast<int64_t>(msg_bytes_), comm, DType::kU8);
      if (ps.mode_ != ParameterServer::Mode::kSync) w.snapshot = flat_zeros(n, comm);
    }
  }

  // Serves the workers until each has said it is done; lr(step) is the schedule.
  nlohmann::json run(const std::function<float(int64_t)>& lr);

 private:
  struct Worker {
    Request request;
    Reply reply;
    Tensor grad, snapshot;  // f32
    Tensor msg;             // u8, compressed: the push's messages, decoded into grad
    // train.deterministic: the push's int64 sums of its micro-shards, the scales they were taken
    // at (one per scale bucket), and the factor of its request
    Tensor sums;
    std::vector<double> scales;
    float factor = 1.0f;
    // After the buffers: destroyed first, cancelling receives still posted into them.
    comm::Work request_work, reply_work;
    std::vector<comm::Work> data_works;  // a reply's parameters: one message per unit shard
    std::vector<comm::Work> grad_works;  // the push's payload: one message per unit shard
    size_t decoded = 0;                  // compressed: its first messages already decoded
    int64_t clock = 0;
    bool hello = false, done = false, arrived = false;
    bool skipped = false;  // sync: its push of the step being collected was a skip
    bool pending = false;  // a pull waiting for the mode's condition
    int64_t pull_kind = 0, pull_clock = 0, pull_held = -1;
    bool wants_claim = false;  // server 0: the pending pull claims a batch
    int64_t holds = -1;        // server 0: step of the batch it trains (-1: none)
  };

  int peer(int w) const { return w; }  // workers are world ranks 0..W-1
  int64_t version() const { return opt_.steps(); }
  // The server's progress in steps (its lr clock, and the clock of a worker whose hello
  // carried none): the workers' starting step plus the updates since, counting W async
  // updates as one step. Not derived from the version, so a run may resume in another mode.
  int64_t steps_clock() const {
    return std::max<int64_t>(base_clock_, 0) + (sync() ? sync_updates_ : applied_ / W_);
  }
  bool sync() const { return ps_.mode_ == ParameterServer::Mode::kSync; }
  bool exact() const { return !scale_buckets_.empty(); }  // train.deterministic
  bool compressed() const { return !codecs_.empty(); }    // compress.kind
  comm::Deadline deadline() const { return comm::Deadline::after(ps_.timeout()); }
  void wait_all(std::vector<comm::Work>& works) {
    for (comm::Work& w : works) w.wait(deadline());
    works.clear();
  }
  float* params() { return ps_.server_.values.data<float>(); }
  float* grads() { return ps_.server_.grads.data<float>(); }
  // One optimizer step over the whole shard, reading the gradient times grad_scale.
  void apply(float lr, float grad_scale = 1.0f) {
    const optim::Segment seg{params(), grads(), static_cast<int64_t>(len_), 0};
    opt_.step({&seg, 1}, lr, grad_scale);
  }

  void post(int w);
  void post_grad(int w);
  bool decode_arrived(int w, bool wait);
  void handle(int w);
  void push(int w);
  void apply_sync();
  void sum_exact();
  void answer_pulls();
  void open_claims(int w);
  int64_t grant(Worker& k);
  int64_t oldest_held(const Worker* except) const;
  bool allowed(const Worker& w) const;
  void reply(int w);
  void send_stats(int w);
  void write_checkpoint(int w, int64_t path_bytes);
  void send_values(int w);
  void record_staleness(int64_t s, double count);
  [[noreturn]] void stuck(double idle_s);

  ParameterServer& ps_;
  comm::Communicator& world_;
  optim::Optimizer& opt_;
  const std::function<float(int64_t)>* lr_ = nullptr;  // run()'s
  const int W_;
  const bool inverse_;
  size_t len_ = 0;
  // Server's shard of every unit in the order the backward completes them: the pushes'
  // messages; backwards, the order the replies send them (what the forward reads first)
  std::vector<nn::Range> unit_shards_;
  // compress.kind != none: per unit shard its decoder and its message's offset in Worker::msg
  std::vector<std::unique_ptr<compress::PushCodec>> codecs_;
  std::vector<size_t> msg_at_;
  size_t msg_bytes_ = 0;
  std::vector<nn::Range> scale_buckets_;  // train.deterministic: the workers' (arena ranges)
  Tensor sums_;                           // train.deterministic: the step's integer sum (i64)
  std::vector<Worker> workers_;
  int done_ = 0, arrived_ = 0;
  int64_t base_clock_ = -1;                 // set by the first hello (-1: none yet)
  int64_t sync_updates_ = 0, applied_ = 0;  // since serve() started
  // Server 0's claims (async, ssp): the open range of worker batches, the next index to hand
  // out, and the grants since serve() started (across epochs: their step numbering).
  int64_t claim_epoch_ = -1, claim_first_ = 0, claim_next_ = 0, claim_limit_ = 0, grants_ = 0;
  std::vector<double> stats_;
};

}  // namespace tessel::parallel
