// Model: a sequence of blocks (Modules) and the flat layout of their parameters: one arena of
// elements in block order, each parameter at a 64-byte aligned offset. The model owns no
// parameter memory by itself: whoever runs it binds the parameters' value and gradient views
// to memory of its choice (Model::bind_values / bind_grads over an element range), e.g. all of
// it (materialize(), a single process), a pipeline stage's blocks, or one ZeRO-3 unit at a time.
// Initial values are a pure function of (seed, parameter, element): init_values() writes any
// element range, so a rank can initialise only what it holds.
// With tensor parallelism a parameter may be this rank's part of a logical tensor (Split):
// runs() maps arena elements to the logical tensors' elements, which is what checkpoints and
// digests hold, and initial values are drawn by logical element, so every layout starts from
// the same weights.
// A block may also *use* parameters of another block (a tied LM head reads the embedding's
// table): add(name, block, borrows) records it, and blocks_using() answers who reads what.
// forward()/backward() run a slice of blocks with one Cache per block (Activations) and call a
// hook around every block, which is where data parallelism and ZeRO act.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tessel/nn/module.h"
#include "tessel/nn/recompute.h"

namespace tessel::nn {

// An element range [lo, hi) of the flat parameter arena.
struct Range {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi - lo; }
  bool empty() const { return hi <= lo; }
  bool operator==(const Range&) const = default;
};

// Arena elements [local, local + count) are elements [logical, logical + count) of parameter
// `param`'s logical tensor (flattened).
struct Run {
  size_t param = 0;
  int64_t local = 0, logical = 0, count = 0;
  bool operator==(const Run&) const = default;
};

// When a block hook runs, relative to the block's forward or backward.
enum class Phase : uint8_t { kBeforeForward, kAfterForward, kBeforeBackward, kAfterBackward };
using BlockHook = std::function<void(Phase, size_t block)>;

// One cache per block of a model, what a forward of blocks [begin, end) keeps for the backward.
// With recompute (set by the owner before the first forward) the backward's outputs of every
// block share `scratch` (the owner calls share_scratch), and the gradient entering each block
// is first copied into `carry`, so that no block reads scratch that it writes.
struct Activations {
  std::vector<Cache> caches;  // kFull: each block's input (buffer 0) and context
  Recompute recompute = Recompute::kNone;
  std::map<std::string, Cache> work;  // kFull: one per block kind, where its forwards run
  size_t work_block = SIZE_MAX;       // kFull: the block whose forward `work` holds
  Cache scratch;
  Tensor carry;
  // While the kAfterForward hook of a block runs: its output, the next block's input (which
  // activation offload must leave on the device).
  Tensor output;
  int64_t bytes() const;  // storage held by the caches
  // Drops the storage every cache holds for the next forward: an evaluation, which keeps no
  // caches, then peaks at its own working set, not on top of training's (the next training
  // forward allocates them again).
  void release_all();
};

class Model {
 public:
  // Blocks in order. `borrows`: parameters of earlier blocks this block also reads (tied).
  void add(std::string name, std::unique_ptr<Module> block, std::vector<Parameter*> borrows = {});
  // Names the parameters "<block>.<param>" and lays out the arena; allocates nothing.
  void finalize();

  size_t num_blocks() const { return blocks_.size(); }
  Module& block(size_t i) { return *blocks_[i]; }
  const std::string& block_name(size_t i) const { return names_[i]; }

