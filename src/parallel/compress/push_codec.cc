#include "push_codec.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"

namespace tessel::parallel::compress {

namespace {
DType half_type(CompressKind kind) {
  return kind == CompressKind::kFp16 ? DType::kF16 : DType::kBF16;
}
}  // namespace

PushCodec::PushCodec(CompressKind kind, int64_t n, const CompressSpec& spec) : kind_(kind), n_(n) {
  size_t bytes = 0;
  switch (kind) {
    case CompressKind::kFp16:
    case CompressKind::kBf16:
      bytes = 2 * static_cast<size_t>(n);
      break;
    case CompressKind::kInt8:
      bytes = static_cast<size_t>(int8_message_bytes(n));
      break;
    case CompressKind::kTopk:
      k_ = topk_count(n, spec.ratio);
      bytes = static_cast<size_t>(k_) * sizeof(Pair);
      if (spec.error_feedback) residual_.assign(static_cast<size_t>(n), 0.0f);
      break;
    default:
      throw InvalidArgument(str("config: compress.kind = ", name_of(kind),
                                " does not apply to parameter-server pushes (it needs all-reduces "
                                "among the workers); use fp16, bf16, int8 or topk"));
  }
  msg_.resize(bytes);
}

const void* PushCodec::encode(const float* g, const CodecKey& key) {
  if (kind_ == CompressKind::kInt8)
    int8_encode(g, n_, key, msg_.data());
  else if (kind_ == CompressKind::kTopk)
    topk_encode(g, n_, k_, residual_.empty() ? nullptr : residual_.data(),
                reinterpret_cast<Pair*>(msg_.data()));
  else
    ops::convert(msg_.data(), half_type(kind_), g, DType::kF32, n_);
  return msg_.data();
}

void PushCodec::decode(const void* msg, float* out) const {
  if (kind_ == CompressKind::kFp16 || kind_ == CompressKind::kBf16) {
    ops::convert(out, DType::kF32, msg, half_type(kind_), n_);
    return;
  }
  std::fill(out, out + n_, 0.0f);
  if (kind_ == CompressKind::kInt8)
    int8_add(static_cast<const char*>(msg), n_, out);
  else
    topk_add(static_cast<const Pair*>(msg), k_, out);
}

}  // namespace tessel::parallel::compress
