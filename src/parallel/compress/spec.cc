#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/suggest.h"
#include "tessel/parallel/compress.h"

namespace tessel::parallel {

namespace {
constexpr CompressKind kKinds[] = {CompressKind::kNone, CompressKind::kFp16,
                                   CompressKind::kBf16, CompressKind::kInt8,
                                   CompressKind::kTopk, CompressKind::kPowerSgd};
}  // namespace

const char* compress_kind_name(CompressKind kind) {
  switch (kind) {
    case CompressKind::kNone:
      return "none";
    case CompressKind::kFp16:
      return "fp16";
    case CompressKind::kBf16:
      return "bf16";
    case CompressKind::kInt8:
      return "int8";
    case CompressKind::kTopk:
      return "topk";
    case CompressKind::kPowerSgd:
      return "powersgd";
  }
  return "?";
}

CompressKind compress_kind(const std::string& name) {
  std::vector<std::string> names;
  for (CompressKind k : kKinds) {
    if (name == compress_kind_name(k)) return k;
    names.push_back(compress_kind_name(k));
  }
  const std::string guess = nearest(name, names);
  throw InvalidArgument(
      str("config: compress.kind must be none, fp16, bf16, int8, topk or "
          "powersgd, got '",
          excerpt(name), "'", guess.empty() ? "" : str("; did you mean '", guess, "'?")));
}

void validate_compress(const CompressSpec& spec) {
  compress_kind(spec.kind);
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
