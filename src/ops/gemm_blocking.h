// Private to ops: what tessel's f32 and bf16 GEMM kernels (sgemm_avx512.cc, gemm_bf16.cc) share
// besides their micro-kernels: per-thread packing buffers, the split of M into tiles, and the
// test for computing the product transposed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>

namespace tessel::ops::detail {

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

}  // namespace tessel::ops::detail
