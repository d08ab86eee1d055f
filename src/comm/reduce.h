// Element-wise kernels the algorithms run on received data. Internal to the comm area.
#pragma once

#include <cstddef>

#include "tessel/comm/types.h"

namespace tessel::comm {

// acc[i] = acc[i] op in[i] for count elements (kAvg sums). bf16/f16 are combined in f32 and
// rounded to nearest even. u8 supports max/min only (throws InvalidArgument otherwise).
void reduce_into(void* acc, const void* in, size_t count, ElemType elem, ReduceOp op);

// buf[i] /= divisor (the second half of kAvg); integer types divide with truncation.
void divide_by(void* buf, size_t count, ElemType elem, int divisor);

// memcpy with non-temporal stores where the CPU has them: for messages much larger than the
// last-level cache, where the copy would only evict useful lines and pay a read for ownership
// of every destination line. Falls back to memcpy for small or misaligned tails.
void copy_streaming(void* dst, const void* src, size_t bytes);

// Throws InvalidArgument when `op` cannot reduce `elem` (arithmetic on u8).
void check_reducible(ElemType elem, ReduceOp op);

}  // namespace tessel::comm
