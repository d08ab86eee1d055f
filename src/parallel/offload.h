// ActivationOffload (train.offload = activations, docs/gpu.md "Activation offload"): a device
// rank's activation caches wait in host memory between their block's forward and its backward.
// After block b's forward (Phase::kAfterForward) every device storage that the caches of blocks
// before b hold -- buffers and kept tensors, however many tensors view it -- is copied to a host
// buffer and its device memory given back (Storage::swap_out), except what block b's cache
// holds (the input it keeps is block b - 1's output) and block b's output (the next block's
// input). Before block b's backward (kBeforeBackward) the storages its cache holds come back
// (Storage::swap_in), and after it (kAfterBackward) its cache is released, so that the next
// forward allocates afresh. The last block is never offloaded: its backward follows its
// forward. Host buffers are kept for reuse across steps and charged to the ledger as
// activations_offloaded. Copies are the device runtime's, on the rank's current stream.
// Owned by the LocalExecutor; one thread.
#pragma once

#include <vector>

#include "tessel/nn/model.h"

namespace tessel::parallel {

class ActivationOffload {
 public:
  // The executor calls it after the engine's hooks, around every block of a training piece.
  void on_block(nn::Phase phase, size_t block, nn::Activations& acts);

 private:
  struct Swapped {
    Tensor device;  // a view of the swapped-out storage (keeps it alive)
    Tensor host;    // where its bytes wait
  };
  void swap_out_before(size_t block, nn::Activations& acts);
  void swap_in(const nn::Cache& cache);
  Tensor host_buffer(size_t bytes);

  std::vector<Swapped> swapped_;
  std::vector<Tensor> free_host_;  // host buffers for reuse, each a u8 tensor
};

}  // namespace tessel::parallel
