// The decision table: for a combination of the keys that choose how a run is composed (the
// layout's dp, pp, tp and ps, zero.stage and zero.shard_size, train.precision, compress.kind,
// train.recompute, train.deterministic, ddp.balance, debug.*, and runtime.device), the parts the
// Engine builds, or why the combination is refused, with a message naming the keys and what to
// change. It is the one place that says so: the Engine asks compose() and builds what it
// answers, `tessel config` prints the answer, and docs/composition.md is generated from it
// (composition_markdown, checked by a test).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/nn/models.h"
#include "tessel/parallel/layout.h"
#include "tessel/parallel/spec.h"

namespace tessel::parallel {

// How a rank runs its blocks: all of them (LocalExecutor) or its pipeline stage's.
enum class ExecutorKind : uint8_t { kLocal, kPipeline };

struct Parts {
  ExecutorKind executor = ExecutorKind::kLocal;
  std::string tp;         // none | tensor_parallel | sequence_parallel
  std::string grad_sync;  // allreduce | reduce_scatter | reduce_scatter_shard | exact | local
  std::string store;      // replicated | sharded | parameter_server
  // The ranks of one host sum gradients in shared memory where they can (zero.stage 0: the
  // sync; 1: the sync and one parameter copy), else grad_sync and store above.
  bool shared_memory = false;
  std::string codec;          // compress.kind of the gradient messages (none: f32)
  bool working_copy = false;  // 16-bit copy of the values the blocks read (ZeRO-3 gathers one)
  bool scaler = false;        // dynamic loss scaling (fp16)
  bool prefetch = false;      // ZeRO-3 gathers the next unit during this one's compute

  // What `tessel config` and the run summary show as "engine".
  nlohmann::json json(const ParallelSpec& spec, bool overlap) const;
};

// The parts that run spec on layout with bucket collectives on a progress thread (overlap) or
// not. Throws InvalidArgument naming the keys and an alternative for a combination that does
// not run.
Parts compose(const ParallelSpec& spec, const Layout& layout, bool overlap);

// At start, before anything is built: throws Error when runtime.device cannot be used here
// (this build has no such device, or the host has none: the runtime's reason), and
// InvalidArgument naming the model key when the model's layers have no kernels on it yet (on
// cuda: convolutions, dropout, RMSNorm, rotary positions, SwiGLU, sequential stacks). Every
// model runs on the cpu.
void check_device(const ParallelSpec& spec, const nn::ModelSpec& model);

// One combination of the table: spec on `world` ranks (layout names it).
struct Combination {
  std::string layout;
  int world = 1;
  ParallelSpec spec;
};
// Every combination of a representative layout (one rank, dp, ZeRO groups, pp, tp, their
// products, a parameter server), zero.stage, train.precision and compress.kind, the other keys
// as in base.
std::vector<Combination> composition_grid(const ParallelSpec& base);
// The message refusing c (ddp.overlap off), or "" where it runs, its parts in *parts.
std::string refusal(const Combination& c, Parts* parts);

// docs/composition.md: the parts of every combination of the grid (or its refusal), then
// every rule of the table.
std::string composition_markdown();

}  // namespace tessel::parallel

namespace tessel {
TESSEL_NAMES(parallel::ExecutorKind, "local", "pipeline");
}  // namespace tessel
