#include "tessel/parallel/engine.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "engine_device.h"
#include "fault_injection.h"
#include "grad_syncs.h"
#include "optimizer_offload.h"
#include "param_stores.h"
#include "shared_memory_step.h"
#include "tessel/core/clock.h"
#include "tessel/core/trace.h"
#include "tessel/optim/schedule.h"
#include "tessel/parallel/parameter_server.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/tensor/device.h"
#include "tp_group.h"
#include "working_copy.h"

namespace tessel::parallel {

namespace {

// Overlap needs a core for each rank's progress thread besides the one computing; on a machine
// without spare cores the progress threads steal time from compute and cost more than they hide
// (measured on 2 cores: 2 workers ran fashion_mlp 20-50% faster without overlap). Off on a
// parameter server and without dp peers.
bool resolve_overlap(const ParallelSpec& spec, Mesh& mesh) {
  if (mesh.is_server() || mesh.layout().dp == 1) return false;
  if (spec.overlap != Overlap::kAuto) return spec.overlap == Overlap::kOn;
  return static_cast<int>(std::thread::hardware_concurrency()) >=
         2 * mesh.group(Axis::kDp).ranks_on_host();
}

// A device rank's GPU, made its thread's current device first of all: the model's parameters,
// the parts' buffers and the kernels' handles all belong to the GPU current when they are made.
std::unique_ptr<const DevicePlacement> place_on_device(Mesh& mesh) {
  if (current_device() == Device::kCpu) return nullptr;
  return std::make_unique<const DevicePlacement>(place_device_rank(mesh.world()));
}

// On device ranks, each pipeline link's path for device memory: NCCL or staged, chosen as the
// dp group's is.
PipelineExecutor::DeviceLinks pipeline_device_links(const DevicePlacement* place) {
  if (place == nullptr) return nullptr;
  return [place = *place](comm::Communicator& link, std::string* kind) {
    return make_device_collectives(link, place, kind);
  };
}

std::unique_ptr<TpGroup> make_tp_group(const ParallelSpec& spec, Mesh& mesh) {
  if (mesh.layout().tp == 1) return nullptr;
  return std::make_unique<TpGroup>(mesh.group(Axis::kTp), spec.tp_sequence);
}

}  // namespace

DType precision_type(const ParallelSpec& spec) {
  constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16};  // indexed by Precision
  return kTypes[static_cast<size_t>(spec.precision)];
}

Engine::Engine(const ParallelSpec& spec, const optim::OptimSpec& optim, comm::Communicator& world,
               const nn::ModelSpec& model, uint64_t seed)
    : Engine(
          spec, optim, world,
          [&](nn::TensorParallel* tp) {
            return std::make_pair(nn::build_model(model, tp), nn::make_loss(model, tp));
          },
          seed) {}

Engine::Engine(const ParallelSpec& spec, const optim::OptimSpec& optim, comm::Communicator& world,
               std::unique_ptr<nn::Model> model, uint64_t seed)
    : Engine(
          spec, optim, world,
          [&](nn::TensorParallel* tp) {
            if (tp != nullptr)
              throw InvalidArgument("engine: a model built by the caller runs with tp.size = 1");
            return std::make_pair(std::move(model), std::unique_ptr<nn::Loss>(
                                                        std::make_unique<nn::CrossEntropyLoss>()));
          },
          seed) {}

