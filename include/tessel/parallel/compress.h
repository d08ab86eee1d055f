// Gradient compression (compress.* keys, docs/compression.md): what a data-parallel gradient
// bucket or a parameter-server push travels as. none sends f32 (the default; deterministic mode
// and its bit-identity are untouched); fp16/bf16 round to 16 bits; int8 quantises chunks with a
// scale each and stochastic rounding; topk sends the largest |g| as (index, value) pairs with
// an error-feedback residual; powersgd sends a rank-r factorisation of each matrix (P, then Q).
// The spec only; the codecs live in src/parallel/compress/.
#pragma once

#include <cstdint>

#include "tessel/core/names.h"

namespace tessel::parallel {

enum class CompressKind : uint8_t { kNone, kFp16, kBf16, kInt8, kTopk, kPowerSgd };

struct CompressSpec {
  CompressKind kind = CompressKind::kNone;
  double ratio = 0.01;         // topk: the share of each bucket's elements sent, in (0, 0.5]
  int64_t rank = 4;            // powersgd: the rank of each matrix's approximation, >= 1
  int64_t start_step = 0;      // steps sent uncompressed (f32) before compression starts
  bool error_feedback = true;  // topk, powersgd: add what was not sent to the next step's gradient
};

// Elements per int8 chunk (each chunk carries one f32 scale).
constexpr int64_t kInt8Chunk = 256;

}  // namespace tessel::parallel

namespace tessel {
TESSEL_NAMES(parallel::CompressKind, "none", "fp16", "bf16", "int8", "topk", "powersgd");
}  // namespace tessel
