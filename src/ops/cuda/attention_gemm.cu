// Causal attention through tensor-core GEMMs (cuBLASLt, bf16 in, f32 accumulate), for long
// sequences in bf16 where the flash kernels of attention.cu (CUDA cores, f32) are slow. Same
// contract and cache as attention_forward/backward: out, lse[B,NH,T]; the backward reads qkv,
// out, lse, dout and overwrites dqkv.
// Heads are read and written in place, with no permute: head h of q, k, v in sequence b is the
// [T, HS] matrix at qkv + b T 3C + {0, C, 2C} + h HS with leading dimension 3C, so the heads of
// one sequence are a strided batch (stride HS), and so is one head of every sequence (stride
// T 3C). The GEMMs batch over the larger of NH and B (fewer launches: the char GPT has 64
// sequences of 6 heads), looping over the other; per chunk of that batch (scratch T x T each):
//   forward:  S = scale Q K^T (f32); P = exp(S - lse) below the diagonal, 0 above (bf16), and
//             lse (causal_softmax_kernel); O = P V.
//   backward: S again; dP = dO V^T (f32); P again and dS = P (dP - D), D_i = dO_i . O_i
//             (softmax_backward_kernel, bf16); dV = P^T dO; dQ = scale dS K; dK = scale dS^T Q.
// The GEMMs compute the full T x T products (the upper triangle is zeros in P and dS). Every sum
// has one order: the GEMMs' algorithms are picked by the same heuristic call each time (blas.cc),
// the row kernels use fixed warp sums, and nothing is atomic.
#include <algorithm>

#include "common.cuh"
#include "tessel/ops/cuda/blas.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // one warp per row of the T x T matrices
// Scratch bytes per entry of a head's T x T: S and dP (f32), P and dS (bf16).
constexpr int64_t kEntryBytes = 12;
constexpr int64_t kScratchBudget = int64_t{256} << 20;
constexpr int64_t kMinT = 256;

// The row kernels read S and dP four floats at a time (T is a multiple of 8, so every row and
// every group of four is 16-byte aligned) and write P and dS four bf16 at a time; lane l takes
// the groups at columns 4 l + 128 k. Only the groups that hold a column j <= i are read.
__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store4(bf16* p, const float (&v)[4]) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]), hi = __floats2bfloat162_rn(v[2], v[3]);
  uint2 u;
  u.x = *reinterpret_cast<const unsigned*>(&lo);
  u.y = *reinterpret_cast<const unsigned*>(&hi);
  *reinterpret_cast<uint2*>(p) = u;
}

// Row r (query i = r % T of the chunk's matrix r / T) of a chunk's scaled scores S[rows, T]: its
// causal log-sum-exp into lse[(r / T) lse_stride + i] and P[r, j] = exp(S[r, j] - lse) for
// j <= i, 0 for j > i.
__global__ void causal_softmax_kernel(bf16* P, float* lse, int64_t lse_stride, const float* S,
                                      int rows, int T) {
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;  // the whole warp
  const int i = r % T;
  const float* s = S + static_cast<int64_t>(r) * T;
  float m = -INFINITY;
  for (int j = 4 * lane; j <= i; j += 128) {
    const float4 v = load4(s + j);
    m = fmaxf(m, v.x);
    if (j + 1 <= i) m = fmaxf(m, v.y);
    if (j + 2 <= i) m = fmaxf(m, v.z);
    if (j + 3 <= i) m = fmaxf(m, v.w);
  }
  m = detail::warp_max(m);
  float l = 0.0f;
  for (int j = 4 * lane; j <= i; j += 128) {
    const float4 v = load4(s + j);
    l += expf(v.x - m);
    if (j + 1 <= i) l += expf(v.y - m);
    if (j + 2 <= i) l += expf(v.z - m);
    if (j + 3 <= i) l += expf(v.w - m);
  }
  const float row_lse = m + logf(detail::warp_sum(l));
  bf16* p = P + static_cast<int64_t>(r) * T;
  for (int j = 4 * lane; j < T; j += 128) {
    float e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (j <= i) {
      const float4 v = load4(s + j);
      e[0] = expf(v.x - row_lse);
      if (j + 1 <= i) e[1] = expf(v.y - row_lse);
      if (j + 2 <= i) e[2] = expf(v.z - row_lse);
      if (j + 3 <= i) e[3] = expf(v.w - row_lse);
    }
    store4(p + j, e);
  }
  if (lane == 0) lse[(r / T) * lse_stride + i] = row_lse;
}