Engine::Engine(const ParallelSpec& spec, const optim::OptimSpec& optim, comm::Communicator& world,
               const Build& build, uint64_t seed)
    : spec_(spec),
      mesh_(world, Layout::resolve(spec, world.size())),
      place_(place_on_device(mesh_)),
      overlap_(resolve_overlap(spec, mesh_)),
      composed_(compose(spec, mesh_.layout(), overlap_)),
      type_(precision_type(spec)),
      tp_(make_tp_group(spec, mesh_)),
      built_(build(tp_.get())),
      model_(*built_.first),
      loss_(built_.second.get()) {
  hooks_fn_ = [this](nn::Phase p, size_t b, bool last) { hook(p, b, last); };
  block_start_.assign(model_.num_blocks(), 0.0);
  parts_ = composed_.json(spec, overlap_);
  if (place_) record_gpus();
  if (layout().servers > 0) {
    build_parameter_server(spec, optim, seed);
  } else {
    if (composed_.executor == ExecutorKind::kPipeline)
      executor_ = std::make_unique<PipelineExecutor>(spec, mesh_.group(Axis::kPp), model_,
                                                     pipeline_device_links(place_.get()));
    else
      executor_ = std::make_unique<LocalExecutor>(model_, spec.recompute, spec.offload);
    comm::Communicator& group = mesh_.group(Axis::kShard);  // dp, or its zero.shard_size group
    units_ =
        make_units(model_, spec.bucket_mb, executor_->local_blocks(), group.size(), group.rank());
    build_data_parallel(spec, seed);
  }
  if (!trains()) return;
  if (composed_.scaler) scaler_ = std::make_unique<optim::LossScaler>();
  if (composed_.working_copy) {
    working_ = std::make_unique<WorkingCopy>(model_, units_, type_);
    store_->set_working(working_.get());
    store_->refresh_working(true);
  }
  if (offloads_optimizer(spec.offload))  // state in host memory, the step on the CPU
    optimizer_ = std::make_unique<OffloadedOptimizer>(
        optim, store_->update_numel(),
        composed_.working_copy || host_masters(spec) ? type_ : DType::kF32, host_masters(spec));
  else
    optimizer_ = optim::make_optimizer(optim, store_->update_numel());
  const int rank = mesh_.workers().rank();
  if ((faulty_sync_ = slow_sync(spec, rank, *sync_))) sync_ = faulty_sync_.get();
  if ((faulty_loss_ = overflow_loss(spec, rank, *loss_, piece_step_))) loss_ = faulty_loss_.get();
  if ((slow_blocks_ = slow_blocks(spec, rank, piece_step_))) hooks_.push_back(slow_blocks_.get());
}

Engine::~Engine() {
  for (auto* c : {&dp_comm_, &across_comm_, &device_comm_})
    if (*c) release_device_collectives(**c);
  if (tp_) tp_->release_device();
}

void Engine::build_parameter_server(const ParallelSpec& spec, const optim::OptimSpec& optim,
                                    uint64_t seed) {
  auto owner = std::make_unique<ParameterServer>(spec, mesh_, model_, seed, optim);
  ParameterServer& ps = *owner;
  claims_ = ps.lockstep() ? nullptr : &ps;
  store_owner_ = std::move(owner);
  store_ = store_owner_.get();
  if (mesh_.is_server()) return;
  executor_ = std::make_unique<LocalExecutor>(model_, spec.recompute, spec.offload);
  units_ = make_units(model_, spec.bucket_mb, executor_->local_blocks(), 1, 0);
  sync_owner_ = ps.worker_sync(model_, units_);
  hooks_.push_back(&ps);  // its pushes go out as the backward completes each unit
  sync_ = sync_owner_.get();
}

