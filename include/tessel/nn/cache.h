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
#include <functional>
#include <initializer_list>
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
  // Buffer slot k as a tensor of `shape` on the thread's current device: the slot's storage
  // when big enough, else new storage that the slot keeps. Lives until the slot is asked for
  // again.
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
  // Drops the buffers and every kept tensor but slots `keep` (children untouched): storage
  // goes unless a kept tensor still refers to it, and the next forward allocates it again.
  // A zero-bubble B leaves only what its W reads (Module::release_for_weights).
  void release(std::initializer_list<size_t> keep = {});
  void release_all();  // release() of this cache and all its children, keeping nothing
  // Drops this cache's own scratch slots and its children's (not the shared scratch): after a
  // forward they hold its workspace, which no backward reads (it writes them afresh).
  void release_scratch();
  // Bytes of storage held by this cache's buffers and its children's (not the shared scratch).
  int64_t bytes() const;
  // Calls f on every buffer and kept tensor of this cache and its children (not the shared
  // scratch): what activation offload moves (parallel/offload.h).
  void for_each_tensor(const std::function<void(const Tensor&)>& f) const;

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
// buffer; without (inference) fresh storage that lives as long as the caller holds it; on the
// thread's current device either way.
Tensor output(Cache* cache, size_t k, const Shape& shape, DType dtype = DType::kF32);

// KvCache: the keys and values that the transformer blocks of a GPT have seen, for decoding,
// of many sequences at once, in pages of kPage positions (paged attention, as in vLLM). A
// sequence holds a table of pages and takes one more each time its length passes a multiple of
// kPage; a page comes from the free list or new storage, and returns to the free list when its
// sequence is released: memory follows the positions held, not the model's context. A step
// runs rows of several sequences together: set_step() names, in row order, the runs of rows
// that continue each sequence; each block's attention then goes through attend(), which reads
// the sequence's keys and values and appends the run's; finish_step() adds the runs' lengths.
// A run attends exactly as ops::attention_forward_kv over a contiguous cache (its pages are
// gathered first), so a sequence's rows have the same bits whatever runs beside it. f32 only;
// used by one thread at a time.
class KvCache {
 public:
  static constexpr int64_t kPage = 16;
  struct Run {
    int64_t seq;   // an id from add()
    int64_t rows;  // new positions [length(seq), length(seq) + rows)
  };

  explicit KvCache(size_t blocks) : blocks_(blocks) {}
  int64_t add();              // a new, empty sequence's id
  void release(int64_t seq);  // its pages go back to the free list
  int64_t length(int64_t seq) const;
  void set_step(std::vector<Run> runs);  // takes the pages the runs' new positions need
  const std::vector<Run>& step() const { return step_; }
  int64_t step_rows() const;
  // Block `block`'s attention over the step's rows: out [rows, C] from qkv [rows, 3C], NH heads.
  void attend(size_t block, float* out, const float* qkv, int64_t C, int64_t NH);
  void finish_step();
  int64_t bytes() const;       // page storage, held and free
  int64_t bytes_held() const;  // page storage the sequences hold

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int64_t length = 0;
    bool live = false;
  };
  float* page_rows(int32_t page, size_t block, int kv, int64_t C);  // [kPage, C]
  Seq& seq(int64_t id);

  size_t blocks_;
  std::vector<Tensor> pages_;  // [blocks, 2, kPage, C] each, made on first use
  std::vector<int32_t> free_pages_;
  std::vector<Seq> seqs_;
  std::vector<int64_t> free_seqs_;
  std::vector<Run> step_;
  std::vector<float> keys_, values_;  // one run's gathered keys and values
};

}  // namespace tessel::nn
