#include "tessel/nn/tensor_parallel.h"

#include "tessel/tensor/device.h"

namespace tessel::nn {
namespace {

// [B, T, C] and its sequence chunks [B, T/t, C]: the collectives move rank-major chunks
// [t][B][T/t][C], so gathering and scattering along T goes through a staging buffer.
struct SeqShape {
  int64_t B, T, C;  // the whole tensor
};

SeqShape whole_of_part(const Tensor& part, int t) {
  TESSEL_CHECK(part.ndim() == 3,
               "tensor parallel: sequence parallelism needs [B, T, C] "
               "activations, got ",
               shape_str(part.shape()));
  return {part.dim(0), part.dim(1) * t, part.dim(2)};
}

SeqShape whole_of(const Tensor& whole, int t) {
  TESSEL_CHECK(whole.ndim() == 3 && whole.dim(1) % t == 0,
               "tensor parallel: sequence "
               "parallelism needs [B, T, C] activations with T a multiple of ",
               t, ", got ", shape_str(whole.shape()));
  return {whole.dim(0), whole.dim(1), whole.dim(2)};
}

// Copies between [B][T][C] and chunk-major [t][B][T/t][C] (flat views of either, on one
// device: a copy per chunk row, so a device moves them with its own copies); to_chunks picks
// the direction.
void rearrange(const Tensor& dst, const Tensor& src, const SeqShape& s, int t, bool to_chunks) {
  const int64_t Tc = s.T / t, row = Tc * s.C;
  for (int r = 0; r < t; ++r)
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t chunk = (r * s.B + b) * row, seq = (b * s.T + r * Tc) * s.C;
      if (to_chunks)
        dst.view(chunk, {row}).copy_from(src.view(seq, {row}));
      else
        dst.view(seq, {row}).copy_from(src.view(chunk, {row}));
    }
}

// All-gather along T: [B, T/t, C] -> [B, T, C] in workspace 0, in the part's type.
Tensor gather_sequence(TensorParallel& tp, const Tensor& part) {
  const SeqShape s = whole_of_part(part, tp.size());
  const DType type = part.dtype();
  Tensor whole = tp.workspace(0, {s.B, s.T, s.C}, type);
  if (s.B == 1) {  // chunk-major is already sequence order
    tp.all_gather(part.raw(), whole.raw(), part.numel(), type);
    return whole;
  }
  Tensor staging = tp.workspace(1, {s.B * s.T * s.C}, type);
  tp.all_gather(part.raw(), staging.raw(), part.numel(), type);
  rearrange(whole, staging, s, tp.size(), false);
  return whole;
}

// Reduce-scatter along T: [B, T, C] summed over the group -> this rank's [B, T/t, C] in `part`
// (of the whole's type).
Tensor scatter_sequence(TensorParallel& tp, const Tensor& whole, Tensor part) {
  const SeqShape s = whole_of(whole, tp.size());
  const DType type = whole.dtype();
  if (s.B == 1) {
    tp.reduce_scatter(whole.raw(), part.raw(), part.numel(), type);
    return part;
  }
  Tensor staging = tp.workspace(1, {s.B * s.T * s.C}, type);
  rearrange(staging, whole, s, tp.size(), true);
  tp.reduce_scatter(staging.raw(), part.raw(), part.numel(), type);
  return part;
}

Shape part_shape(const Tensor& whole, int t) {
  const SeqShape s = whole_of(whole, t);
  return {s.B, s.T / t, s.C};
}

}  // namespace

Tensor TensorParallel::workspace(int k, const Shape& shape, DType type) {
  TESSEL_CHECK(k >= 0 && k < 3, "tensor parallel: no workspace ", k);
  Tensor& w = workspace_[k];
  if (!w.defined() || w.dtype() != type || w.numel() < shape_numel(shape) ||
      w.device() != current_device())
    w = Tensor::empty({shape_numel(shape)}, type, current_device());
  return w.view(0, shape);
}

Tensor tp_enter(TensorParallel* tp, const Tensor& x) {
  return sequence_split(tp) ? gather_sequence(*tp, x) : x;
}

Shape tp_entered_shape(const TensorParallel* tp, Shape part) {
  if (sequence_split(tp) && part.size() == 3) part[1] *= tp->size();
  return part;
}

Tensor tp_enter_backward(TensorParallel* tp, const Tensor& dx, Cache& cache, size_t slot) {
  if (tp == nullptr || !dx.defined()) return dx;
  if (tp->sequence())
    return scatter_sequence(*tp, dx, cache.scratch(slot, part_shape(dx, tp->size()), dx.dtype()));
  tp->all_reduce_sum(dx.raw(), dx.numel(), dx.dtype());
  return dx;
}

Tensor tp_leave(TensorParallel* tp, const Tensor& y, Cache* cache, size_t slot) {
  if (tp == nullptr) return y;
  if (tp->sequence())
    return scatter_sequence(*tp, y, output(cache, slot, part_shape(y, tp->size()), y.dtype()));
  tp->all_reduce_sum(y.raw(), y.numel(), y.dtype());
  return y;
}

Tensor tp_leave_backward(TensorParallel* tp, const Tensor& dy) {
  return sequence_split(tp) ? gather_sequence(*tp, dy) : dy;
}

Tensor tp_whole_output(TensorParallel* tp, Cache* cache, size_t slot, const Shape& shape,
                       DType type) {
  return sequence_split(tp) ? tp->workspace(0, shape, type) : output(cache, slot, shape, type);
}

Tensor tp_whole_grad(TensorParallel* tp, Cache& cache, size_t slot, const Shape& shape,
                     DType type) {
  return sequence_split(tp) ? tp->workspace(2, shape, type) : cache.scratch(slot, shape, type);
}

}  // namespace tessel::nn