// Row r (matrix r / T of the chunk, query i = r % T): P as the forward's and dS = P (dP - D_i),
// with D_i = dO_i . O_i read from out and dout (the chunk's first matrix; rows C apart, matrices
// out_stride apart). Above the diagonal both are 0, and S and dP are not read there.
__global__ void softmax_backward_kernel(bf16* P, bf16* dS, const float* S, const float* dP,
                                        const float* lse, int64_t lse_stride, const bf16* out,
                                        const bf16* dout, int64_t out_stride, int rows, int T,
                                        int C, int HS) {
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;  // the whole warp
  const int i = r % T;
  const int64_t at = static_cast<int64_t>(i) * C + (r / T) * out_stride;
  float D = 0.0f;
  for (int d = lane; d < HS; d += 32) D += to_f32(dout[at + d]) * to_f32(out[at + d]);
  D = detail::warp_sum(D);
  const float row_lse = lse[(r / T) * lse_stride + i];
  const int64_t row = static_cast<int64_t>(r) * T;
  for (int j = 4 * lane; j < T; j += 128) {
    float p[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ds[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (j <= i) {
      const float4 sv = load4(S + row + j), dv = load4(dP + row + j);
      const float sq[4] = {sv.x, sv.y, sv.z, sv.w}, dq[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (j + q <= i) {
          p[q] = expf(sq[q] - row_lse);
          ds[q] = p[q] * (dq[q] - D);
        }
    }
    store4(P + row + j, p);
    store4(dS + row + j, ds);
  }
}

// The shape and the scratch of one call. The batch runs over sequences (by_sequence, when
// B > NH) or heads, `per_chunk` matrices a chunk; the strides are one batch step's in qkv (and
// dqkv), in out (and dout) and in lse.
struct Plan {
  int64_t B, T, C, NH, HS, per_chunk;
  bool by_sequence;
  int64_t qkv_stride, out_stride, lse_stride;
  float scale;
  float *S, *dP;
  bf16 *P, *dS;
};

Plan make_plan(void* scratch, size_t scratch_bytes, int64_t B, int64_t T, int64_t C, int64_t NH,
               DType t, const char* who) {
  TESSEL_CHECK(B > 0 && NH > 0 && C > 0 && C % NH == 0, who,
               ": need B, NH > 0 and C a multiple of NH, got B=", B, " C=", C, " NH=", NH);
  if (!attention_gemm_supported(t, T, C / NH))
    throw InvalidArgument(str(who, ": needs bf16, T >= ", kMinT, " a multiple of 8 and a head ",
                              "size of 16, 32, 64 or 128, got ", dtype_name(t), " T=", T,
                              " HS=", C / NH, "; use attention_forward/backward (attention.cu)"));
  const int64_t per_head = T * T * kEntryBytes;
  const bool by_sequence = B > NH;
  const int64_t per_chunk =
      std::min<int64_t>(by_sequence ? B : NH, static_cast<int64_t>(scratch_bytes) / per_head);
  if (per_chunk < 1)
    throw InvalidArgument(str(who, ": scratch of ", scratch_bytes, " bytes holds no head of ",
                              per_head,
                              " bytes (12 T^2); size it with attention_gemm_scratch_bytes"));
  const int64_t n = per_chunk * T * T;
  char* base = static_cast<char*>(scratch);
  return {B,
          T,
          C,
          NH,
          C / NH,
          per_chunk,
          by_sequence,
          by_sequence ? T * 3 * C : C / NH,
          by_sequence ? T * C : C / NH,
          by_sequence ? NH * T : T,
          1.0f / sqrtf(static_cast<float>(C / NH)),
          reinterpret_cast<float*>(base),
          reinterpret_cast<float*>(base + 4 * n),
          reinterpret_cast<bf16*>(base + 8 * n),
          reinterpret_cast<bf16*>(base + 10 * n)};
}

// n matrices from (sequence b, head h) on, along the plan's batch: the first's q matrix (k at
// +C, v at +2C), its rows in out/dout and in lse.
struct Chunk {
  int64_t n;
  const bf16* q;
  int64_t row;  // offset of (b, 0, h) in a [B,T,C] tensor
  int64_t lse;  // offset of (b, h, 0) in lse[B,NH,T]
};

template <typename F>
void for_each_chunk(const Plan& p, const void* qkv, F&& f) {
  const int64_t outer = p.by_sequence ? p.NH : p.B, inner = p.by_sequence ? p.B : p.NH;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < inner; k += p.per_chunk) {
      const int64_t b = p.by_sequence ? k : o, h = p.by_sequence ? o : k;
      f(Chunk{std::min(p.per_chunk, inner - k),
              static_cast<const bf16*>(qkv) + b * p.T * 3 * p.C + h * p.HS,
              b * p.T * p.C + h * p.HS, (b * p.NH + h) * p.T});
    }
}

// S = scale Q K^T for the chunk's heads.
void scores(Blas& blas, cudaStream_t s, const Plan& p, const Chunk& c) {
  const int64_t ld = 3 * p.C, TT = p.T * p.T;
  gemm_batched(blas, s, false, true, p.T, p.T, p.HS, p.scale, {c.q, DType::kBF16, ld},
               {c.q + p.C, DType::kBF16, ld}, 0.0f, {p.S, DType::kF32, p.T},
               {c.n, p.qkv_stride, p.qkv_stride, TT});
}

unsigned row_blocks(const Plan& p, const Chunk& c) {
  return detail::ceil_div(c.n * p.T, kWarpsPerBlock);
}

}  // namespace

bool attention_gemm_supported(DType t, int64_t T, int64_t HS) {
  return t == DType::kBF16 && T >= kMinT && T % 8 == 0 && T < (1 << 30) &&
         attention_head_size_supported(HS);
}

size_t attention_gemm_scratch_bytes(int64_t B, int64_t T, int64_t NH) {
  const int64_t per_head = T * T * kEntryBytes;
  const int64_t batch = std::max<int64_t>(std::max(B, NH), 1);  // make_plan's batch
  const int64_t n = std::clamp<int64_t>(kScratchBudget / per_head, 1, batch);
  return static_cast<size_t>(n * per_head);
}

void attention_gemm_forward(Blas& blas, void* scratch, size_t scratch_bytes, void* out, float* lse,
                            const void* qkv, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                            cudaStream_t s) {
  const Plan p = make_plan(scratch, scratch_bytes, B, T, C, NH, t, "cuda attention_gemm_forward");
  const int64_t TT = p.T * p.T;
  for_each_chunk(p, qkv, [&](const Chunk& c) {
    scores(blas, s, p, c);
    causal_softmax_kernel<<<row_blocks(p, c), kWarpsPerBlock * 32, 0, s>>>(
        p.P, lse + c.lse, p.lse_stride, p.S, static_cast<int>(c.n * p.T), static_cast<int>(p.T));
    check_launch("cuda attention_gemm_forward (softmax)");
    gemm_batched(blas, s, false, false, p.T, p.HS, p.T, 1.0f, {p.P, DType::kBF16, p.T},
                 {c.q + 2 * p.C, DType::kBF16, 3 * p.C}, 0.0f,
                 {static_cast<bf16*>(out) + c.row, DType::kBF16, p.C},
                 {c.n, TT, p.qkv_stride, p.out_stride});
  });
}

void attention_gemm_backward(Blas& blas, void* scratch, size_t scratch_bytes, void* dqkv,
                             const void* dout, const void* qkv, const void* out, const float* lse,
                             int64_t B, int64_t T, int64_t C, int64_t NH, DType t, cudaStream_t s) {
  const Plan p = make_plan(scratch, scratch_bytes, B, T, C, NH, t, "cuda attention_gemm_backward");
  const int64_t TT = p.T * p.T, ld = 3 * p.C;
  const auto* q_all = static_cast<const bf16*>(qkv);
  for_each_chunk(p, qkv, [&](const Chunk& c) {
    const bf16* g = static_cast<const bf16*>(dout) + c.row;
    bf16* dq = static_cast<bf16*>(dqkv) + (c.q - q_all);
    scores(blas, s, p, c);
    gemm_batched(blas, s, false, true, p.T, p.T, p.HS, 1.0f, {g, DType::kBF16, p.C},
                 {c.q + 2 * p.C, DType::kBF16, ld}, 0.0f, {p.dP, DType::kF32, p.T},
                 {c.n, p.out_stride, p.qkv_stride, TT});
    softmax_backward_kernel<<<row_blocks(p, c), kWarpsPerBlock * 32, 0, s>>>(
        p.P, p.dS, p.S, p.dP, lse + c.lse, p.lse_stride, static_cast<const bf16*>(out) + c.row, g,
        p.out_stride, static_cast<int>(c.n * p.T), static_cast<int>(p.T), static_cast<int>(p.C),
        static_cast<int>(p.HS));
    check_launch("cuda attention_gemm_backward (softmax)");
    const GemmBatch from_tt{c.n, TT, p.qkv_stride, p.qkv_stride};
    // dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q
    gemm_batched(blas, s, true, false, p.T, p.HS, p.T, 1.0f, {p.P, DType::kBF16, p.T},
                 {g, DType::kBF16, p.C}, 0.0f, {dq + 2 * p.C, DType::kBF16, ld},
                 {c.n, TT, p.out_stride, p.qkv_stride});
    gemm_batched(blas, s, false, false, p.T, p.HS, p.T, p.scale, {p.dS, DType::kBF16, p.T},
                 {c.q + p.C, DType::kBF16, ld}, 0.0f, {dq, DType::kBF16, ld}, from_tt);
    gemm_batched(blas, s, true, false, p.T, p.HS, p.T, p.scale, {p.dS, DType::kBF16, p.T},
                 {c.q, DType::kBF16, ld}, 0.0f, {dq + p.C, DType::kBF16, ld}, from_tt);
  });
}

}  // namespace tessel::ops::cuda
