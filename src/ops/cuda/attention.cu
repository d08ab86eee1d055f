// Causal multi-head attention, flash style (no T x T matrix in memory), f32 arithmetic.
// Terms: a *row group* is the kTpr threads that share one query (forward, dq) or one key
// (dk, dv) row, each holding DH of its HS dimensions in registers and adding partial dot
// products with a butterfly over the group; a *tile* is kTile rows of the other operand staged
// in shared memory (padded by 4 floats per part: the kTpr parts of one row fall in different
// banks while staying 16-byte aligned).
//   forward:  per query tile of kRows rows, walk the key tiles up to the diagonal with an
//             online softmax (running max m, sum l, output o rescaled by exp(m_old - m_new));
//             write out = o / l and lse = m + log l.
//   backward: D_i = dO_i . O_i; P_ij = exp(scale q_i.k_j - lse_i);
//             dq kernel (one group per query, keys j <= i):  dq_i = scale sum_j P_ij (dO_i.v_j -
//             D_i) k_j dkv kernel (one group per key, queries i >= j): dv_j = sum_i P_ij dO_i,
//                                                            dk_j = scale sum_i P_ij (dO_i.v_j -
//                                                            D_i) q_i
//             Each output row is summed by one row group in one order: deterministic, no atomics.
#include "common.cuh"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kRows = 64;  // rows (row groups) per block
constexpr int kTile = 32;  // rows per shared-memory tile
constexpr int kChunk = 8;  // forward: keys whose scores are held at once

template <int HS, int DH>
struct Layout {
  static constexpr int kTpr = HS / DH;
  static constexpr int kPart = DH + 4;  // floats per part of a row in shared memory
  static constexpr int kStride = kTpr * kPart;
  __device__ static int at(int d) { return (d / DH) * kPart + d % DH; }
};

// Sum over the kTpr lanes of one row group (all of them get the same value).
template <int kTpr>
__device__ __forceinline__ float group_sum(float v, unsigned mask) {
#pragma unroll
  for (int o = kTpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}

template <int kTpr>
__device__ __forceinline__ unsigned group_mask() {
  if constexpr (kTpr == 1) return 1u << (threadIdx.x % 32);
  const unsigned lane = threadIdx.x % 32;
  return ((1u << kTpr) - 1u) << (lane & ~(kTpr - 1u));
}

// dst[r][d] = src[(row0 + r) * ld + d] for kTile rows of HS values (0 past row T).
template <typename T, int HS, int DH>
__device__ void load_tile(float* dst, const T* src, int row0, int T_, int64_t ld) {
  using L = Layout<HS, DH>;
  for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS;
    dst[r * L::kStride + L::at(d)] =
        row0 + r < T_ ? to_f32(src[static_cast<int64_t>(row0 + r) * ld + d]) : 0.0f;
  }
}

template <int DH>
__device__ __forceinline__ float dot(const float* a, const float* b) {
  float s = 0.0f;
#pragma unroll
  for (int d = 0; d < DH; ++d) s += a[d] * b[d];
  return s;
}

