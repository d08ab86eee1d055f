// ParallelSpec: the config sections that choose how a run is cut across ranks (ddp, zero, pp,
// ps, debug; docs/config.md documents each key). Parsed by tessel/config/config.h; the parallel
// parts read it and nothing else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/core/names.h"
#include "tessel/nn/recompute.h"
#include "tessel/parallel/compress.h"
#include "tessel/tensor/dtype.h"

namespace tessel::parallel {

// The values of the spec's choice keys, read from their names once (core/names.h).
enum class Precision : uint8_t { kFp32, kBf16, kFp16 };                  // train.precision
enum class Overlap : uint8_t { kAuto, kOn, kOff };                       // ddp.overlap
enum class BalanceMode : uint8_t { kOff, kStatic, kDynamic };            // ddp.balance
enum class PsMode : uint8_t { kSync, kAsync, kSsp };                     // ps.mode
enum class StaleLr : uint8_t { kNone, kInverse };                        // ps.stale_lr
enum class PpSchedule : uint8_t { kGpipe, k1f1b, kInterleaved, kZbH1 };  // pp.schedule
enum class PpPartition : uint8_t { kBalanced, kUniform, kRoundRobin };   // pp.partition
enum class Offload : uint8_t { kNone, kActivations, kOptimizer, kAll };  // train.offload
constexpr bool offloads_activations(Offload o) {
  return o == Offload::kActivations || o == Offload::kAll;
}
constexpr bool offloads_optimizer(Offload o) {
  return o == Offload::kOptimizer || o == Offload::kAll;
}

struct ParallelSpec {
  // ddp.*
  double bucket_mb = 1.0;  // gradient bucket (and ZeRO-3 gather unit) size
  // "on" runs bucket collectives (and ZeRO-3 prefetches) on a progress thread while the
  // backward pass computes; "off" runs them on the compute thread; "auto": on only when the
  // machine has a spare core per rank for the progress threads.
  Overlap overlap = Overlap::kAuto;
  int64_t check_every = 200;  // steps between cross-rank parameter checks (0 = off)
  // Ranks of one host read each other's gradients from shared memory (no messages); ZeRO-1
  // also keeps one parameter copy there. false: all-reduce or reduce-scatter + all-gather
  // messages.
  bool shared_memory = true;
  bool deterministic = false;  // train.deterministic: bit-identical results for any worker count
  int64_t micro_shard = 8;     // rows per fixed micro-shard in deterministic mode
  // off | static | dynamic: deal the micro-shards by the ranks' measured speeds (balance.h)
  BalanceMode balance = BalanceMode::kOff;
  // train.precision: fp32 | bf16 | fp16, the type of activations, activation gradients, the
  // parameters the blocks read and the gradient messages (docs/mixed_precision.md).
  Precision precision = Precision::kFp32;
  // train.recompute: none | full | selective, which activations a forward keeps for the
  // backward and which the backward recomputes (docs/recompute.md).
  nn::Recompute recompute = nn::Recompute::kNone;
  // train.offload: none | activations, a device rank's activations wait in host memory between
  // their block's forward and backward (docs/gpu.md).
  Offload offload = Offload::kNone;

  // compress.* (gradient compression of data-parallel buckets and parameter-server pushes)
  CompressSpec compress;

  // zero.* (sharded data parallelism over the dp axis)
  int zero_stage = 0;         // 0 replicated, 1 optimizer state, 2 + gradients, 3 + parameters
  bool zero_prefetch = true;  // stage 3: gather the next unit while this one computes
  // Ranks per shard group (0: the whole dp group): stages 1-3 shard within groups of this many
  // consecutive dp ranks and all-reduce the gradient shards across the groups.
  int zero_shard_size = 0;

  // runtime.memory_limit_mb: a rank whose tensors would pass it fails naming the category
  int64_t memory_limit_mb = 0;
  // runtime.device: where each rank's tensors live and its kernels run (docs/gpu.md)
  Device device = Device::kCpu;

  // tp.* (tensor parallelism)
  int64_t tp_size = 1;       // ranks each layer is cut across (1: none)
  bool tp_sequence = false;  // activations between cut regions split along the sequence

  // pp.* (pipeline model parallelism)
  int64_t pp_stages = 1;        // pipeline stages (1: no pipeline)
  int64_t pp_microbatches = 1;  // micro-batches per batch
  PpSchedule pp_schedule = PpSchedule::k1f1b;
  int64_t pp_virtual_stages = 1;  // interleaved: chunks per stage
  PpPartition pp_partition = PpPartition::kBalanced;
  std::vector<int64_t> pp_cuts;  // explicit first block of stages 1..P-1 (overrides partition)

  // ps.* (parameter server)
  int64_t ps_servers = 0;          // server ranks (0: no parameter server)
  PsMode ps_mode = PsMode::kSync;  // sync | async | ssp
  int64_t ps_staleness = 2;        // ssp: a claim waits for the slowest within this many steps
  StaleLr ps_stale_lr = StaleLr::kInverse;  // none | inverse: scale an update by 1/(1 + staleness)

  // debug.*
  int64_t slow_rank = -1;  // this rank sleeps debug.delay_ms in every step (-1: none)
  double delay_ms = 0;
  double slow_factor = 1;  // slow_rank's forward and backward of every piece take this x longer
  // slow_factor applies from this step on (a straggler that appears mid-run)
  int64_t slow_from_step = 0;
  // fp16: at these steps worker overflow_rank's loss gradient is inf (an injected overflow)
  std::vector<int64_t> overflow_steps;
  int64_t overflow_rank = 0;
};

// The tensor type of spec.precision.
DType precision_type(const ParallelSpec& spec);

}  // namespace tessel::parallel

namespace tessel {
TESSEL_NAMES(parallel::Precision, "fp32", "bf16", "fp16");
TESSEL_NAMES(parallel::Overlap, "auto", "on", "off");
TESSEL_NAMES(parallel::BalanceMode, "off", "static", "dynamic");
TESSEL_NAMES(parallel::PsMode, "sync", "async", "ssp");
TESSEL_NAMES(parallel::StaleLr, "none", "inverse");
TESSEL_NAMES(parallel::PpSchedule, "gpipe", "1f1b", "interleaved", "zb-h1");
TESSEL_NAMES(parallel::Offload, "none", "activations", "optimizer", "all");
TESSEL_NAMES(parallel::PpPartition, "balanced", "uniform", "round_robin");
}  // namespace tessel