void Engine::build_data_parallel(const ParallelSpec& spec, uint64_t seed) {
  comm::Communicator& dp = mesh_.group(Axis::kDp);
  comm::Communicator* workers = &mesh_.workers();
  const int stage = spec.zero_stage;
  const bool pipeline = composed_.executor == ExecutorKind::kPipeline;
  parts_["units"] = units_.list.size();
  // zero.shard_size: ZeRO within the shard group, its shards all-reduced across the groups.
  comm::Communicator* across = nullptr;
  if (layout().shard < layout().dp) {
    across = &mesh_.group(Axis::kReplica);
    parts_["shard_group"] = layout().shard;
    parts_["replica_groups"] = across->size();
  }
  comm::Communicator& group = mesh_.group(Axis::kShard);
  if (current_device() != Device::kCpu) build_device_comms(group, across);  // before allocating
  Buckets::Spec buckets{overlap_, false, type_, spec.compress, seed, across};
  buckets.device = device_comm_.get();
  buckets.across_device = across_comm_.get();
  if (composed_.shared_memory && stage == 1) {
    if (auto shm = SharedMemoryStep::make(model_, units_, dp, mesh_.workers(), seed)) {
      sync_ = shm.get();
      store_ = shm.get();
      store_owner_ = std::move(shm);
      parts_["grad_sync"] = parts_["store"] = "shared_memory";
      return;
    }
  }
  if (composed_.shared_memory && stage == 0 &&
      (sync_owner_ = SharedGradSync::make(model_, units_, dp, mesh_.workers())))
    parts_["grad_sync"] = "shared_memory";
  auto hooked = [this](auto sync) {
    hooks_.push_back(sync.get());
    sync_owner_ = std::move(sync);
  };
  if (!sync_owner_ && composed_.grad_sync == "exact") {
    scale_buckets_ = make_units(model_, spec.bucket_mb, {}, 1, 0);
    hooked(std::make_unique<ExactSync>(model_, units_, scale_buckets_, dp, mesh_.workers(),
                                       type_ == DType::kF16,
                                       dp_comm_ ? dp_comm_.get() : device_comm_.get()));
  } else if (!sync_owner_ && composed_.grad_sync != "reduce_scatter_shard") {
    hooked(std::make_unique<ArenaSync>(
        model_, units_,
        stage == 0 ? ArenaSync::Reduction::kAllReduce : ArenaSync::Reduction::kReduceScatter,
        &group, workers, buckets));
  } else if (!sync_owner_) {
    hooked(std::make_unique<ShardSync>(model_, units_, group, workers, !pipeline, buckets));
  }
  sync_ = sync_owner_.get();
  if (composed_.store == "sharded") {
    auto sharded =
        std::make_unique<ShardedStore>(model_, units_, group, across, seed, composed_.prefetch,
                                       pipeline, type_, device_comm_.get(), host_masters(spec));
    hooks_.insert(hooks_.begin(), sharded.get());
    store_owner_ = std::move(sharded);
  } else {
    store_owner_ =
        std::make_unique<ReplicatedStore>(model_, units_, stage, group, across, seed,
                                          spec.check_every, device_comm_.get(), host_masters(spec));
  }
  store_ = store_owner_.get();
}

// A device rank's collectives on device memory, made before its first device allocation:
// buckets, ZeRO's shard gathers and the exact sum's integers all move device memory. With
// shard groups, a second DeviceCollectives carries each shard's all-reduce across the groups,
// or (deterministic mode) the exact sum over all of dp.
void Engine::build_device_comms(comm::Communicator& group, comm::Communicator* across) {
  const DevicePlacement& place = *place_;
  std::string kind;
  if (group.size() > 1) {
    device_comm_ = make_device_collectives(group, place, &kind);
    parts_["device_comm"] = kind;
  }
  if (across != nullptr && across->size() > 1 && composed_.grad_sync == "exact") {
    dp_comm_ = make_device_collectives(mesh_.group(Axis::kDp), place, &kind);
    parts_["dp_device_comm"] = kind;
  } else if (across != nullptr && across->size() > 1) {
    across_comm_ = make_device_collectives(*across, place, &kind);
    parts_["across_device_comm"] = kind;
  }
  if (tp_) {  // the tp group's all-reduces of activations and their gradients
    tp_->use_device(make_device_collectives(mesh_.group(Axis::kTp), place, &kind));
    parts_["tp_device_comm"] = kind;
  }
}

// Collective over the world. engine.gpus: each rank's GPU, by world rank; engine.gpu_shared:
// whether ranks share GPUs (more ranks on the host than GPUs).
void Engine::record_gpus() {
  std::vector<int32_t> gpus(static_cast<size_t>(mesh_.world().size()));
  mesh_.world().allgather(&place_->device, gpus.data(), 1, comm::ElemType::kI32);
  parts_["gpus"] = gpus;
  parts_["gpu_shared"] = place_->shared;
}