template <typename T, int HS, int DH>
__global__ void __launch_bounds__(kRows*(HS / DH))
    attention_forward_kernel(T* out, float* lse, const T* qkv, int T_, int C, int NH, float scale) {
  using L = Layout<HS, DH>;
  __shared__ __align__(16) float ks[kTile * L::kStride];
  __shared__ __align__(16) float vs[kTile * L::kStride];
  const int b = blockIdx.z, h = blockIdx.y, part = threadIdx.x % L::kTpr;
  const int i = blockIdx.x * kRows + threadIdx.x / L::kTpr;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const T* seq = qkv + static_cast<int64_t>(b) * T_ * C3;
  const unsigned mask = group_mask<L::kTpr>();
  float q[DH], o[DH];
#pragma unroll
  for (int d = 0; d < DH; ++d) {
    q[d] = i < T_ ? to_f32(seq[i * C3 + h * HS + part * DH + d]) : 0.0f;
    o[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int key_end = min(T_, (blockIdx.x + 1) * kRows);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_tile<T, HS, DH>(ks, seq + C + h * HS, k0, T_, C3);
    load_tile<T, HS, DH>(vs, seq + 2 * C + h * HS, k0, T_, C3);
    __syncthreads();
    if (k0 > i) continue;  // the whole tile lies above this row's diagonal
      // Chunks of kChunk keys: their scores, the new running max, then rescale and accumulate
      // (small chunks keep the scores in registers without unrolling the whole tile).
#pragma unroll 1
    for (int j0 = 0; j0 < kTile; j0 += kChunk) {
      float s[kChunk];
      float mx = m;
#pragma unroll
      for (int jj = 0; jj < kChunk; ++jj) {
        const float* kr = ks + (j0 + jj) * L::kStride + part * L::kPart;
        const float qk = group_sum<L::kTpr>(dot<DH>(q, kr), mask);
        s[jj] = k0 + j0 + jj <= i ? qk * scale : -INFINITY;
        mx = fmaxf(mx, s[jj]);
      }
      const float corr = expf(m - mx);  // 0 on the first chunk (m = -inf)
      l *= corr;
#pragma unroll
      for (int d = 0; d < DH; ++d) o[d] *= corr;
#pragma unroll
      for (int jj = 0; jj < kChunk; ++jj) {
        const float p = expf(s[jj] - mx);
        l += p;
        const float* vr = vs + (j0 + jj) * L::kStride + part * L::kPart;
#pragma unroll
        for (int d = 0; d < DH; ++d) o[d] += p * vr[d];
      }
      m = mx;
    }
  }
  if (i >= T_) return;
  const float inv = 1.0f / l;
  T* orow = out + (static_cast<int64_t>(b) * T_ + i) * C + h * HS + part * DH;
#pragma unroll
  for (int d = 0; d < DH; ++d) orow[d] = from_f32<T>(o[d] * inv);
  if (part == 0) lse[(static_cast<int64_t>(b) * NH + h) * T_ + i] = m + logf(l);
}

template <typename T, int HS, int DH>
__global__ void __launch_bounds__(kRows*(HS / DH))
    attention_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const T* out,
                                 const float* lse, int T_, int C, int NH, float scale) {
  using L = Layout<HS, DH>;
  __shared__ __align__(16) float ks[kTile * L::kStride];
  __shared__ __align__(16) float vs[kTile * L::kStride];
  const int b = blockIdx.z, h = blockIdx.y, part = threadIdx.x % L::kTpr;
  const int i = blockIdx.x * kRows + threadIdx.x / L::kTpr;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const T* seq = qkv + static_cast<int64_t>(b) * T_ * C3;
  const int64_t row = (static_cast<int64_t>(b) * T_ + i) * C + h * HS + part * DH;  // in [B,T,C]
  const unsigned mask = group_mask<L::kTpr>();
  float q[DH], g[DH], dq[DH];
  float partial_d = 0.0f;
#pragma unroll
  for (int d = 0; d < DH; ++d) {
    q[d] = i < T_ ? to_f32(seq[i * C3 + h * HS + part * DH + d]) : 0.0f;
    g[d] = i < T_ ? to_f32(dout[row + d]) : 0.0f;
    partial_d += i < T_ ? g[d] * to_f32(out[row + d]) : 0.0f;
    dq[d] = 0.0f;
  }
  const float D = group_sum<L::kTpr>(partial_d, mask);
  const float li = i < T_ ? lse[(static_cast<int64_t>(b) * NH + h) * T_ + i] : 0.0f;
  const int key_end = min(T_, (blockIdx.x + 1) * kRows);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();
    load_tile<T, HS, DH>(ks, seq + C + h * HS, k0, T_, C3);
    load_tile<T, HS, DH>(vs, seq + 2 * C + h * HS, k0, T_, C3);
    __syncthreads();
    if (k0 > i) continue;
#pragma unroll 2
    for (int jj = 0; jj < kTile; ++jj) {
      const float* kr = ks + jj * L::kStride + part * L::kPart;
      const float* vr = vs + jj * L::kStride + part * L::kPart;
      const float s = group_sum<L::kTpr>(dot<DH>(q, kr), mask) * scale;
      const float dp = group_sum<L::kTpr>(dot<DH>(g, vr), mask);
      const float p = k0 + jj <= i ? expf(s - li) : 0.0f;
      const float ds = p * (dp - D);
#pragma unroll
      for (int d = 0; d < DH; ++d) dq[d] += ds * kr[d];
    }
  }
  if (i >= T_) return;
  T* dst = dqkv + (static_cast<int64_t>(b) * T_ + i) * C3 + h * HS + part * DH;
