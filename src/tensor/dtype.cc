#include "tessel/tensor/dtype.h"

#include <cstring>
#include <iterator>

#include "tessel/core/error.h"

namespace tessel {

namespace {

// Indexed by DType.
constexpr size_t kSizes[] = {4, 2, 2, 4, 8, 1};
constexpr const char* kNames[] = {"f32", "f16", "bf16", "i32", "i64", "u8"};

}  // namespace

size_t dtype_size(DType t) { return kSizes[static_cast<size_t>(t)]; }

const char* dtype_name(DType t) { return kNames[static_cast<size_t>(t)]; }

DType dtype_from_name(const std::string& name) {
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (name == kNames[i]) return static_cast<DType>(i);
  throw InvalidArgument(
      str("dtype: unknown name, got '", name, "'; use one of f32, f16, bf16, i32, i64, u8"));
}

uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absu >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absu < 0x38800000u) {  // subnormal or zero in f16: round via float arithmetic
    float f;
    uint32_t a = absu;
    std::memcpy(&f, &a, 4);
    f += 0.5f;  // 0.5 has the exponent that leaves f16-subnormal bits in the low mantissa
    uint32_t r;
    std::memcpy(&r, &f, 4);
    return static_cast<uint16_t>(sign | (r - 0x3f000000u));
  }
  uint32_t mant_odd = (absu >> 13) & 1;
  absu += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (absu >> 13));
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | ((112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace tessel