  // ---- the flat layout ----
  // All parameters, in arena order, named "<block>.<param>" (e.g. "fc1.weight").
  const std::vector<Parameter*>& parameters() const { return parameters_; }
  int64_t offset(size_t param) const { return offsets_[param]; }  // element offset in the arena
  int64_t arena_numel() const { return numel_; }                  // including alignment padding
  int64_t num_parameters() const;                                 // excluding padding
  // Parameter index range [first, last) owned by block i, and its element range (empty: none).
  std::pair<size_t, size_t> block_parameters(size_t i) const { return block_params_[i]; }
  Range block_range(size_t i) const;
  // Blocks that read the parameters owned by block i: i itself and any block borrowing them.
  const std::vector<size_t>& blocks_using(size_t i) const { return users_[i]; }
  // Blocks whose parameters block i reads: i and the owners of what it borrows.
  const std::vector<size_t>& blocks_used_by(size_t i) const { return uses_[i]; }
  // Parameters of other blocks that block i reads (a tied LM head's token table).
  const std::vector<Parameter*>& borrowed(size_t i) const { return borrows_[i]; }
  // The arena range of parameter k.
  Range param_range(size_t k) const;
  // The runs of arena range r in arena order: padding skipped, one run per contiguous piece of
  // a logical tensor (a parameter cut along a later dimension gives one run per row).
  std::vector<Run> runs(Range r) const;
  // Where parameter k starts in the arena of the whole model (every parameter whole, as one
  // process would lay it out), and that arena's size: the order digests follow.
  int64_t logical_offset(size_t k) const { return logical_offsets_[k]; }
  int64_t logical_numel() const { return logical_numel_; }
  // Writes the initial values of arena elements [r.lo, r.hi) into dst (padding: zero).
  void init_values(float* dst, Range r, uint64_t seed) const;

  // ---- memory ----
  // Points the value (grad) views of every parameter inside r at `memory`, whose element 0 is
  // arena element r.lo; an undefined tensor unbinds them. Parameters must lie wholly inside r.
  void bind_values(Range r, const Tensor& memory);
  void bind_grads(Range r, const Tensor& memory);
  // Allocates the whole arena for values and gradients in this model, initialises the values
  // and binds everything: a single process holding the whole model (tests, evaluation).
  void materialize(uint64_t seed);
  const Tensor& values() const;  // the materialized arenas (throws when not materialized)
  const Tensor& grads() const;
  void zero_grad();                   // materialized gradients
  std::string params_sha256() const;  // SHA-256 of the materialized value arena's bytes

  // ---- running ----
  // Forward of blocks [begin, end) (all by default), keeping one cache per block in acts
  // (acts.caches[i] for block i; null acts: inference, nothing kept).
  Tensor forward(const Tensor& x, const Context& ctx, Activations* acts, const BlockHook& hook = {},
                 size_t begin = 0, size_t end = SIZE_MAX);
  // Backward of blocks [begin, end) in reverse from their caches. Returns the gradient w.r.t.
  // the input of `begin`; for begin == 0 an undefined Tensor unless set_input_grad(true) (the
  // model's input is data, and skipping its gradient saves work).
  Tensor backward(const Tensor& dy, Activations& acts, const BlockHook& hook = {}, size_t begin = 0,
                  size_t end = SIZE_MAX);
  void set_input_grad(bool needed);  // default false
  // Zero-bubble schedules: every block's backward() leaves its weight gradients to
  // backward_weights() (Module::set_defer_weights), which runs blocks [begin, end) in reverse
  // from the caches that backward() read -- and left only what W reads in
  // (Module::release_for_weights), which W then drops too -- with the hook's kBeforeBackward
  // and kAfterBackward around each block. Throws InvalidArgument under Recompute::kFull (its
  // blocks share one cache per kind, which the next block's backward overwrites).
  void set_defer_weights(bool on);
  void backward_weights(Activations& acts, const BlockHook& hook = {}, size_t begin = 0,
                        size_t end = SIZE_MAX);
  double forward_flops(int64_t batch) const;

 private:
  void bind(Range r, const Tensor& memory, bool values);
  // kFull: block i's forward from a copy of its input h, run in acts.work.
  Tensor forward_keeping_input(size_t i, const Tensor& h, const Context& ctx, Activations& acts);
  // The cache block i's backward reads (kFull: acts.work after rerunning the forward).
  Cache& cache_for_backward(size_t i, Activations& acts);

  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Module>> blocks_;
  std::vector<std::vector<Parameter*>> borrows_;
  std::vector<Parameter*> parameters_;
  std::vector<int64_t> offsets_, logical_offsets_;
  std::vector<std::pair<size_t, size_t>> block_params_;
  std::vector<std::vector<size_t>> users_, uses_;
  int64_t numel_ = 0, logical_numel_ = 0;
  bool finalized_ = false;
  bool input_grad_ = false;
  Tensor values_, grads_;  // materialize()
};

}  // namespace tessel::nn
