#include "codecs.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "tessel/comm/algorithms.h"
#include "tessel/core/error.h"
#include "tessel/core/memory.h"
#include "tessel/core/rng.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/quantize.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel::compress {

void convert_here(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  const Device device = current_device();
  if (device == Device::kCpu)
    ops::convert(dst, dst_type, src, src_type, n);
  else
    device_runtime(device).convert(dst, dst_type, src, src_type, n, current_stream());
}

namespace {

int64_t total_numel(const std::vector<Segment>& segments) {
  int64_t n = 0;
  for (const Segment& s : segments) n += s.numel();
  return n;
}

// The segments of g back to back in flat, and back.
void pack(const std::vector<Segment>& segments, const float* g, float* flat) {
  for (const Segment& s : segments) flat = std::copy_n(g + s.offset, s.numel(), flat);
}
void unpack(const std::vector<Segment>& segments, const float* flat, float* g) {
  for (const Segment& s : segments) {
    std::copy_n(flat, s.numel(), g + s.offset);
    flat += s.numel();
  }
}

double allreduce_bytes(double bytes, int world) { return 2.0 * (world - 1) / world * bytes; }

// ---- DenseCodec ----

class DenseCodec final : public Codec {
 public:
  DenseCodec(std::vector<Segment> segments, DType type, BufferPool& pool,
             std::optional<Scatter> scatter)
      : segments_(std::move(segments)),
        type_(type),
        n_(total_numel(segments_)),
        pool_(pool),
        scatter_(std::move(scatter)) {
    whole_ = segments_.size() == 1 && segments_[0].offset == 0;
    TESSEL_CHECK(!scatter_ || whole_, "dense codec: a reduce-scatter sends one whole unit");
    if (scatter_)
      for (int r = 0; r < scatter_->rank; ++r)
        own_lo_ += static_cast<int64_t>(scatter_->blocks[static_cast<size_t>(r)]);
  }

  Exchange encode(float* g, const CodecKey&) override {
    void* msg = g;  // f32 over the whole unit: in place
    if (!whole_ || type_ != DType::kF32) {
      msg_ = pool_.take(type_);
      char* at = static_cast<char*>(msg_.raw());
      for (const Segment& s : segments_) {
        convert_here(at, type_, g + s.offset, DType::kF32, s.numel());
        at += static_cast<size_t>(s.numel()) * dtype_size(type_);
      }
      msg = msg_.raw();
    }
    const comm::ElemType elem = comm::elem_type(type_);
    Exchange ex{Exchange::Op::kAllreduce, msg, nullptr, static_cast<size_t>(n_), elem};
    if (scatter_) {  // this rank's block, in place
      ex.op = Exchange::Op::kReduceScatter;
      ex.out = at(msg, own_lo_);
      ex.blocks = &scatter_->blocks;
    }
    return ex;
  }
  std::optional<Exchange> next(float* g) override {
    if (!msg_.defined()) return std::nullopt;  // summed in place
    if (scatter_) {
      convert_here(g + own_lo_, DType::kF32, at(msg_.raw(), own_lo_), type_,
                   static_cast<int64_t>(scatter_->blocks[static_cast<size_t>(scatter_->rank)]));
    } else {
      int64_t i = 0;
      for (const Segment& s : segments_) {
        convert_here(g + s.offset, DType::kF32, at(msg_.raw(), i), type_, s.numel());
        i += s.numel();
      }
    }
    pool_.give(std::move(msg_));
    msg_ = Tensor();
    return std::nullopt;
  }

 private:
  void* at(void* msg, int64_t i) const {
    return static_cast<char*>(msg) + static_cast<size_t>(i) * dtype_size(type_);
  }

  std::vector<Segment> segments_;
  DType type_;
  int64_t n_;
  BufferPool& pool_;
  std::optional<Scatter> scatter_;
  bool whole_ = false;
  int64_t own_lo_ = 0;  // scatter: this rank's block's first element
  Tensor msg_;          // the message while it travels (none: in place)
};

// ---- Int8Codec ----

// A message: the f32 scales of every chunk, then the int8 values.
class Int8Codec final : public Codec {
 public:
  explicit Int8Codec(std::vector<Segment> segments)
      : segments_(std::move(segments)),
        n_(total_numel(segments_)),
        flat_(static_cast<size_t>(n_)),
        msg_(static_cast<size_t>(int8_message_bytes(n_))) {}

