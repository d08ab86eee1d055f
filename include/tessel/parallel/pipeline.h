// Pipeline: pipeline model parallelism (pp.stages = P), optionally replicated dp times. The
// model's blocks are cut into chunks (contiguous block ranges); chunk c runs on stage
// Partition::stage[c] -- one chunk per stage for balanced / uniform / explicit cuts, several
// interleaved chunks per stage for round_robin. Each piece of a step is cut into pp.microbatches
// micro-batches; a static schedule (gpipe or 1f1b) orders every stage's forward and backward
// tasks, activations travel forward and activation gradients backward with point-to-point
// messages on one two-rank communicator per chunk boundary and direction, so a send never
// waits behind a receive. Each stage keeps one clone of its modules per micro-batch in flight
// (modules cache one forward; the clones share the parameters). Gradients accumulate over the
// micro-batches; step() all-reduces the stage's range within its dp group, clips with the
// global norm of the pipeline and updates only the owned range. A GPT's tied LM head sends its
// share of the token-table gradient to the embedding's stage per micro-batch, and the updated
// table goes back after each step. One Pipeline per rank, used by that rank's thread.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/exact_sum.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/strategy.h"

namespace tessel::parallel {

// Chunk c holds blocks [begin[c], begin[c + 1]) and runs on stage stage[c]. Chunks are in model
// order; begin.back() is the number of blocks.
struct Partition {
  std::vector<size_t> begin;
  std::vector<int> stage;
  size_t chunks() const { return stage.size(); }
};

// The partition pp.partition / pp.cuts give `model` over `stages` stages. Throws
// InvalidArgument for more stages than blocks and for cuts of the wrong count, out of order or
// out of range.
Partition make_partition(const ParallelSpec& spec, nn::Model& model, int stages);

enum class TaskOp : uint8_t { kForward, kBackward };
struct Task {
  TaskOp op;
  int chunk;
  int micro;
};

// Every stage's task order for `micro` micro-batches: "gpipe" (all forwards, then all
// backwards), "1f1b" (backward first whenever one is ready; at most min(m, chunks after the
// stage's first chunk) micro-batches in flight), or "forward" (evaluation). The orders come from
// a simulation of the schedule in unit time (forward 1, backward 2 per chunk), so each stage's
// order is consistent with one global execution order: blocking receives cannot deadlock.
std::vector<std::vector<Task>> make_schedule(const Partition& part, int stages, int micro,
                                             const std::string& kind);

// Checks a schedule before it runs: every message (activation, activation gradient, tied-table
// gradient from chunk tied_from to tied_to; -1: none) is sent and received once, in the same
// order at both ends, and the schedule completes with non-blocking sends and blocking receives.
// Throws Error naming the stage and message otherwise.
void check_schedule(const Partition& part, const std::vector<std::vector<Task>>& schedule,
                    int micro, int tied_from, int tied_to);

// One task as it ran (seconds since the start of the piece's schedule), for the trace picture.
struct TraceEvent {
  TaskOp op;
  int chunk, micro;
  double start, end;
};

class Pipeline : public Strategy {
 public:
  // Collective over world (builds the groups and links). The model's arenas must be allocated.
  Pipeline(const ParallelSpec& spec, comm::Communicator& world, nn::Model& model);
  ~Pipeline() override;

  std::string layout() const override { return layout_.str(); }
  int rank() const override { return world_.rank(); }
  int world_size() const override { return world_.size(); }
  int data_rank() const override { return layout_.replica(world_.rank()); }
  int data_size() const override { return layout_.dp; }

  void on_start() override;
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

  int stage() const { return stage_; }
  const Partition& partition() const { return part_; }
  // The last train_piece's tasks as they ran on this rank.
  const std::vector<TraceEvent>& trace() const { return trace_; }

 private:
  struct Link;      // one direction of one chunk boundary (or the tied-table path)
  struct Inflight;  // a micro-batch between its forward and backward on one chunk
  struct Pending {  // a send in progress and the bytes it reads
    comm::Work work;
    Tensor keep;
    std::shared_ptr<std::vector<int64_t>> header;
  };

  void find_tied_table();
  void build_links();
  Ranges ranges_of_stage(int stage) const;
  const std::vector<std::vector<Task>>& schedule_for(int micro, bool training);
  std::vector<nn::Module*> acquire(int chunk);
  void release(int chunk, const std::vector<nn::Module*>& slot);
  void send(Link& link, const Tensor& t);
  Tensor recv(Link& link, int64_t rows, const Shape* expect, const std::string& what);
  void wait_sends();
  PieceResult run(const Piece& piece, nn::CrossEntropyLoss& loss, bool training);
  void forward_task(const Task& t, const Piece& piece, nn::CrossEntropyLoss& loss, bool training,
                    PieceResult& result);
  void backward_task(const Task& t);
  void check_replicas(int64_t step);  // the dp replicas of this stage hold the same parameters

  comm::Communicator& world_;
  Layout layout_;
  std::unique_ptr<Groups> groups_;
  int stage_ = 0;
  Partition part_;
  std::vector<int> my_chunks_;
  Ranges owned_;                                  // element ranges of the arenas this stage updates
  std::vector<std::unique_ptr<Link>> fwd_, bwd_;  // by boundary c (chunk c -> c + 1)
  std::unique_ptr<Link> tied_;         // head stage -> embedding stage (null: same stage / none)
  int tied_from_ = -1, tied_to_ = -1;  // chunks of the LM head and of the embedding
  Tensor tied_grad_, tied_value_;      // this rank's views of the tied table
  std::map<std::pair<int, bool>, std::vector<std::vector<Task>>> schedules_;
  // Module clones per chunk: slots_[chunk][k] is one copy of the chunk's blocks; free_ lists
  // the unused ones. Slot 0 is the model's own modules.
  std::map<int, std::vector<std::vector<std::unique_ptr<nn::Module>>>> clones_;
  std::map<int, std::vector<std::vector<nn::Module*>>> free_;
  std::map<std::pair<int, int>, Inflight> inflight_;
  std::vector<Pending> pending_;
  bool checked_rows_ = false;

  // Per-piece facts the tasks use.
  std::vector<int64_t> micro_rows_, micro_first_;
  int64_t piece_rows_ = 0;
  double piece_weight_ = 1;
  double t0_ = 0;                         // start of the piece's schedule
  double task_start_ = 0, task_end_ = 0;  // the last task's compute (after its receives)

  std::optional<ExactSum> exact_;  // deterministic mode

  std::vector<TraceEvent> trace_;
  // Measurements since the last take_metrics().
  double forward_s_ = 0, backward_s_ = 0, send_s_ = 0, recv_s_ = 0, span_s_ = 0;
  double reduce_s_ = 0, clone_s_ = 0;
  double act_bytes_ = 0, peak_act_bytes_ = 0, sent_bytes_ = 0;
  int inflight_count_ = 0, peak_inflight_ = 0;
};

}  // namespace tessel::parallel
