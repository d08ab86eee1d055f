// Causal attention through tensor-core GEMMs (cuBLASLt, bf16 in, f32 accumulate), for long
// sequences in bf16 where the flash kernels of attention.cu (CUDA cores, f32) are slow. Same
// contract and cache as attention_forward/backward: out, lse[B,NH,T]; the backward reads qkv,
// out, lse, dout and overwrites dqkv.
// The heads of one sequence are read and written in place, with no permute: head h of q, k, v is
// the [T, HS] matrix at qkv + b T 3C + {0, C, 2C} + h HS with leading dimension 3C, so the heads
// are one strided batch (stride HS). Per sequence and chunk of heads (scratch T x T per head):
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

using detail::bf16;
using detail::from_f32;
using detail::to_f32;

constexpr int kWarpsPerBlock = 8;  // one warp per row of the T x T matrices
// Scratch bytes per entry of a head's T x T: S and dP (f32), P and dS (bf16).
constexpr int64_t kEntryBytes = 12;
constexpr int64_t kScratchBudget = int64_t{256} << 20;
constexpr int64_t kMinT = 256;

// Row r (query i = r % T) of a chunk's scaled scores S[rows, T]: its causal log-sum-exp into
// lse[r] and P[r, j] = exp(S[r, j] - lse[r]) for j <= i, 0 for j > i.
__global__ void causal_softmax_kernel(bf16* P, float* lse, const float* S, int rows, int T) {
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;  // the whole warp
  const int i = r % T;
  const float* s = S + static_cast<int64_t>(r) * T;
  float m = -INFINITY;
  for (int j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
  m = detail::warp_max(m);
  float l = 0.0f;
  for (int j = lane; j <= i; j += 32) l += expf(s[j] - m);
  const float row_lse = m + logf(detail::warp_sum(l));
  bf16* p = P + static_cast<int64_t>(r) * T;
  for (int j = lane; j < T; j += 32) p[j] = from_f32<bf16>(j <= i ? expf(s[j] - row_lse) : 0.0f);
  if (lane == 0) lse[r] = row_lse;
}

// Row r (head r / T of the chunk, query i = r % T): P as the forward's and dS = P (dP - D_i),
// with D_i = dO_i . O_i read from out and dout (the chunk's first head, row stride C).
__global__ void softmax_backward_kernel(bf16* P, bf16* dS, const float* S, const float* dP,
                                        const float* lse, const bf16* out, const bf16* dout,
                                        int rows, int T, int C, int HS) {
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;  // the whole warp
  const int i = r % T;
  const int64_t at = static_cast<int64_t>(i) * C + (r / T) * HS;
  float D = 0.0f;
  for (int d = lane; d < HS; d += 32) D += to_f32(dout[at + d]) * to_f32(out[at + d]);
  D = detail::warp_sum(D);
  const float row_lse = lse[r];
  const int64_t row = static_cast<int64_t>(r) * T;
  for (int j = lane; j < T; j += 32) {
    const float p = j <= i ? expf(S[row + j] - row_lse) : 0.0f;
    P[row + j] = from_f32<bf16>(p);
    dS[row + j] = from_f32<bf16>(p * (dP[row + j] - D));
  }
}

// The shape and the scratch of one call; heads = heads per chunk.
struct Plan {
  int64_t B, T, C, NH, HS, heads;
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
  const int64_t heads = std::min<int64_t>(NH, static_cast<int64_t>(scratch_bytes) / per_head);
  if (heads < 1)
    throw InvalidArgument(str(who, ": scratch of ", scratch_bytes, " bytes holds no head of ",
                              per_head,
                              " bytes (12 T^2); size it with attention_gemm_scratch_bytes"));
  const int64_t n = heads * T * T;
  char* base = static_cast<char*>(scratch);
  return {B,
          T,
          C,
          NH,
          C / NH,
          heads,
          1.0f / sqrtf(static_cast<float>(C / NH)),
          reinterpret_cast<float*>(base),
          reinterpret_cast<float*>(base + 4 * n),
          reinterpret_cast<bf16*>(base + 8 * n),
          reinterpret_cast<bf16*>(base + 10 * n)};
}

// The heads [h0, h0 + n) of sequence b: its q matrix (k at +C, v at +2C), its rows in out/dout.
struct Chunk {
  int64_t n;
  const bf16* q;
  int64_t row;  // offset of (b, 0, h0) in a [B,T,C] tensor
  int64_t lse;  // offset of (b, h0, 0) in lse[B,NH,T]
};

template <typename F>
void for_each_chunk(const Plan& p, const void* qkv, F&& f) {
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h0 = 0; h0 < p.NH; h0 += p.heads)
      f(Chunk{std::min(p.heads, p.NH - h0),
              static_cast<const bf16*>(qkv) + b * p.T * 3 * p.C + h0 * p.HS,
              b * p.T * p.C + h0 * p.HS, (b * p.NH + h0) * p.T});
}

