// PushCodec: one unit shard of a parameter-server push (a unit's part of one server's range)
// as one message of fixed size (compress.kind fp16, bf16, int8 or topk; powersgd needs the
// workers' all-reduces and is refused with parameter servers). The worker holds one per unit
// shard, encodes the unscaled gradient during the backward and keeps its top-k residual; the
// server holds one per unit shard too and decodes each worker's message into that worker's
// f32 gradient buffer. The range is compressed whole (its biases too: it is a flat range).
// Internal to the parallel area.
#pragma once

#include <vector>

#include "codecs.h"

namespace tessel::parallel::compress {

class PushCodec {
 public:
  PushCodec(CompressKind kind, int64_t n, const CompressSpec& spec);

  size_t message_bytes() const { return msg_.size(); }
  // Worker: the message for gradient g (n values), valid until the next encode.
  const void* encode(const float* g, const CodecKey& key);
  // Server: msg decoded into out (n values).
  void decode(const void* msg, float* out) const;
  // The top-k residual (null otherwise).
  std::vector<float>* state() { return residual_.empty() ? nullptr : &residual_; }

 private:
  CompressKind kind_;
  int64_t n_, k_ = 0;
  std::vector<char> msg_;
  std::vector<float> residual_;
};

}  // namespace tessel::parallel::compress