int Engine::data_rank() const { return trains() ? mesh_.coord().dp : 0; }

int Engine::data_size() const { return layout().dp; }

void Engine::check_batch(int64_t batch) const {
  if (!trains()) return;
  const int64_t n = data_size();
  for (int64_t r = 0; r < n; ++r) executor_->check_batch_rows((r + 1) * batch / n - r * batch / n);
}

void Engine::hook(nn::Phase phase, size_t block, bool last) {
  // Traced, a block's span covers its compute only: it starts after the hooks' gathers and
  // ends before they launch its buckets (or the tp group reduces its output).
  Tracer* tracer = active_tracer();
  const bool after = phase == nn::Phase::kAfterForward || phase == nn::Phase::kAfterBackward;
  if (tracer && after) trace_block(*tracer, phase, block);
  if (tp_) tp_->set_call_site(phase, block, training_);
  for (BlockHooks* h : hooks_) h->on_block(phase, block, last);
  if (tracer && !after) block_start_[block] = now_seconds();
}

void Engine::trace_block(Tracer& tracer, nn::Phase phase, size_t block) {
  const double now = now_seconds();
  const bool forward = phase == nn::Phase::kAfterForward;
  tracer.span(model_.block_name(block), forward ? "forward" : "backward", block_start_[block], now);
  if (const auto& ledger = current_ledger()) {
    TraceArgs mib;
    for (int k = 0; k < kMemCategories; ++k)
      mib.num(mem_category_name(MemCategory(k)),
              static_cast<double>(ledger->current(MemCategory(k))) / (1 << 20));
    tracer.counter("memory (MiB)", now, std::move(mib));
  }
}

PieceStats Engine::once_per_replica(const PieceStats& s) const {
  return tp_ && tp_->rank() > 0 ? PieceStats{} : s;  // a tp group computes one loss together
}

nlohmann::json Engine::tp_counters() const {
  return tp_ ? tp_->counters(model_) : nlohmann::json::object();
}

void Engine::start() {
  store_->before_start();
  store_->refresh_working(true);  // the masters may have been restored
  executor_->start(*store_);
}

PieceStats Engine::train_piece(const Piece& piece) {
  store_->begin_pass(true, piece.ctx.step);
  training_ = true;
  piece_step_ = piece.ctx.step;
  if (piece.y.dim(0) == 0) {  // more ranks than rows in a short last batch
    executor_->idle(hooks_fn_, true, piece.last);
    return {};
  }
  if (!scaler_) return once_per_replica(executor_->train(piece, *loss_, hooks_fn_));
  Piece scaled = piece;  // fp16: the loss gradient scaled up
  scaled.weight *= scaler_->scale();
  return once_per_replica(executor_->train(scaled, *loss_, hooks_fn_));
}

PieceStats Engine::eval_piece(const Piece& piece) {
  store_->begin_pass(false, piece.ctx.step);
  training_ = false;
  if (piece.y.dim(0) == 0) {
    executor_->idle(hooks_fn_, false, false);
    return {};
  }
  return once_per_replica(executor_->eval(piece, *loss_, hooks_fn_));
}

void Engine::step(float lr, float clip_norm, int64_t step) {
  {
    TraceSpan span("reduce gradients", "sync");
    sync_->reduce();
    if (tp_ && tp_->sequence()) sum_whole_grads_over_tp();
  }
  std::optional<TraceSpan> span(std::in_place, "optimizer step", "optimizer");
  // The global norm when clipping needs it, or when fp16 looks for an overflow: an inf or NaN
  // anywhere, on any rank or shard, makes the sum every rank gets non-finite.
  const double sq = clip_norm > 0 || scaler_ ? sync_->sq_norm() : 0;
  const bool overflow = scaler_ && !std::isfinite(sq);
  if (!overflow) {  // an overflowing step is skipped: no update, no gathers
    const float unscale = scaler_ ? scaler_->inv_scale() : 1.0f;
    float grad_scale = unscale;
    if (clip_norm > 0) grad_scale *= optim::clip_factor(std::sqrt(sq) * unscale, clip_norm);
    store_->update(*optimizer_, lr, grad_scale, *sync_, step);
  }
  if (scaler_) scaler_->update(overflow);
  span.reset();
  sync_->clear();
  executor_->end_step(*store_);
  store_->end_step(step);
}

