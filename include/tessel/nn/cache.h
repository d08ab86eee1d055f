// Cache: what one forward of one block keeps for its backward, owned by whoever runs the block
// (an executor keeps one per block and micro-batch in flight; inference keeps none). Layers hold
// parameters only: a forward writes its outputs into the cache's buffers and keeps references to
// what its backward reads (its input, statistics, the context for dropout masks); the backward
// reads them and writes its input gradient into scratch. Buffers keep their storage across steps,
// so a steady-state step allocates nothing; several caches of one block (micro-batches in flight)
// may share one scratch cache for the short-lived backward outputs. A cache is used by one
// thread at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "tessel/tensor/tensor.h"

namespace tessel::nn {

// Per-call facts a forward pass may need. Dropout keys its mask by (seed, step, sample index).
struct Context {
  bool training = true;
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_sample = 0;  // global index of row 0 of this batch
  // train.recompute = selective: a block may leave large tensors that are cheap to recompute
  // (attention probabilities, GELU outputs) in scratch and rewrite them in its backward.
  bool selective = false;
};

class Cache {
 public:
  // Buffer slot k as a tensor of `shape`: the slot's storage when big enough, else new storage
  // that the slot keeps. Lives until the slot is asked for again.
  Tensor buffer(size_t k, const Shape& shape, DType dtype = DType::kF32);
  // A buffer for the backward's outputs (activation gradients, temporaries): from the shared
  // scratch cache when one is set, else from this cache's slot `kScratchBase + k`.
  Tensor scratch(size_t k, const Shape& shape, DType dtype = DType::kF32);
  // Tensors the backward reads, by slot (any tensor: a reference, not a copy).
  void keep(size_t k, Tensor t);
  const Tensor& kept(size_t k) const;
  Cache& child(size_t k);  // the cache of sub-module k (e.g. a transformer block's layers)

  // Backward outputs of this cache (and its children) go to `shared` from now on.
  void share_scratch(Cache* shared);
  // Forgets what the forward kept (the buffers' storage stays for the next forward).
  void clear();
  // Bytes of storage held by this cache's buffers and its children's (not the shared scratch).
  int64_t bytes() const;

  Context ctx;  // the forward's context
  Shape shape;  // a shape the backward needs (e.g. the input's)

 private:
  static constexpr size_t kScratchBase = 1000;
  std::vector<std::pair<size_t, Tensor>> buffers_;  // (slot, storage), few per layer
  std::vector<Tensor> kept_;
  std::deque<Cache> children_;  // deque: references stay valid as children are added
  Cache* shared_ = nullptr;
};

// For layers: the output tensor slot k of a forward. With a cache (training) it is the cache's
// buffer; without (inference) fresh storage that lives as long as the caller holds it.
Tensor output(Cache* cache, size_t k, const Shape& shape, DType dtype = DType::kF32);

}  // namespace tessel::nn
