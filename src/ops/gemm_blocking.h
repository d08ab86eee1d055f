// Private to ops: what tessel's f32 and bf16 GEMM kernels (sgemm_*.cc, gemm_bf16.cc) share
// besides their micro-kernels: the order of the sum over K, per-thread packing buffers, the
// split of M into tiles, and the test for computing the product transposed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>

namespace tessel::ops::detail {
// Internal linkage on purpose: this header is compiled into translation units of different ISA
// levels, and an inline function or template instantiation with external linkage would be one
// symbol that the linker takes from any of them, wider instructions and all.
namespace {

// The order of every f32 GEMM's sum over K, the same at every ISA level (sgemm_portable.cc,
// sgemm_avx2.cc, sgemm_avx512.cc), so that C's bits depend on neither the CPU nor M or N:
// K is cut into sum_blocks(K) blocks of sum_block_k(K) values (the last may be shorter); in
// each block one f32 accumulator per element of C runs acc = fma(a(i,k), b(k,j), acc) over k in
// ascending order from 0; then C = alpha * acc + beta * C (as fma(beta, C, alpha * acc), C not
// read when beta = 0) for the first block and C = fma(1, C, alpha * acc) for each later one.
constexpr int64_t kSumKc = 320;
inline int64_t sum_block_k(int64_t K) {
  const int64_t blocks = (K + kSumKc - 1) / kSumKc;
  return (K + blocks - 1) / blocks;
}

// Grow-only 64-byte aligned buffer of T, one per thread and operand, reused across calls.
template <typename T>
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() noexcept { ::operator delete (p_, std::align_val_t{64}); }
  T* get(int64_t n) {
    if (n > cap_) {
      ::operator delete (p_, std::align_val_t{64});
      p_ = nullptr;  // stays valid if the allocation below throws
      cap_ = 0;
      p_ = static_cast<T*>(
          ::operator new (static_cast<size_t>(n) * sizeof(T), std::align_val_t{64}));
      cap_ = n;
    }
    return p_;
  }

 private:
  T* p_ = nullptr;
  int64_t cap_ = 0;
};

// M rows split into `count` tiles of at most Mr rows whose heights differ by at most one.
template <int Mr>
struct RowTiles {
  int64_t count, base, extra;
  explicit RowTiles(int64_t M) : count((M + Mr - 1) / Mr), base(M / count), extra(M % count) {}
  int rows(int64_t t) const { return static_cast<int>(base + (t < extra ? 1 : 0)); }
  int64_t start(int64_t t) const { return t * base + std::min(t, extra); }
};

// Whether C[M,N] is better computed as C^T = op(B)^T op(A)^T by tiles of Nr columns: the lanes
// computed, padding included, when N is the tiles' column side against when M is. The
// transposed product stores through a transpose, so it must save a quarter of the lanes.
template <int Nr>
bool transpose_product(int64_t M, int64_t N) {
  auto padded_work = [](int64_t rows, int64_t cols) { return rows * ((cols + Nr - 1) / Nr * Nr); };
  return 4 * padded_work(M, N) > 5 * padded_work(N, M);
}

}  // namespace
}  // namespace tessel::ops::detail