  Exchange encode(float* g, const CodecKey& key) override {
    world_ = key.world;
    pack(segments_, g, flat_.data());
    int8_encode(flat_.data(), n_, key, msg_.data());
    all_.resize(msg_.size() * static_cast<size_t>(world_));
    return {Exchange::Op::kAllgather, msg_.data(), all_.data(), msg_.size(), comm::ElemType::kU8};
  }
  std::optional<Exchange> next(float* g) override {
    std::fill(flat_.begin(), flat_.end(), 0.0f);
    for (int r = 0; r < world_; ++r)  // rank order: every rank adds in the same order
      int8_add(all_.data() + static_cast<size_t>(r) * msg_.size(), n_, flat_.data());
    unpack(segments_, flat_.data(), g);
    return std::nullopt;
  }

 private:
  std::vector<Segment> segments_;
  int64_t n_;
  int world_ = 1;
  std::vector<float> flat_;
  std::vector<char> msg_, all_;
};

// ---- TopkCodec ----

class TopkCodec final : public Codec {
 public:
  TopkCodec(std::vector<Segment> segments, double ratio, bool error_feedback)
      : segments_(std::move(segments)),
        n_(total_numel(segments_)),
        k_(topk_count(n_, ratio)),
        flat_(static_cast<size_t>(n_)),
        msg_(static_cast<size_t>(k_)) {
    if (error_feedback) residual_.assign(static_cast<size_t>(n_), 0.0f);
  }

  Exchange encode(float* g, const CodecKey& key) override {
    world_ = key.world;
    pack(segments_, g, flat_.data());
    topk_encode(flat_.data(), n_, k_, residual_.empty() ? nullptr : residual_.data(), msg_.data());
    all_.resize(msg_.size() * static_cast<size_t>(world_));
    return {Exchange::Op::kAllgather, msg_.data(), all_.data(), msg_.size() * sizeof(Pair),
            comm::ElemType::kU8};
  }
  std::optional<Exchange> next(float* g) override {
    std::fill(flat_.begin(), flat_.end(), 0.0f);
    topk_add(all_.data(), static_cast<int64_t>(all_.size()), flat_.data());  // in rank order
    unpack(segments_, flat_.data(), g);
    return std::nullopt;
  }
  std::vector<float>* state() override { return residual_.empty() ? nullptr : &residual_; }

 private:
  std::vector<Segment> segments_;
  int64_t n_, k_;
  int world_ = 1;
  std::vector<float> flat_, residual_;
  std::vector<Pair> msg_, all_;
};

// ---- PowerSgdCodec ----

// State: every matrix's Q (cols x rank), then (error feedback) its residual (rows x cols).
class PowerSgdCodec final : public Codec {
 public:
  // Q starts as the same seeded normal values on every rank (a pure function of seed and unit).
  PowerSgdCodec(std::vector<Segment> segments, int64_t rank, bool error_feedback, uint64_t seed,
                int unit)
      : segments_(std::move(segments)), r_(rank), ef_(error_feedback) {
    int64_t q = 0, p = 0, e = 0;
    for (const Segment& s : segments_) {
      q_at_.push_back(q), p_at_.push_back(p), e_at_.push_back(e);
      q += s.cols * r_, p += s.rows * r_, e += ef_ ? s.numel() : 0;
    }
    q_numel_ = q;
    state_.assign(static_cast<size_t>(q + e), 0.0f);
    p_.resize(static_cast<size_t>(p));
    qmsg_.resize(static_cast<size_t>(q));
    m_.resize(static_cast<size_t>(total_numel(segments_)));
    const CounterRng rng(
        seed, mix_stream(RngPurpose::kCompress, ~uint64_t{0}, static_cast<uint64_t>(unit)));
    for (int64_t i = 0; i < q_numel_; ++i)
      state_[static_cast<size_t>(i)] = rng.normal(static_cast<uint64_t>(i));
  }

  Exchange encode(float* g, const CodecKey& key) override;
  std::optional<Exchange> next(float* g) override;
  int phases() const override { return 2; }
  std::vector<float>* state() override { return &state_; }

 private:
  float* q(size_t i) { return state_.data() + q_at_[i]; }
  float* residual(size_t i) { return state_.data() + q_numel_ + e_at_[i]; }

  std::vector<Segment> segments_;
  int64_t r_;
  bool ef_;
  std::vector<int64_t> q_at_, p_at_, e_at_;
  int64_t q_numel_ = 0;
  int phase_ = 0;
  std::vector<float> state_, p_, qmsg_, m_;  // m_: each matrix plus its residual
};

Exchange PowerSgdCodec::encode(float* g, const CodecKey&) {
  float* m = m_.data();
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    std::copy_n(g + s.offset, s.numel(), m);
    if (ef_)
      for (int64_t j = 0; j < s.numel(); ++j) m[j] += residual(i)[j];
    // P = M Q
    ops::gemm(false, false, s.rows, r_, s.cols, 1.0f, m, s.cols, q(i), r_, 0.0f,
              p_.data() + p_at_[i], r_);
    m += s.numel();
  }
  phase_ = 0;
  return {Exchange::Op::kAllreduce, p_.data(), nullptr, p_.size(), comm::ElemType::kF32};
}

