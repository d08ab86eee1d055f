// Tensor parallelism as layers see it: the collectives of a tensor-parallel group (implemented
// over a communicator by tessel/parallel) and Megatron's two operators built on them, which
// cut-layers place around their GEMMs:
//   enter (f), before a column-parallel layer: forward passes the whole input on, backward sums
//     the input gradient over the group (all-reduce);
//   leave (g), after a row-parallel layer: forward sums the partial outputs over the group
//     (all-reduce), backward passes the gradient on.
// With sequence parallelism the activations between those regions are split along the
// sequence (dimension 1 of [B, T, C]: rank r holds positions [r T/t, (r + 1) T/t)), and the
// all-reduces become an all-gather along T on the way in and a reduce-scatter along T on the
// way out (and the reverse in the backward). The whole-sequence tensors are transient: they
// live in the group's workspace, and a column-parallel layer keeps only its part of the input,
// gathering it again in the backward (as Megatron-LM does), so a rank keeps 1/t of every
// activation. A null group means no tensor parallelism: every operator is the identity.
#pragma once

#include <cstdint>

#include "tessel/nn/cache.h"
#include "tessel/tensor/tensor.h"

namespace tessel::nn {

class TensorParallel {
 public:
  TensorParallel(int rank, int size, bool sequence)
      : rank_(rank), size_(size), sequence_(sequence) {}
  virtual ~TensorParallel() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  bool sequence() const { return sequence_; }

  // Collectives over the group, blocking, n elements of `type` (f32, or the activations'
  // bf16 or f16: 16-bit values are summed in f32 and rounded back at each step, as the
  // communicator does). all_gather: out holds size() x n, rank r's n values at r x n.
  // reduce_scatter: in holds size() x n; out gets the sum of every rank's chunk rank().
  virtual void all_reduce_sum(void* data, int64_t n, DType type) = 0;
  virtual void all_reduce_max(float* data, int64_t n) = 0;
  virtual void all_gather(const void* in, void* out, int64_t n, DType type) = 0;
  virtual void reduce_scatter(const void* in, void* out, int64_t n, DType type) = 0;

  // Transient whole-sequence tensors (sequence parallelism), valid until the next operator:
  // 0 an activation, 1 the collectives' staging, 2 a gradient, on the thread's current device.
  // Storage grows to the largest asked for and is kept (made anew when the type or the device
  // changes).
  Tensor workspace(int k, const Shape& shape, DType type);

 private:
  int rank_, size_;
  bool sequence_;
  Tensor workspace_[3];
};

// The operators. Under sequence parallelism tp_enter and tp_leave_backward return the whole
// sequence in workspace 0 (transient); tp_leave and tp_enter_backward return this rank's part
// in the cache's buffer (scratch) `slot`, fresh without a cache (inference). Otherwise the
// all-reduces work in place.
Tensor tp_enter(TensorParallel* tp, const Tensor& x);
// The shape tp_enter gives a tensor of shape `part` (the whole sequence's).
Shape tp_entered_shape(const TensorParallel* tp, Shape part);
Tensor tp_enter_backward(TensorParallel* tp, const Tensor& dx, Cache& cache, size_t slot);
Tensor tp_leave(TensorParallel* tp, const Tensor& y, Cache* cache, size_t slot);
Tensor tp_leave_backward(TensorParallel* tp, const Tensor& dy);

// Where a layer writes the whole-sequence tensor that tp_leave (tp_enter_backward) reduces to
// this rank's part: workspace 0 (2) under sequence parallelism, else the cache's buffer
// (scratch) `slot`.
// type: the activations' (f32, bf16 or f16).
Tensor tp_whole_output(TensorParallel* tp, Cache* cache, size_t slot, const Shape& shape,
                       DType type);
Tensor tp_whole_grad(TensorParallel* tp, Cache& cache, size_t slot, const Shape& shape, DType type);

// Whether activations between cut regions are split along the sequence.
inline bool sequence_split(const TensorParallel* tp) { return tp != nullptr && tp->sequence(); }

}  // namespace tessel::nn
