// Pipeline model parallelism (pp.stages = P), the executor of a pipeline stage. The model's
// blocks are cut into chunks (contiguous block ranges); chunk c runs on stage
// Partition::stage[c] -- one chunk per stage for balanced / uniform / explicit cuts, several
// interleaved chunks per stage for pp.schedule = interleaved (chunks s, s + P, ...) and
// round_robin. Each piece of a step is cut into pp.microbatches micro-batches; a static schedule
// (gpipe, 1f1b, interleaved or zb-h1: schedule.h) orders every stage's forward and backward tasks
// (under zb-h1 each backward split into B and a later W, Module::backward_weights),
// activations travel forward and activation gradients backward with point-to-point messages on one
// two-rank communicator per chunk boundary and direction, so a send never waits behind a receive. A
// stage keeps one set of activation caches per micro-batch in flight (the blocks themselves hold no
// activations). Gradients accumulate over the micro-batches; the gradient sync over the dp group
// reduces them like plain data parallelism. A GPT's tied LM head on another stage than its
// embedding keeps a copy of the token table: it sends its share of the table gradient to the
// embedding's stage per micro-batch (under zb-h1 once, summed, with the last W), and the updated
// table comes back after each step (sync_tied_table). On device ranks (runtime.device = cuda)
// the tensors live in device memory and each link also has its DeviceCollectives (NCCL, or
// copies through the host for ranks sharing a GPU), which carry them; the headers (dtype,
// shape) and the tied table's values, read back from the store, stay on the link's host
// communicator. With train.offload = activations a device stage keeps the caches of its
// micro-batches in flight in pinned host memory between their forward and backward
// (pipeline_offload.cc, docs/gpu.md). One per rank, used by its thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"
#include "tessel/parallel/executor.h"
#include "tessel/parallel/param_store.h"
#include "tessel/parallel/schedule.h"
#include "tessel/parallel/spec.h"

namespace tessel {
class Tracer;
}

namespace tessel::parallel {

class ActivationOffload;

// The partition pp.partition / pp.cuts give `model` over `stages` stages. Throws
// InvalidArgument for more stages than blocks and for cuts of the wrong count, out of order or
// out of range.
Partition make_partition(const ParallelSpec& spec, nn::Model& model, int stages);

// One task as it ran (seconds since the start of the piece's schedule), for the trace picture.
struct TraceEvent {
  TaskOp op;
  int chunk, micro;
  double start, end;
};

class PipelineExecutor final : public Executor {
 public:
  // On device ranks: the collectives of one link (collective over its two ranks), *kind
  // saying which (the Engine's make_device_collectives).
  using DeviceLinks = std::function<std::unique_ptr<comm::DeviceCollectives>(
      comm::Communicator& link, std::string* kind)>;

  // pp: this rank's pipeline (its stages, in stage order). Collective over pp (builds the
  // links; device_links, set on device ranks, gives each its device path). Throws
  // InvalidArgument for a partition or schedule that cannot run.
  PipelineExecutor(const ParallelSpec& spec, comm::Communicator& pp, nn::Model& model,
                   DeviceLinks device_links = nullptr);
  ~PipelineExecutor() override;

  PieceStats train(const Piece& piece, nn::Loss& loss, const Hooks& hooks) override;
  PieceStats eval(const Piece& piece, nn::Loss& loss, const Hooks& hooks) override;
  void idle(const Hooks& hooks, bool training, bool last) override;
  const std::vector<bool>& local_blocks() const override { return local_; }
  void take_stats(RankStats& s) override;

  // Collective over the pipeline: the stages agree on partition and schedule; the head's copy
  // of a tied table takes the embedding stage's values (store: where those live).
  void start(ParamStore& store) override;
  // After each step's update: the embedding stage sends the new tied table to the head's stage.
  void end_step(ParamStore& store) override { sync_tied_table(store); }
  void sync_tied_table(ParamStore& store);

  // Throws InvalidArgument unless pp.microbatches divides `rows`, the rows of a replica's
  // slice of a full batch (the engine checks every replica's before the first step).
  void check_batch_rows(int64_t rows) const override;
  // The chunks: pipeline_chunks (pipeline_report.cc).
  nlohmann::json plan() const override;
  // Per stage: its times, bubble and traffic; the schedule, partition and model bubble.
  nlohmann::json report(const std::vector<RankStats>& ranks, const Layout& layout) const override;

  int stage() const { return stage_; }
  // Every stage's training schedule for pp.microbatches micro-batches.
  const std::vector<std::vector<Task>>& schedule() const {
    return schedules_.at({static_cast<int>(spec_.pp_microbatches), true});
  }
  // The last training piece's tasks as they ran on this rank.
  const std::vector<TraceEvent>& trace() const { return trace_; }