#pragma unroll
  for (int d = 0; d < DH; ++d) dst[d] = from_f32<T>(dq[d] * scale);
}

template <typename T, int HS, int DH>
__global__ void __launch_bounds__(kRows*(HS / DH))
    attention_backward_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const T* out,
                                  const float* lse, int T_, int C, int NH, float scale) {
  using L = Layout<HS, DH>;
  __shared__ __align__(16) float qs[kTile * L::kStride];
  __shared__ __align__(16) float gs[kTile * L::kStride];
  __shared__ float lse_s[kTile], d_s[kTile];
  const int b = blockIdx.z, h = blockIdx.y, part = threadIdx.x % L::kTpr;
  const int j = blockIdx.x * kRows + threadIdx.x / L::kTpr;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const T* seq = qkv + static_cast<int64_t>(b) * T_ * C3;
  const T* dout_seq = dout + static_cast<int64_t>(b) * T_ * C + h * HS;
  const T* out_seq = out + static_cast<int64_t>(b) * T_ * C + h * HS;
  const float* lse_seq = lse + (static_cast<int64_t>(b) * NH + h) * T_;
  const unsigned mask = group_mask<L::kTpr>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  float k[DH], v[DH], dk[DH], dv[DH];
#pragma unroll
  for (int d = 0; d < DH; ++d) {
    k[d] = j < T_ ? to_f32(seq[j * C3 + C + h * HS + part * DH + d]) : 0.0f;
    v[d] = j < T_ ? to_f32(seq[j * C3 + 2 * C + h * HS + part * DH + d]) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  for (int i0 = blockIdx.x * kRows; i0 < T_; i0 += kTile) {
    __syncthreads();
    load_tile<T, HS, DH>(qs, seq + h * HS, i0, T_, C3);
    load_tile<T, HS, DH>(gs, dout_seq, i0, T_, C);
    __syncthreads();
    // D_i = dO_i . O_i for the tile's queries, one warp per row.
    for (int r = warp; r < kTile; r += warps) {
      const int i = i0 + r;
      float a = 0.0f;
      if (i < T_)
        for (int d = lane; d < HS; d += 32)
          a += gs[r * L::kStride + L::at(d)] * to_f32(out_seq[static_cast<int64_t>(i) * C + d]);
      a = detail::warp_sum(a);
      if (lane == 0) {
        d_s[r] = a;
        lse_s[r] = i < T_ ? lse_seq[i] : 0.0f;
      }
    }
    __syncthreads();
    if (i0 + kTile <= j) continue;  // every query of the tile precedes this key
#pragma unroll 2
    for (int ii = 0; ii < kTile; ++ii) {
      const int i = i0 + ii;
      const float* qr = qs + ii * L::kStride + part * L::kPart;
      const float* gr = gs + ii * L::kStride + part * L::kPart;
      const float s = group_sum<L::kTpr>(dot<DH>(k, qr), mask) * scale;
      const float dp = group_sum<L::kTpr>(dot<DH>(v, gr), mask);
      const float p = (i >= j && i < T_) ? expf(s - lse_s[ii]) : 0.0f;
      const float ds = p * (dp - d_s[ii]);
#pragma unroll
      for (int d = 0; d < DH; ++d) {
        dv[d] += p * gr[d];
        dk[d] += ds * qr[d];
      }
    }
  }
  if (j >= T_) return;
  T* dst = dqkv + (static_cast<int64_t>(b) * T_ + j) * C3 + h * HS + part * DH;
#pragma unroll
  for (int d = 0; d < DH; ++d) {
    dst[C + d] = from_f32<T>(dk[d] * scale);
    dst[2 * C + d] = from_f32<T>(dv[d]);
  }
}

struct Shape {
  int B, T, C, NH, HS;
  float scale;
};

Shape check_shape(int64_t B, int64_t T, int64_t C, int64_t NH, const char* who) {
  TESSEL_CHECK(B > 0 && T > 0 && NH > 0 && C > 0 && C % NH == 0, who,
               ": need B, T, NH > 0 and C a multiple of NH, got B=", B, " T=", T, " C=", C,
               " NH=", NH);
  TESSEL_CHECK(B < 65536 && NH < 65536 && T < (1 << 30) && C < (1 << 28), who,
               ": shape too large for one launch, got B=", B, " T=", T, " C=", C, " NH=", NH);
  const int64_t HS = C / NH;
  if (!attention_head_size_supported(HS))
    throw InvalidArgument(str(who, ": head size C/NH must be 16, 32, 64 or 128, got ", HS,
                              "; pick NH so that C/NH is one of them"));
  return {static_cast<int>(B),  static_cast<int>(T),  static_cast<int>(C),
          static_cast<int>(NH), static_cast<int>(HS), 1.0f / sqrtf(static_cast<float>(HS))};
}

// Calls f(std::integral_constant<int, HS>{}) for the supported head sizes.
template <typename F>
void dispatch_head(int HS, F&& f) {
  switch (HS) {
    case 16:
      f(std::integral_constant<int, 16>{});
      break;
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 64:
      f(std::integral_constant<int, 64>{});
      break;
    default:
      f(std::integral_constant<int, 128>{});
      break;
  }
}

}  // namespace

