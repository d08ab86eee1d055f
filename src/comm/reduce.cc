#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__F16C__) || defined(__AVX__)
#include <immintrin.h>
#endif

#include "tessel/core/error.h"
#include "tessel/tensor/dtype.h"

namespace tessel::comm {
namespace {

// Plain loops over __restrict pointers: GCC vectorises them at -O3, which is what keeps a
// reduction at memory speed (the bandwidth targets in docs/comm.md depend on it).
template <typename T, typename F>
void combine(T* __restrict acc, const T* __restrict in, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], in[i]);
}

template <typename T>
void reduce_typed(void* acc, const void* in, size_t n, ReduceOp op) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      combine(a, b, n, [](T x, T y) { return static_cast<T>(x + y); });
      break;
    case ReduceOp::kMax:
      combine(a, b, n, [](T x, T y) { return x < y ? y : x; });
      break;
    case ReduceOp::kMin:
      combine(a, b, n, [](T x, T y) { return y < x ? y : x; });
      break;
  }
}

inline float bf16_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// 16-bit floats: widen a block to f32, combine, narrow back. The block keeps the f32 copies in
// L1 and lets the conversions vectorise.
constexpr size_t kBlock = 512;

void to_f32(const uint16_t* in, float* out, size_t n, bool bf16) {
  if (bf16) {
    for (size_t i = 0; i < n; ++i) out[i] = bf16_f32(in[i]);
    return;
  }
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
  for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
}

void from_f32(const float* in, uint16_t* out, size_t n, bool bf16) {
  if (bf16) {
    for (size_t i = 0; i < n; ++i) out[i] = f32_bf16(in[i]);
    return;
  }
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) out[i] = f32_to_f16(in[i]);
}

void reduce_half(void* acc, const void* in, size_t n, ReduceOp op, bool bf16) {
  uint16_t* a = static_cast<uint16_t*>(acc);
  const uint16_t* b = static_cast<const uint16_t*>(in);
  alignas(64) float fa[kBlock];
  alignas(64) float fb[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t m = std::min(kBlock, n - off);
    to_f32(a + off, fa, m, bf16);
    to_f32(b + off, fb, m, bf16);
    reduce_typed<float>(fa, fb, m, op);
    from_f32(fa, a + off, m, bf16);
  }
}

template <typename T>
void divide_typed(void* buf, size_t n, int d) {
  T* p = static_cast<T*>(buf);
  if constexpr (std::is_floating_point_v<T>) {
    // A true division, not a multiply by 1/d: it matches a plain local average bit for bit.
    for (size_t i = 0; i < n; ++i) p[i] = p[i] / static_cast<T>(d);
  } else {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(d));
  }
}

void divide_half(void* buf, size_t n, int d, bool bf16) {
  uint16_t* p = static_cast<uint16_t*>(buf);
  alignas(64) float f[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    size_t m = std::min(kBlock, n - off);
    to_f32(p + off, f, m, bf16);
    for (size_t i = 0; i < m; ++i) f[i] /= static_cast<float>(d);
    from_f32(f, p + off, m, bf16);
  }
}

}  // namespace

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__AVX__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  size_t head = (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32;
  if (bytes < head + 256) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t body = bytes / 128 * 128;
  for (size_t i = 0; i < body; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  _mm_sfence();  // order the streaming stores before the completion flag is set
  std::memcpy(d + body, s + body, bytes - body);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void check_reducible(ElemType elem, ReduceOp op) {
  if (elem == ElemType::kU8 && (op == ReduceOp::kSum || op == ReduceOp::kAvg))
    throw InvalidArgument(str("comm: reduce op ", reduce_op_name(op),
                              " on u8 elements is not supported; use max or min, or a wider "
                              "dtype for arithmetic"));
}

void reduce_into(void* acc, const void* in, size_t count, ElemType elem, ReduceOp op) {
  if (count == 0) return;
  switch (elem) {
    case ElemType::kF32:
      return reduce_typed<float>(acc, in, count, op);
    case ElemType::kF64:
      return reduce_typed<double>(acc, in, count, op);
    case ElemType::kI32:
      return reduce_typed<int32_t>(acc, in, count, op);
    case ElemType::kI64:
      return reduce_typed<int64_t>(acc, in, count, op);
    case ElemType::kF16:
      return reduce_half(acc, in, count, op, false);
    case ElemType::kBF16:
      return reduce_half(acc, in, count, op, true);
    case ElemType::kU8:
      check_reducible(elem, op);
      return reduce_typed<uint8_t>(acc, in, count, op);
  }
}

void divide_by(void* buf, size_t count, ElemType elem, int divisor) {
  if (count == 0 || divisor == 1) return;
  switch (elem) {
    case ElemType::kF32:
      return divide_typed<float>(buf, count, divisor);
    case ElemType::kF64:
      return divide_typed<double>(buf, count, divisor);
    case ElemType::kI32:
      return divide_typed<int32_t>(buf, count, divisor);
    case ElemType::kI64:
      return divide_typed<int64_t>(buf, count, divisor);
    case ElemType::kF16:
      return divide_half(buf, count, divisor, false);
    case ElemType::kBF16:
      return divide_half(buf, count, divisor, true);
    case ElemType::kU8:
      check_reducible(elem, ReduceOp::kAvg);
  }
}

}  // namespace tessel::comm