std::optional<Exchange> PowerSgdCodec::next(float* g) {
  if (phase_++ == 0) {  // P summed: orthonormalise it, Q = M^T P, residual M - P Q^T
    float* m = m_.data();
    for (size_t i = 0; i < segments_.size(); ++i) {
      const Segment& s = segments_[i];
      float* p = p_.data() + p_at_[i];
      float* qm = qmsg_.data() + q_at_[i];
      orthonormalize_columns(p, s.rows, r_);
      ops::gemm(true, false, s.cols, r_, s.rows, 1.0f, m, s.cols, p, r_, 0.0f, qm, r_);
      if (ef_) {
        std::copy_n(m, s.numel(), residual(i));
        ops::gemm(false, true, s.rows, s.cols, r_, -1.0f, p, r_, qm, r_, 1.0f, residual(i), s.cols);
      }
      m += s.numel();
    }
    return Exchange{Exchange::Op::kAllreduce, qmsg_.data(), nullptr, qmsg_.size(),
                    comm::ElemType::kF32};
  }
  // Q summed: the gradient sum is P Q^T; Q warm-starts the next step.
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    const float* qm = qmsg_.data() + q_at_[i];
    ops::gemm(false, true, s.rows, s.cols, r_, 1.0f, p_.data() + p_at_[i], r_, qm, r_, 0.0f,
              g + s.offset, s.cols);
    std::copy_n(qm, s.cols * r_, q(i));
  }
  return std::nullopt;
}

}  // namespace

int64_t topk_count(int64_t n, double ratio) {
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(ratio * static_cast<double>(n))), 1, n);
}

int64_t int8_message_bytes(int64_t n) { return n + 4 * ((n + kInt8Chunk - 1) / kInt8Chunk); }

void int8_encode(const float* x, int64_t n, const CodecKey& key, char* msg) {
  const int64_t chunks = (n + kInt8Chunk - 1) / kInt8Chunk;
  const uint64_t stream =
      mix_stream(RngPurpose::kCompress, static_cast<uint64_t>(key.step),
                 (static_cast<uint64_t>(key.unit) << 20) | static_cast<uint64_t>(key.rank));
  ops::int8_quantize(reinterpret_cast<int8_t*>(msg + 4 * chunks), reinterpret_cast<float*>(msg), x,
                     n, kInt8Chunk, key.seed, stream);
}

void int8_add(const char* msg, int64_t n, float* acc) {
  const int64_t chunks = (n + kInt8Chunk - 1) / kInt8Chunk;
  ops::int8_dequantize_add(acc, reinterpret_cast<const int8_t*>(msg + 4 * chunks),
                           reinterpret_cast<const float*>(msg), n, kInt8Chunk);
}

void topk_encode(const float* x, int64_t n, int64_t k, float* residual, Pair* msg) {
  std::vector<float> e(x, x + n);
  if (residual)
    for (int64_t i = 0; i < n; ++i) e[static_cast<size_t>(i)] += residual[i];
  const std::vector<uint32_t> idx = top_k(e.data(), n, k);
  for (size_t j = 0; j < idx.size(); ++j) msg[j] = {idx[j], e[idx[j]]};
  if (residual) {  // what was not sent waits for the next step
    for (uint32_t i : idx) e[i] = 0.0f;
    std::copy(e.begin(), e.end(), residual);
  }
}

void topk_add(const Pair* pairs, int64_t count, float* acc) {
  for (int64_t j = 0; j < count; ++j) acc[pairs[j].index] += pairs[j].value;
}

double Exchange::bytes(int world, comm::Algorithm algo) const {
  const size_t n = count * comm::elem_size(elem);
  const double b = static_cast<double>(n);
  if (op == Op::kAllgather) return static_cast<double>(world - 1) * b;
  if (op == Op::kReduceScatter) return (world - 1.0) / world * b;
  if (algo == comm::Algorithm::kHalvingDoubling && n <= comm::kWholeDoublingMaxBytes && world > 1)
    return std::log2(static_cast<double>(world)) * b;
  return allreduce_bytes(b, world);
}

comm::OpKind Exchange::kind() const {
  if (op == Op::kAllgather) return comm::OpKind::kAllgather;
  return op == Op::kReduceScatter ? comm::OpKind::kReduceScatter : comm::OpKind::kAllreduce;
}