// Under sequence parallelism a whole parameter's gradient (layer norms, the position table,
// a row-cut layer's bias) holds only this rank's part of the sequence: the group sums them,
// all in one buffer (on the rank's device), before the norm and the update read them.
void Engine::sum_whole_grads_over_tp() {
  std::vector<std::pair<float*, int64_t>> whole;  // (gradient, elements) of each run
  int64_t total = 0;
  for (const nn::Range& r : store_->update_ranges())
    for (const nn::Run& run : model_.runs(r))
      if (!model_.parameters()[run.param]->is_split()) {
        whole.push_back({sync_->grads({run.local, run.local + run.count}), run.count});
        total += run.count;
      }
  const Device device = current_device();
  const Tensor buf = Tensor::empty({total}, DType::kF32, device);
  float* b = buf.kernel_data<float>();
  // n floats from src to dst, both on this rank's device.
  auto copy = [&](float* dst, const float* src, int64_t n) {
    if (device == Device::kCpu) return static_cast<void>(std::copy_n(src, n, dst));
    device_runtime(device).copy(dst, device, src, device, static_cast<size_t>(n) * sizeof(float),
                                current_stream());
  };
  int64_t at = 0;
  for (auto [p, n] : whole) {
    copy(b + at, p, n);
    at += n;
  }
  tp_->set_call_site(nn::Phase::kAfterBackward, 0, true);
  tp_->all_reduce_sum(b, total, DType::kF32);
  at = 0;
  for (auto [p, n] : whole) {
    copy(p, b + at, n);
    at += n;
  }
}

void Engine::sum(double* values, int n) {
  mesh_.workers().allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64);
}

void Engine::max(double* values, int n) {
  mesh_.workers().allreduce(values, static_cast<size_t>(n), comm::ElemType::kF64,
                            comm::ReduceOp::kMax);
}

std::vector<double> Engine::gather(double value) {
  std::vector<double> all(static_cast<size_t>(mesh_.workers().size()));
  mesh_.workers().allgather(&value, all.data(), 1, comm::ElemType::kF64);
  return all;
}

nlohmann::json Engine::report(const std::vector<RankStats>& ranks) {
  nlohmann::json out = executor_->report(ranks, layout());
  out.update(store_->report());
  return out;
}

nlohmann::json Engine::plan() const {
  return trains() ? executor_->plan() : nlohmann::json::object();
}

std::vector<RankStats> Engine::take_stats(double step_s, double steps) {
  RankStats s;
  s.step_s = step_s;
  s.steps = steps;
  executor_->take_stats(s);
  sync_->take_stats(s);
  store_->take_stats(s);  // after the sync (a part that is both adds nothing the second time)
  if (tp_) tp_->take_stats(s);
  if (const auto& ledger = current_ledger()) {
    for (int k = 0; k < kMemCategories; ++k) {
      s.mem[static_cast<size_t>(k)] = static_cast<double>(ledger->current(MemCategory(k)));
      s.mem_peak[static_cast<size_t>(k)] = static_cast<double>(ledger->peak(MemCategory(k)));
    }
    s.mem_peak_total = static_cast<double>(ledger->peak_total());
    ledger->reset_peaks();
  }
  std::vector<RankStats> all(static_cast<size_t>(mesh_.workers().size()));
  mesh_.workers().allgather(s.data(), all.data(), RankStats::kFields, comm::ElemType::kF64);
  return all;
}

}  // namespace tessel::parallel
