// cuBLASLt GEMMs. Row-major C[M,N] = op(A) op(B) is, read column-major, C^T[N,M] =
// op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" our A, with the same transposes.
// Each Blas keeps the descriptors and the algorithm of every GEMM it has run, keyed by what they
// are made from (shapes, types, leading dimensions, batch strides, alignments, the epilogue):
// a repeated GEMM costs one cublasLtMatmul call, not descriptors and a heuristic query (the
// char GPT's step makes about 300 such calls), and gets the same algorithm, hence the same bits.
#include "tessel/ops/cuda/blas.h"

#include <cublasLt.h>

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "tessel/ops/cuda/check.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      throw InvalidArgument(
          str("cuda gemm: operands must be f32, bf16 or f16, got ", dtype_name(t)));
  }
}

// The largest power of two (<= 256) dividing the address and the batch stride in bytes (every
// matrix of a batch starts at such an address): cuBLASLt assumes 256-byte aligned buffers unless
// told, and views into arenas need not be.
uint32_t alignment(const void* p, int64_t stride, DType t) {
  const auto a = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride * dtype_size(t));
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

// RAII for a GEMM's descriptors.
struct Desc {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename V>
void set_op(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& v) {
  check_cublas(cublasLtMatmulDescSetAttribute(op, attr, &v, sizeof(v)),
               "cublasLtMatmulDescSetAttribute");
}

template <typename V>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, V v) {
  check_cublas(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)),
               "cublasLtMatmulPreferenceSetAttribute");
}

// Everything a GEMM's descriptors and algorithm are made from.
using PlanKey = std::array<int64_t, 18>;
struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

struct Plan {
  Desc d;
  cublasLtMatmulAlgo_t algo{};
};

// More distinct GEMMs than this (shapes that keep changing) start the cache afresh.
constexpr size_t kMaxPlans = 1024;

}  // namespace

struct Blas::Plans {
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> map;
};

Blas::Blas() : plans_(std::make_unique<Plans>()) {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
  const cudaError_t e = cudaMalloc(&workspace_, kWorkspaceBytes);
  if (e != cudaSuccess) {
    cublasLtDestroy(handle_);
    check_cuda(e, "cudaMalloc of the cuBLASLt workspace");
  }
}

Blas::~Blas() noexcept {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

size_t cublaslt_version() { return cublasLtGetVersion(); }

namespace {

void set_batch(cublasLtMatrixLayout_t layout, int64_t count, int64_t stride) {
  const int32_t n = static_cast<int32_t>(count);
  check_cublas(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)),
      "batch count");
  check_cublas(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof(stride)),
               "batch stride");
}

// The alignments (bytes) of cuBLASLt's A, B and C: our B, A and C.
struct Alignments {
  uint32_t a, b, c;
};

// The algorithm for the descriptors in d. The heuristic's first choice is a function of the
// descriptors and alignments alone: the same call picks the same algorithm every time, and
// cuBLASLt's algorithms give the same bits run to run on one GPU model.
cublasLtMatmulAlgo_t pick_algo(Blas& blas, Desc& d, int64_t M, int64_t N, int64_t K, ConstMatrix A,
                               Matrix C, const GemmBatch& batch, Alignments align) {
  check_cublas(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{Blas::kWorkspaceBytes});
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.a);
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.b);
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c);
  set_pref(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.c);
  cublasLtMatmulHeuristicResult_t best{};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(blas.handle(), d.op, d.a, d.b, d.c, d.c, d.pref, 1,
                                              &best, &found),
               "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    throw CudaError(str("cublas: no cuBLASLt algorithm for M=", M, " N=", N, " K=", K, " batch ",
                        batch.count, " ", dtype_name(A.type), " -> ", dtype_name(C.type),
                        "; pad the leading dimensions to a multiple of 8 elements"));
  return best.algo;
}

