// PushCodec: a parameter-server push of one shard's gradient as one message of fixed size
// (compress.kind fp16, bf16, int8 or topk; powersgd needs the workers' all-reduces and is
// refused with parameter servers). The worker encodes, keeping its top-k residual per shard;
// the server decodes each worker's message into that worker's f32 gradient buffer. The shard
// is compressed whole (its biases too: a shard is a flat range of the arena).
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