comm::Work Exchange::start(comm::Communicator& dp, bool async,
                           const comm::CallOptions& call) const {
  const comm::ReduceOp sum = comm::ReduceOp::kSum;
  switch (op) {
    case Op::kAllreduce:
      if (async) return dp.allreduce_async(in, count, elem, sum, call);
      dp.allreduce(in, count, elem, sum, call);
      break;
    case Op::kAllgather: {
      if (async)
        return dp.allgather_async(
            in, out, std::vector<size_t>(static_cast<size_t>(dp.size()), count), elem, call);
      dp.allgather(in, out, count, elem, call);
      break;
    }
    case Op::kReduceScatter:
      if (async) return dp.reduce_scatter_async(in, out, *blocks, elem, sum, call);
      dp.reduce_scatter(in, out, *blocks, elem, sum, call);
      break;
  }
  return comm::Work();
}

Tensor BufferPool::take(DType type) {
  for (size_t i = free_.size(); i-- > 0;)
    if (free_[i].dtype() == type) {
      Tensor t = std::move(free_[i]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return t;
    }
  return flat_zeros(numel_, MemCategory::kComm, type);
}

std::vector<uint32_t> top_k(const float* x, int64_t n, int64_t k) {
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<uint32_t> idx;
  if (k == 0) return idx;
  // The k-th largest magnitude (a selection over plain floats), then one pass in index order:
  // everything above it, and as many equal to it as fit (lower indices first).
  std::vector<float> mag(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mag[static_cast<size_t>(i)] = std::fabs(x[i]);
  std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
  const float kth = mag[static_cast<size_t>(k - 1)];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += std::fabs(x[i]) > kth;
  int64_t ties = k - above;
  idx.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < n; ++i) {
    const float m = std::fabs(x[i]);
    if (m > kth || (m == kth && ties-- > 0)) idx.push_back(static_cast<uint32_t>(i));
  }
  return idx;
}

void orthonormalize_columns(float* a, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j) {
    double before = 0;
    for (int64_t r = 0; r < rows; ++r)
      before += static_cast<double>(a[r * cols + j]) * a[r * cols + j];
    for (int64_t i = 0; i < j; ++i) {  // remove the earlier columns' components
      double dot = 0;
      for (int64_t r = 0; r < rows; ++r)
        dot += static_cast<double>(a[r * cols + i]) * a[r * cols + j];
      for (int64_t r = 0; r < rows; ++r)
        a[r * cols + j] -= static_cast<float>(dot) * a[r * cols + i];
    }
    double sq = 0;
    for (int64_t r = 0; r < rows; ++r) sq += static_cast<double>(a[r * cols + j]) * a[r * cols + j];
    // Nothing left but rounding noise (the column lay in the earlier ones' span): zero.
    const float inv =
        sq > 1e-8 * before && sq > 1e-30 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
    for (int64_t r = 0; r < rows; ++r) a[r * cols + j] *= inv;
  }
}

bool worth_compressing(CompressKind kind, const Segment& s, const CompressSpec& spec, int world,
                       bool scatter) {
  if (s.rows < 2 || s.cols < 2) return false;
  const double n = static_cast<double>(s.numel());
  const double f32 = scatter ? (world - 1.0) / world * 4 * n : allreduce_bytes(4 * n, world);
  switch (kind) {
    case CompressKind::kFp16:
    case CompressKind::kBf16:
      return true;
    case CompressKind::kInt8:
      return (world - 1) * static_cast<double>(int8_message_bytes(s.numel())) < f32;
    case CompressKind::kTopk:
      return (world - 1) * 8.0 * static_cast<double>(topk_count(s.numel(), spec.ratio)) < f32;
    case CompressKind::kPowerSgd:
      return allreduce_bytes(4.0 * static_cast<double>(spec.rank * (s.rows + s.cols)), world) < f32;
    case CompressKind::kNone:
      return false;
  }
  return false;
}

std::unique_ptr<Codec> dense_codec(std::vector<Segment> segments, DType type, BufferPool& pool,
                                   std::optional<Scatter> scatter) {
  return std::make_unique<DenseCodec>(std::move(segments), type, pool, std::move(scatter));
}

std::unique_ptr<Codec> make_codec(CompressKind kind, std::vector<Segment> segments,
                                  const CompressSpec& spec, uint64_t seed, int unit,
                                  BufferPool& pool) {
  switch (kind) {
    case CompressKind::kFp16:
      return dense_codec(std::move(segments), DType::kF16, pool);
    case CompressKind::kBf16:
      return dense_codec(std::move(segments), DType::kBF16, pool);
    case CompressKind::kInt8:
      return std::make_unique<Int8Codec>(std::move(segments));
    case CompressKind::kTopk:
      return std::make_unique<TopkCodec>(std::move(segments), spec.ratio, spec.error_feedback);
    case CompressKind::kPowerSgd:
      return std::make_unique<PowerSgdCodec>(std::move(segments), spec.rank, spec.error_feedback,
                                             seed, unit);
    case CompressKind::kNone:
      break;
  }
  return dense_codec(std::move(segments), DType::kF32, pool);
}

}  // namespace tessel::parallel::compress