// The descriptors and algorithm of a GEMM, made once (bias: the epilogue, its pointer set per
// call).
std::unique_ptr<Plan> make_plan(Blas& blas, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                int64_t K, ConstMatrix A, ConstMatrix B, Matrix C, bool bias,
                                const GemmBatch& batch, Alignments align) {
  const cudaDataType_t ab = cuda_type(A.type), c = cuda_type(C.type);
  auto plan = std::make_unique<Plan>();
  Desc& d = plan->d;
  // CUBLAS_COMPUTE_32F is plain f32 (no TF32) for f32 inputs, f32 accumulation for 16-bit ones.
  check_cublas(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
  set_op(d.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_op(d.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  if (bias) set_op(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  // Column-major shapes (rows, cols, ld) of the stored matrices.
  const uint64_t rows_a = trans_b ? K : N, cols_a = trans_b ? N : K;
  const uint64_t rows_b = trans_a ? M : K, cols_b = trans_a ? K : M;
  check_cublas(cublasLtMatrixLayoutCreate(&d.a, ab, rows_a, cols_a, B.ld), "layout of B");
  check_cublas(cublasLtMatrixLayoutCreate(&d.b, ab, rows_b, cols_b, A.ld), "layout of A");
  check_cublas(cublasLtMatrixLayoutCreate(&d.c, c, N, M, C.ld), "layout of C");
  if (batch.count > 1) {
    set_batch(d.a, batch.count, batch.stride_b);
    set_batch(d.b, batch.count, batch.stride_a);
    set_batch(d.c, batch.count, batch.stride_c);
  }
  plan->algo = pick_algo(blas, d, M, N, K, A, C, batch, align);
  return plan;
}

// The one cuBLASLt call behind gemm and gemm_batched.
void matmul(Blas& blas, cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N,
            int64_t K, float alpha, ConstMatrix A, ConstMatrix B, float beta, Matrix C,
            const void* bias, const GemmBatch& batch) {
  TESSEL_CHECK(M >= 0 && N >= 0 && K >= 0, "cuda gemm: negative shape M=", M, " N=", N, " K=", K);
  TESSEL_CHECK(batch.count >= 1 && batch.count < (int64_t{1} << 31),
               "cuda gemm: batch count must be in [1, 2^31), got ", batch.count);
  if (M == 0 || N == 0) return;
  if (A.type != B.type)
    throw InvalidArgument(str("cuda gemm: A and B must have one type, got ", dtype_name(A.type),
                              " and ", dtype_name(B.type), "; convert one first (cuda::convert)"));
  if (C.type != DType::kF32 && C.type != A.type)
    throw InvalidArgument(str("cuda gemm: C must be f32 or A's type (", dtype_name(A.type),
                              "), got ", dtype_name(C.type)));
  const Alignments align{alignment(B.p, batch.stride_b, B.type),
                         alignment(A.p, batch.stride_a, A.type),
                         alignment(C.p, batch.stride_c, C.type)};
  const PlanKey key{trans_a,
                    trans_b,
                    M,
                    N,
                    K,
                    static_cast<int64_t>(A.type),
                    static_cast<int64_t>(C.type),
                    A.ld,
                    B.ld,
                    C.ld,
                    bias != nullptr,
                    batch.count,
                    batch.stride_a,
                    batch.stride_b,
                    batch.stride_c,
                    align.a,
                    align.b,
                    align.c};
  auto& plans = blas.plans().map;
  auto it = plans.find(key);
  if (it == plans.end()) {
    if (plans.size() >= kMaxPlans) plans.clear();
    it = plans
             .emplace(key, make_plan(blas, trans_a, trans_b, M, N, K, A, B, C, bias != nullptr,
                                     batch, align))
             .first;
  }
  const Plan& plan = *it->second;
  if (bias != nullptr) set_op(plan.d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  // K = 0 leaves C = beta * C (+ bias): cuBLASLt does that itself.
  check_cublas(cublasLtMatmul(blas.handle(), plan.d.op, &alpha, B.p, plan.d.a, A.p, plan.d.b, &beta,
                              C.p, plan.d.c, C.p, plan.d.c, &plan.algo, blas.workspace(),
                              Blas::kWorkspaceBytes, stream),
               "cublasLtMatmul");
}

}  // namespace

void gemm(Blas& blas, cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N,
          int64_t K, float alpha, ConstMatrix A, ConstMatrix B, float beta, Matrix C,
          const void* bias) {
  matmul(blas, stream, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, bias, GemmBatch{});
}

void gemm_batched(Blas& blas, cudaStream_t stream, bool trans_a, bool trans_b, int64_t M, int64_t N,
                  int64_t K, float alpha, ConstMatrix A, ConstMatrix B, float beta, Matrix C,
                  const GemmBatch& batch) {
  matmul(blas, stream, trans_a, trans_b, M, N, K, alpha, A, B, beta, C, nullptr, batch);
}

void linear_forward(Blas& blas, cudaStream_t stream, void* y, const void* x, const void* w,
                    const void* b, DType t, int64_t N, int64_t C, int64_t OC) {
  // y[N,OC] = x[N,C] @ w[OC,C]^T (+ b through the epilogue)
  gemm(blas, stream, false, true, N, OC, C, 1.0f, {x, t, C}, {w, t, C}, 0.0f, {y, t, OC}, b);
}

void linear_backward(Blas& blas, cudaStream_t stream, void* dx, float* dw, float* db,
                     const void* dy, const void* x, const void* w, DType t, int64_t N, int64_t C,
                     int64_t OC) {
  // dx[N,C] = dy[N,OC] @ w[OC,C]   (overwritten)
  if (dx != nullptr)
    gemm(blas, stream, false, false, N, C, OC, 1.0f, {dy, t, OC}, {w, t, C}, 0.0f, {dx, t, C});
  // dw[OC,C] += dy^T @ x            (accumulated, f32)
  if (dw != nullptr)
    gemm(blas, stream, true, false, OC, C, N, 1.0f, {dy, t, OC}, {x, t, C}, 1.0f,
         {dw, DType::kF32, C});
  // db[OC] += column sums of dy
  if (db != nullptr) bias_backward(db, dy, t, N, OC, stream);
}

}  // namespace tessel::ops::cuda
