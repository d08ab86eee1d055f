#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/suggest.h"
#include "tessel/parallel/compress.h"

namespace tessel::parallel {

void validate_compress(const CompressSpec& spec) {
  if (!(spec.ratio > 0 && spec.ratio <= 0.5))
    throw InvalidArgument(
        str("config: compress.ratio (topk: the share of elements sent) must be "
            "in (0, 0.5], got ",
            spec.ratio, "; try 0.01"));
  if (spec.rank < 1)
    throw InvalidArgument(
        str("config: compress.rank (powersgd) must be >= 1, got ", spec.rank, "; try 4"));
  if (spec.start_step < 0)
    throw InvalidArgument(
        str("config: compress.start_step must be >= 0 (0: compress from the "
            "first step), got ",
            spec.start_step));
}

}  // namespace tessel::parallel