 private:
  struct Link;      // one direction of one chunk boundary (or the tied-table path)
  struct Inflight;  // a micro-batch between its forward and backward on one chunk
  struct Pending {  // a send in progress (on the host or a device link) and the bytes it reads
    comm::Work work;
    Tensor keep;
    std::shared_ptr<std::vector<int64_t>> header;
    comm::NcclWork device_work;
  };

  void find_tied_table();
  void build_links();
  const std::vector<std::vector<Task>>& schedule_for(int micro, bool training);
  void plan_micro_batches(int64_t rows);
  nn::Activations* acquire(int chunk);
  nn::Activations* inflight_acts(int chunk, int micro) const;  // null: not in flight
  void send(Link& link, const Tensor& t);
  // expect: the shape (and expect_type the type) the message must have; null: any, rows first.
  Tensor recv(Link& link, int64_t rows, const Shape* expect, const std::string& what,
              DType expect_type = DType::kF32);
  void wait_sends();
  PieceStats run(const Piece& piece, nn::Loss& loss, const Hooks& hooks, bool training);
  void forward_task(const Task& t, const Piece& piece, nn::Loss& loss, const Hooks& hooks,
                    bool training, PieceStats& result);
  void backward_task(const Task& t, const Piece& piece, const Hooks& hooks);
  void weight_task(const Task& t, const Piece& piece, const Hooks& hooks);  // zb-h1's W
  // The tied table's gradient: the head's share (received on the embedding's stage), added
  // into the table's gradient at the owner's kBeforeBackward, and sent by the head's chunk.
  Tensor recv_tied_grad();
  void add_tied_grad(nn::Phase p, size_t block, const Tensor& tied_grad);
  void send_tied_grad(int chunk);
  void trace_task(Tracer& tracer, const Task& t);  // the task's span (task_start_, task_end_)
  // train.offload = activations between the tasks (pipeline_offload.cc): before task k of
  // `order`, the prefetch for the backward after it; after a forward, its caches out.
  void offload_before(const std::vector<Task>& order, size_t k);
  void offload_after(const std::vector<Task>& order, size_t k);
  // Around block b of a micro-batch of `chunk`: the offload's moves, block b's own cache out
  // after its forward (not the chunk's last), and the chunk's shared scratch of block b
  // released after its forward and after its backward.
  void offload_block(nn::Phase p, size_t b, int chunk, nn::Activations& acts);

  ParallelSpec spec_;
  comm::Communicator& pp_;
  nn::Model& model_;
  int stage_ = 0, stages_ = 1;
  bool split_ = false;  // zb-h1: backwards split into B and W tasks (Module::set_defer_weights)
  Partition part_;
  std::vector<bool> local_;
  std::vector<std::unique_ptr<Link>> fwd_, bwd_;  // by boundary c (chunk c -> c + 1)
  std::unique_ptr<Link> tied_;         // head stage -> embedding stage (null: same stage / none)
  DeviceLinks device_links_;           // null on the host
  std::string device_comm_;            // which device path the links took ("" on the host)
  int tied_from_ = -1, tied_to_ = -1;  // chunks of the LM head and of the embedding
  size_t tied_owner_ = 0;              // the block owning the table
  nn::Parameter* tied_param_ = nullptr;
  nn::Range tied_range_;           // the table's arena elements
  Tensor tied_value_, tied_grad_;  // the head stage's copy of the table
  std::map<std::pair<int, bool>, std::vector<std::vector<Task>>> schedules_;
  // Activation caches per chunk: every set ever used, the free ones, and a scratch set shared
  // by a chunk's micro-batches for the backward's short-lived outputs.
  std::map<int, std::vector<std::unique_ptr<nn::Activations>>> acts_;
  std::map<int, std::vector<nn::Activations*>> free_;
  std::map<int, nn::Activations> scratch_;
  std::map<std::pair<int, int>, Inflight> inflight_;
  std::vector<Pending> pending_;
  // train.offload = activations: the caches of micro-batches in flight wait in host memory
  // (src/parallel/offload.h); null without. After the caches: it goes first.
  std::unique_ptr<ActivationOffload> offload_;

  // Per-piece facts the tasks use.
  std::vector<int64_t> micro_rows_, micro_first_;
  int64_t piece_rows_ = 0;
  double t0_ = 0;                         // start of the piece's schedule
  double task_start_ = 0, task_end_ = 0;  // the last task's compute (after its receives)

  std::vector<TraceEvent> trace_;
  // Measurements since the last take_stats().
  double forward_s_ = 0, backward_s_ = 0, send_s_ = 0, recv_s_ = 0, span_s_ = 0, sent_bytes_ = 0;
  int peak_inflight_ = 0;
};

}  // namespace tessel::parallel