// S = scale Q K^T for the chunk's heads.
void scores(Blas& blas, cudaStream_t s, const Plan& p, const Chunk& c) {
  const int64_t ld = 3 * p.C, TT = p.T * p.T;
  gemm_batched(blas, s, false, true, p.T, p.T, p.HS, p.scale, {c.q, DType::kBF16, ld},
               {c.q + p.C, DType::kBF16, ld}, 0.0f, {p.S, DType::kF32, p.T}, {c.n, p.HS, p.HS, TT});
}

unsigned row_blocks(const Plan& p, const Chunk& c) {
  return detail::ceil_div(c.n * p.T, kWarpsPerBlock);
}

}  // namespace

bool attention_gemm_supported(DType t, int64_t T, int64_t HS) {
  return t == DType::kBF16 && T >= kMinT && T % 8 == 0 && T < (1 << 30) &&
         attention_head_size_supported(HS);
}

size_t attention_gemm_scratch_bytes(int64_t T, int64_t NH) {
  const int64_t per_head = T * T * kEntryBytes;
  const int64_t heads = std::clamp<int64_t>(kScratchBudget / per_head, 1, std::max<int64_t>(NH, 1));
  return static_cast<size_t>(heads * per_head);
}

void attention_gemm_forward(Blas& blas, void* scratch, size_t scratch_bytes, void* out, float* lse,
                            const void* qkv, int64_t B, int64_t T, int64_t C, int64_t NH, DType t,
                            cudaStream_t s) {
  const Plan p = make_plan(scratch, scratch_bytes, B, T, C, NH, t, "cuda attention_gemm_forward");
  const int64_t TT = p.T * p.T;
  for_each_chunk(p, qkv, [&](const Chunk& c) {
    scores(blas, s, p, c);
    causal_softmax_kernel<<<row_blocks(p, c), kWarpsPerBlock * 32, 0, s>>>(
        p.P, lse + c.lse, p.S, static_cast<int>(c.n * p.T), static_cast<int>(p.T));
    check_launch("cuda attention_gemm_forward (softmax)");
    gemm_batched(blas, s, false, false, p.T, p.HS, p.T, 1.0f, {p.P, DType::kBF16, p.T},
                 {c.q + 2 * p.C, DType::kBF16, 3 * p.C}, 0.0f,
                 {static_cast<bf16*>(out) + c.row, DType::kBF16, p.C}, {c.n, TT, p.HS, p.HS});
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
                 {c.n, p.HS, p.HS, TT});
    softmax_backward_kernel<<<row_blocks(p, c), kWarpsPerBlock * 32, 0, s>>>(
        p.P, p.dS, p.S, p.dP, lse + c.lse, static_cast<const bf16*>(out) + c.row, g,
        static_cast<int>(c.n * p.T), static_cast<int>(p.T), static_cast<int>(p.C),
        static_cast<int>(p.HS));
    check_launch("cuda attention_gemm_backward (softmax)");
    const GemmBatch from_tt{c.n, TT, p.HS, p.HS};
    // dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q
    gemm_batched(blas, s, true, false, p.T, p.HS, p.T, 1.0f, {p.P, DType::kBF16, p.T},
                 {g, DType::kBF16, p.C}, 0.0f, {dq + 2 * p.C, DType::kBF16, ld}, from_tt);
    gemm_batched(blas, s, false, false, p.T, p.HS, p.T, p.scale, {p.dS, DType::kBF16, p.T},
                 {c.q + p.C, DType::kBF16, ld}, 0.0f, {dq, DType::kBF16, ld}, from_tt);
    gemm_batched(blas, s, true, false, p.T, p.HS, p.T, p.scale, {p.dS, DType::kBF16, p.T},
                 {c.q, DType::kBF16, ld}, 0.0f, {dq + p.C, DType::kBF16, ld}, from_tt);
  });
}

}  // namespace tessel::ops::cuda
