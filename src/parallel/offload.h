// ActivationOffload (train.offload = activations, docs/gpu.md "Activation offload"): a device
// rank's activation caches wait in pinned host memory between their block's forward and its
// backward, copied on a copy stream of the rank's own so that the copies overlap the kernels
// of its compute stream (the thread's current stream).
// - After block b's forward (Phase::kAfterForward) every device storage that the caches of
//   blocks before b hold -- buffers and kept tensors, however many tensors view it -- is copied
//   out (Storage::swap_out), except what block b's cache holds (the input it keeps is block
//   b - 1's output) and block b's output (the next block's input); block b's forward workspace
//   (Cache::release_scratch: no backward reads it) is dropped, not copied. The copies start after
//   an event of the compute stream (they read what the forward wrote); their device blocks are kept
//   until the host has seen the copies' event, once compute was queued after them (computed_):
//   at block b + 1's kAfterForward, and the last ones at the first kBeforeBackward (after the
//   loss) or, with no compute since (a pipeline's backward task), after that block's backward.
// - Before block b's backward (kBeforeBackward) the compute stream waits for the event of b's
//   copies back (Storage::swap_in), which started before block b + 1's backward; then block
//   b - 1's copies back start (the prefetch: they overlap b's backward). After it
//   (kAfterBackward) its cache is released.
// The last block is never offloaded: its backward follows its forward. Host buffers are reused
// across steps once their copy back is reached, and charged to the ledger as
// activations_offloaded.
// In a pipeline stage (several micro-batches in flight, each its own Activations) the same
// happens inside each micro-batch's forward and backward (and each block's own cache goes out
// after its forward, swap_out_own, but the chunk's last's), and between the tasks: after a
// micro-batch's forward the rest of its caches go out too (swap_out_all: the last block's,
// which on_block leaves), unless its backward is one of the stage's next two tasks; before the
// task that precedes a backward, that micro-batch's last block comes back (prefetch), so its
// copies overlap that task. Copies back are matched to their cache, not to a block number.
// Owned by the LocalExecutor or the PipelineExecutor; one thread.
#pragma once

#include <memory>
#include <vector>

#include "tessel/core/memory.h"
#include "tessel/nn/model.h"

namespace tessel {
class DeviceRuntime;
}

namespace tessel::parallel {

// Pinned host memory (DeviceRuntime::allocate_pinned), charged to the current ledger under
// `category` (activations_offloaded, optimizer_offloaded) while it lives.
class PinnedBuffer {
 public:
  PinnedBuffer(DeviceRuntime& runtime, size_t bytes, MemCategory category);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;  // swaps: o gives back what this held
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  DeviceRuntime* runtime_;
  void* data_;
  size_t bytes_;
  MemCategory category_;
  std::shared_ptr<MemoryLedger> ledger_;
};

class ActivationOffload {
 public:
  ActivationOffload();   // the copy stream, on the thread's current device
  ~ActivationOffload();  // waits for every copy, then gives back the buffers, events and stream
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // The executor calls it after the engine's hooks, around every block of a training piece.
  void on_block(nn::Phase phase, size_t block, nn::Activations& acts);
  // Compute other than a block's was queued (the loss): the copies out before it ran beside it.
  void computed() { ++computed_; }
  // Pipelines: after a micro-batch's forward, every device storage its caches still hold.
  void swap_out_all(nn::Activations& acts);
  // Pipelines: after the forward of `block`, not its chunk's last, its own cache goes out too
  // (all but its output, the next block's input), so that the copies run beside the next
  // block's forward, not beside the stage's next task.
  void swap_out_own(nn::Activations& acts, size_t block) { swap_out(acts, block + 1, nullptr); }
  // Pipelines: queues the copies back of `cache` (a micro-batch's last block) on the copy
  // stream; its kBeforeBackward makes the compute stream wait for them.
  void prefetch(const nn::Cache& cache) { bring_in(cache); }
  // The storage of `t` never moves, whatever caches hold it (a pipeline's piece input, which
  // its micro-batches view); replaces the one set before.
  void set_resident(const Tensor& t) { resident_ = t.defined() ? &t.storage() : nullptr; }

 private:
  struct Waiting {  // a storage swapped out
    Tensor device;  // a view of it (keeps it alive)
    PinnedBuffer host;
  };
  struct Outgoing {                                // copies out queued after one block's forward
    void* event;                                   // recorded after them on the copy stream
    std::vector<std::unique_ptr<Storage>> blocks;  // the device memory they read
    int64_t computed;                              // computed_ when they were queued
  };
  struct Incoming {  // copies back of one cache's storages
    const nn::Cache* cache;
    void* event;
    std::vector<PinnedBuffer> host;  // the host memory they read
    bool waited = false;             // the compute stream waits for them
  };

  // The caches of blocks [0, end), but what `stay` and acts.output hold.
  void swap_out(nn::Activations& acts, size_t end, const nn::Cache* stay);
  void release_outgoing(size_t keep);     // all but the newest `keep`, once their event is reached
  void release_beside();                  // those that compute was queued after (computed_)
  void bring_in(const nn::Cache& cache);  // queues the copies back
  void wait_for(size_t block, const nn::Cache& cache);  // the compute stream, for them
  // The host buffers of the copies back waited for (all: every one), once reached.
  void reclaim_host(bool all = false);
  void copy_after_compute();  // the copy stream's next work starts after the compute stream's
  PinnedBuffer host_buffer(size_t bytes);
  void* event();
  void give_back(void* event);

  DeviceRuntime& runtime_;
  void* copy_stream_;
  void* compute_event_;
  const Storage* resident_ = nullptr;
  std::vector<Waiting> waiting_;
  std::vector<Outgoing> outgoing_;
  int64_t computed_ = 0;  // blocks' forwards and backwards and losses queued
  std::vector<Incoming> incoming_;
  std::vector<PinnedBuffer> free_host_;
  std::vector<void*> free_events_;
};

}  // namespace tessel::parallel