bool attention_head_size_supported(int64_t HS) {
  return HS == 16 || HS == 32 || HS == 64 || HS == 128;
}

void attention_forward(void* out, float* lse, const void* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH, DType t, cudaStream_t s) {
  const Shape sh = check_shape(B, T, C, NH, "cuda attention_forward");
  detail::dispatch(t, "cuda attention_forward", [&](auto tag) {
    using E = decltype(tag);
    dispatch_head(sh.HS, [&](auto hs) {
      constexpr int HS = decltype(hs)::value, DH = HS < 64 ? HS : 64;
      const dim3 grid(detail::ceil_div(sh.T, kRows), sh.NH, sh.B);
      attention_forward_kernel<E, HS, DH><<<grid, kRows*(HS / DH), 0, s>>>(
          static_cast<E*>(out), lse, static_cast<const E*>(qkv), sh.T, sh.C, sh.NH, sh.scale);
    });
  });
  check_launch("cuda attention_forward");
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                        cudaStream_t s) {
  const Shape sh = check_shape(B, T, C, NH, "cuda attention_backward");
  detail::dispatch(t, "cuda attention_backward", [&](auto tag) {
    using E = decltype(tag);
    dispatch_head(sh.HS, [&](auto hs) {
      constexpr int HS = decltype(hs)::value, DH = HS < 32 ? HS : 32;
      const dim3 grid(detail::ceil_div(sh.T, kRows), sh.NH, sh.B);
      attention_backward_dq_kernel<E, HS, DH><<<grid, kRows*(HS / DH), 0, s>>>(
          static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv),
          static_cast<const E*>(out), lse, sh.T, sh.C, sh.NH, sh.scale);
      check_launch("cuda attention_backward (dq)");
      attention_backward_dkv_kernel<E, HS, DH><<<grid, kRows*(HS / DH), 0, s>>>(
          static_cast<E*>(dqkv), static_cast<const E*>(dout), static_cast<const E*>(qkv),
          static_cast<const E*>(out), lse, sh.T, sh.C, sh.NH, sh.scale);
    });
  });
  check_launch("cuda attention_backward (dk, dv)");
}

}  // namespace tessel::ops::cuda
