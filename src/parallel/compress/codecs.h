// Codecs: how one gradient unit's segments (parameter tensors) travel between the ranks of a
// data-parallel group, as a short sequence of collectives ("exchanges"), launched by Buckets
// (buckets.h). A codec owns its state (error-feedback residual, PowerSGD's Q), one per unit and
// rank; every rank decodes the same bytes in the same order, so the replicas stay identical.
//   DenseCodec    f32, f16 or bf16 messages, all-reduced, or reduce-scattered so that this rank
//                 gets the sum of its shard (ZeRO); f32 over a whole unit travels in place, the
//                 others in a message buffer from a pool (train.precision 16-bit, compress.kind
//                 fp16/bf16, and every tensor that compression would not make smaller).
//   Int8Codec     per chunk of kInt8Chunk elements one f32 scale (max |g| / 127) and int8
//                 values stochastically rounded (counter RNG keyed by step, unit and rank);
//                 rescaled sums do not fit int8, so every rank's message is all-gathered and
//                 decoded in rank order.
//   TopkCodec     the k = ceil(ratio * n) largest |g + residual| as (uint32 index, f32 value)
//                 pairs, all-gathered (a ring sum does not apply to sparse pairs); the rest
//                 stays in the residual (error feedback) or is dropped.
//   PowerSgdCodec per matrix M (rows x cols) plus residual: P = M Q all-reduced and
//                 orthonormalised, Q = M^T P all-reduced, M ~ P Q^T; Q warm-starts the next
//                 step, M - P Q^T (this rank's) is the residual.
// Bytes this rank sends (ring, or halving-doubling on a power-of-two group of W ranks):
// all-reduce of B bytes 2 (W - 1) / W * B (halving-doubling up to 32 KiB: log2 W * B, whole
// buffers), reduce-scatter (W - 1) / W * B, all-gather of B bytes per rank (W - 1) * B.
// Internal to the parallel area.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/compress.h"
#include "tessel/tensor/tensor.h"

namespace tessel::parallel::compress {

// Elements [offset, offset + rows * cols) of a bucket, one parameter tensor seen as a
// rows x cols row-major matrix (1-D: rows = 1).
struct Segment {
  int64_t offset = 0, rows = 1, cols = 0;
  int64_t numel() const { return rows * cols; }
};

// One collective a codec asks for: all-reduce (sum) `count` elements of `in` in place,
// all-gather `count` elements of `in` from every rank into `out` (rank order), or
// reduce-scatter the `count` elements of `in` in blocks of `blocks` (this rank's sum into
// `out`, which may be its own block of `in`).
struct Exchange {
  enum class Op : uint8_t { kAllreduce, kAllgather, kReduceScatter };
  Op op = Op::kAllreduce;
  void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;
  comm::ElemType elem = comm::ElemType::kF32;
  const std::vector<size_t>* blocks = nullptr;  // kReduceScatter: every rank's block
  // What this rank sends for it on `world` ranks with algorithm `algo` (ring: the formula
  // above; halving-doubling below comm::kWholeDoublingMaxBytes swaps the whole buffer log2 W
  // times). Exact for a power-of-two world.
  double bytes(int world, comm::Algorithm algo = comm::Algorithm::kRing) const;
  comm::OpKind kind() const;
  // Runs it on dp: async, returns its Work; blocking, returns once it is done.
  comm::Work start(comm::Communicator& dp, bool async, const comm::CallOptions& call) const;
};

// Buffers of one size (the largest unit's elements), reused across units and steps and charged
// to communication buffers: 16-bit messages, ZeRO-2/3 bucket buffers.
// n values from src_type to dst_type on this thread's device (the host outside a DeviceScope),
// where a device rank's gradients, messages and gathered parameters live.
void convert_here(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

class BufferPool {
 public:
  explicit BufferPool(int64_t numel) : numel_(numel) {}
  // A buffer of `type` (a reused one keeps its old values).
  Tensor take(DType type);
  void give(Tensor t) { free_.push_back(std::move(t)); }

 private:
  int64_t numel_;
  std::vector<Tensor> free_;
};

// Which bucket of which rank encodes at which step: the stochastic rounding's key.
struct CodecKey {
  uint64_t seed = 0;
  int64_t step = 0;
  int unit = 0, rank = 0, world = 1;
};

class Codec {
 public:
  virtual ~Codec() = default;
  // Encodes the unit's gradient g (segments index it) and returns the first exchange (which
  // may run on g itself).
  virtual Exchange encode(float* g, const CodecKey& key) = 0;
  // After the last exchange completed: the next one, or (none) the decoded sum written into g.
  virtual std::optional<Exchange> next(float* g) = 0;
  // Exchanges per encode.
  virtual int phases() const { return 1; }
  // State that must survive a checkpoint (residual, Q); null when there is none.
  virtual std::vector<float>* state() { return nullptr; }
};

// A reduce-scatter's blocks (every rank's shard of the unit) and this rank's.
struct Scatter {
  std::vector<size_t> blocks;
  int rank = 0;
};
// Sends segments as `type` messages (f32, f16 or bf16) taken from pool, all-reduced; with
// scatter (segments: one run from 0) reduce-scattered, only this rank's shard decoded.
std::unique_ptr<Codec> dense_codec(std::vector<Segment> segments, DType type, BufferPool& pool,
                                   std::optional<Scatter> scatter = std::nullopt);
// The codec of `kind` for the segments worth compressing (see worth_compressing); error
// feedback and ratio/rank from spec; seed and unit seed PowerSGD's first Q; fp16/bf16 take
// their messages from pool.
std::unique_ptr<Codec> make_codec(CompressKind kind, std::vector<Segment> segments,
                                  const CompressSpec& spec, uint64_t seed, int unit,
                                  BufferPool& pool);
// Whether kind sends segment s in fewer bytes than its f32 exchange on `world` ranks would: an
// all-reduce, or with scatter (ZeRO) a reduce-scatter (1-D tensors never: biases and norms stay
// f32).
bool worth_compressing(CompressKind kind, const Segment& s, const CompressSpec& spec, int world,
                       bool scatter = false);

// ---- single messages (shared with parameter-server pushes, push_codec.h) ----
int64_t topk_count(int64_t n, double ratio);  // ceil(ratio * n), at least 1
int64_t int8_message_bytes(int64_t n);        // the chunks' f32 scales, then n int8 values
// x (n values) quantised into msg (int8_message_bytes(n) bytes), and msg added into acc
// (ops::int8_quantize, tessel/ops/quantize.h, in chunks of kInt8Chunk).
void int8_encode(const float* x, int64_t n, const CodecKey& key, char* msg);
void int8_add(const char* msg, int64_t n, float* acc);
struct Pair {
  uint32_t index;
  float value;
};
static_assert(sizeof(Pair) == 8);
// The k largest |x + residual| as pairs into msg; residual (null: no error feedback) keeps
// the rest. topk_add adds `count` pairs into acc.
void topk_encode(const float* x, int64_t n, int64_t k, float* residual, Pair* msg);
void topk_add(const Pair* pairs, int64_t count, float* acc);

// ---- the math, exposed for tests ----
// Indices of the k largest |x| (ties: lower index first), ascending.
std::vector<uint32_t> top_k(const float* x, int64_t n, int64_t k);
// Orthonormalises the columns of the rows x cols row-major matrix a (Gram-Schmidt); a column
// that is (numerically) zero or in the span of the earlier ones becomes zero.
void orthonormalize_columns(float* a, int64_t rows, int64_t cols);

}  // namespace tessel::parallel::compress
