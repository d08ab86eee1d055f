#include "tessel/nn/model.h"

#include <algorithm>
#include <cstring>

#include "tessel/core/rng.h"
#include "tessel/core/sha256.h"

namespace tessel::nn {
namespace {

constexpr int64_t kAlignElems = 16;  // 64 bytes of f32

// Each element's value is a pure function of (seed, parameter index, element index), so the
// same model gets the same values whatever the layout, thread count or block slicing.
void init_elements(const Parameter& p, float* dst, int64_t first, int64_t count, uint64_t seed,
                   size_t index) {
  const CounterRng rng(seed, mix_stream(RngPurpose::kInit, index));
  switch (p.init) {
    case Init::kZeros:
      std::fill(dst, dst + count, 0.0f);
      break;
    case Init::kOnes:
      std::fill(dst, dst + count, 1.0f);
      break;
    case Init::kUniform:
      for (int64_t i = 0; i < count; ++i) dst[i] = (2.0f * rng.uniform(first + i) - 1.0f) * p.scale;
      break;
    case Init::kNormal:
      for (int64_t i = 0; i < count; ++i) dst[i] = rng.normal(first + i) * p.scale;
      break;
  }
}

// A copy of t in cache buffer `slot` (a tensor that outlives the storage t lives in).
Tensor copy_into(Cache& cache, size_t slot, const Tensor& t) {
  Tensor out = cache.buffer(slot, t.shape(), t.dtype());
  std::memcpy(out.raw(), t.raw(), t.nbytes());
  return out;
}

int64_t aligned(int64_t n) { return (n + kAlignElems - 1) / kAlignElems * kAlignElems; }

// Calls f(local, logical, count) for the runs of elements [first, first + count) of p's part
// (offsets within the part and within the logical tensor), padding skipped.
template <typename F>
void for_each_run(const Parameter& p, int64_t first, int64_t count, F&& f) {
  if (!p.is_split()) {
    if (count > 0) f(first, first, count);
    return;
  }
  const Split& s = p.split;
  const int64_t width = s.hi - s.lo;    // of dim, in this part
  const int64_t row = width * s.inner;  // elements of one outer index in this part
  for (int64_t e = first, end = first + count; e < end;) {
    const int64_t o = e / row, d = e % row / s.inner, i = e % s.inner;
    const int64_t n = std::min(end, (o + 1) * row) - e;  // to the end of this outer index
    const int64_t real = std::max<int64_t>(0, std::min(s.hi, s.dim) - (s.lo + d)) * s.inner - i;
    if (real > 0) f(e, (o * s.dim + s.lo + d) * s.inner + i, std::min(n, real));
    e += n;
  }
}

}  // namespace

void Parameter::cut(size_t dim_index, int64_t groups, int part, int parts) {
  TESSEL_CHECK(!is_split() && dim_index < shape.size() && groups > 0 && parts > 0 && part >= 0 &&
                   part < parts && shape[dim_index] % groups == 0,
               "parameter '", name, "': cannot cut dimension ", dim_index, " of ", shape_str(shape),
               " in ", groups, " groups x ", parts, " parts");
  split.full = shape;
  split.outer = groups;
  for (size_t d = 0; d < dim_index; ++d) split.outer *= shape[d];
  split.dim = shape[dim_index] / groups;
  split.inner = 1;
  for (size_t d = dim_index + 1; d < shape.size(); ++d) split.inner *= shape[d];
  const int64_t per = (split.dim + parts - 1) / parts;
  split.lo = part * per;
  split.hi = split.lo + per;
  shape[dim_index] = groups * per;
}

int64_t Activations::bytes() const {
  int64_t total = scratch.bytes() + (carry.defined() ? carry.storage().bytes() : 0);
  for (const Cache& c : caches) total += c.bytes();
  for (const auto& [kind, c] : work) total += c.bytes();
  return total;
}

void Activations::release_all() {
  for (Cache& c : caches) c.release_all();
  for (auto& [kind, c] : work) c.release_all();
  work_block = SIZE_MAX;
  scratch.release_all();
  carry = Tensor();
}

void Model::add(std::string name, std::unique_ptr<Module> block, std::vector<Parameter*> borrows) {
  TESSEL_CHECK(!finalized_, "model: add('", name, "') after finalize()");
  TESSEL_CHECK(block != nullptr, "model: add('", name, "') with a null block");
  for (const std::string& n : names_)
    TESSEL_CHECK(n != name, "model: two blocks named '", name, "'");
  block->set_input_grad(!blocks_.empty() || input_grad_);
  names_.push_back(std::move(name));
  blocks_.push_back(std::move(block));
  borrows_.push_back(std::move(borrows));
}

void Model::set_input_grad(bool needed) {
  input_grad_ = needed;
  if (!blocks_.empty()) blocks_[0]->set_input_grad(needed);
}

void Model::finalize() {
  TESSEL_CHECK(!finalized_, "model: finalize() twice");
  finalized_ = true;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const size_t first = parameters_.size();
    for (Parameter* p : blocks_[i]->parameters()) {
      p->name = names_[i] + "." + p->name;
      parameters_.push_back(p);
      offsets_.push_back(numel_);
      logical_offsets_.push_back(logical_numel_);
      if (__builtin_add_overflow(numel_, aligned(shape_numel(p->shape)), &numel_) ||
          __builtin_add_overflow(logical_numel_, aligned(shape_numel(p->full_shape())),
                                 &logical_numel_))
        throw InvalidArgument(str("model: the parameters up to '", p->name,
                                  "' have more elements than fit in 64 bits; use smaller sizes"));
    }
    block_params_.emplace_back(first, parameters_.size());
  }
  // Who reads whose parameters: every block its own, plus what it borrows.
  users_.assign(blocks_.size(), {});
  uses_.assign(blocks_.size(), {});
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::vector<size_t> owners = {i};
    for (Parameter* b : borrows_[i]) {
      auto it = std::find(parameters_.begin(), parameters_.end(), b);
      TESSEL_CHECK(it != parameters_.end(), "model: block '", names_[i],
                   "' borrows a parameter that no block owns");
      const size_t k = static_cast<size_t>(it - parameters_.begin());
      for (size_t o = 0; o < blocks_.size(); ++o)
        if (k >= block_params_[o].first && k < block_params_[o].second) owners.push_back(o);
    }
    std::sort(owners.begin(), owners.end());
    owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
    uses_[i] = owners;
    for (size_t o : owners) users_[o].push_back(i);
  }
}

Range Model::block_range(size_t i) const {
  auto [first, last] = block_params_[i];
  if (first == last) return {};
  return {offsets_[first], offsets_[last - 1] + shape_numel(parameters_[last - 1]->shape)};
}

Range Model::param_range(size_t k) const {
  return {offsets_[k], offsets_[k] + shape_numel(parameters_[k]->shape)};
}

std::vector<Run> Model::runs(Range r) const {
  std::vector<Run> out;
  for (size_t k = 0; k < parameters_.size(); ++k) {
    const Range p = param_range(k);
    const int64_t a = std::max(p.lo, r.lo), b = std::min(p.hi, r.hi);
    if (a < b)
      for_each_run(*parameters_[k], a - p.lo, b - a,
                   [&](int64_t local, int64_t logical, int64_t n) {
                     out.push_back({k, p.lo + local, logical, n});
                   });
  }
  return out;
}

int64_t Model::num_parameters() const {
  int64_t n = 0;
  for (const Parameter* p : parameters_) n += shape_numel(p->full_shape());
  return n;
}

void Model::init_values(float* dst, Range r, uint64_t seed) const {
  std::fill(dst, dst + r.size(), 0.0f);
  for (const Run& run : runs(r))
    init_elements(*parameters_[run.param], dst + (run.local - r.lo), run.logical, run.count, seed,
                  run.param);
}

void Model::bind(Range r, const Tensor& memory, bool values) {
  TESSEL_CHECK(finalized_, "model: bind before finalize()");
  TESSEL_CHECK(!memory.defined() || memory.numel() >= r.size(), "model: binding ", r.size(),
               " elements to a tensor of ", memory.numel());
  for (size_t k = 0; k < parameters_.size(); ++k) {
    Parameter& p = *parameters_[k];
    const int64_t lo = offsets_[k], hi = lo + shape_numel(p.shape);
    if (hi <= r.lo || lo >= r.hi) continue;
    TESSEL_CHECK(lo >= r.lo && hi <= r.hi, "model: parameter '", p.name, "' [", lo, ", ", hi,
                 ") straddles the bound range [", r.lo, ", ", r.hi, ")");
    Tensor view = memory.defined() ? memory.view(lo - r.lo, p.shape) : Tensor();
    (values ? p.value : p.grad) = view;
  }
}

void Model::bind_values(Range r, const Tensor& memory) { bind(r, memory, true); }
void Model::bind_grads(Range r, const Tensor& memory) { bind(r, memory, false); }

void Model::materialize(uint64_t seed) {
  TESSEL_CHECK(!values_.defined(), "model: materialize() twice");
  {
    MemoryScope scope(MemCategory::kParameters);
    values_ = Tensor::zeros({numel_});
  }
  {
    MemoryScope scope(MemCategory::kGradients);
    grads_ = Tensor::zeros({numel_});
  }
  init_values(values_.data<float>(), {0, numel_}, seed);
  bind_values({0, numel_}, values_);
  bind_grads({0, numel_}, grads_);
}

const Tensor& Model::values() const {
  TESSEL_CHECK(values_.defined(), "model: values() of a model that was not materialize()d");
  return values_;
}

const Tensor& Model::grads() const {
  TESSEL_CHECK(grads_.defined(), "model: grads() of a model that was not materialize()d");
  return grads_;
}

void Model::zero_grad() {
  TESSEL_CHECK(grads_.defined(), "model: zero_grad() of a model that was not materialize()d");
  grads_.zero_();
}

std::string Model::params_sha256() const { return sha256_hex(values().raw(), values().nbytes()); }

Tensor Model::forward(const Tensor& x, const Context& ctx, Activations* acts, const BlockHook& hook,
                      size_t begin, size_t end) {
  end = std::min(end, blocks_.size());
  TESSEL_CHECK(finalized_, "model: forward() before finalize()");
  TESSEL_CHECK(begin <= end, "model: forward over blocks [", begin, ", ", end, ")");
  if (acts && acts->caches.size() < end) acts->caches.resize(blocks_.size());
  Context c = ctx;
  c.selective = acts && acts->recompute == Recompute::kSelective;
  Tensor h = x;
  for (size_t i = begin; i < end; ++i) {
    if (hook) hook(Phase::kBeforeForward, i);
    if (acts && acts->recompute == Recompute::kFull)
      h = forward_keeping_input(i, h, c, *acts);
    else
      h = blocks_[i]->forward(h, c, acts ? &acts->caches[i] : nullptr);
    if (acts) acts->output = h;
    if (hook) hook(Phase::kAfterForward, i);
  }
  if (acts) acts->output = Tensor();
  return h;
}

Tensor Model::forward_keeping_input(size_t i, const Tensor& h, const Context& ctx,
                                    Activations& acts) {
  Cache& kept = acts.caches[i];
  kept.keep(0, copy_into(kept, 0, h));
  kept.ctx = ctx;
  Cache& work = acts.work[blocks_[i]->kind()];
  work.share_scratch(&acts.scratch);
  acts.work_block = i;
  return blocks_[i]->forward(kept.kept(0), ctx, &work);
}

Cache& Model::cache_for_backward(size_t i, Activations& acts) {
  if (acts.recompute != Recompute::kFull) return acts.caches[i];
  Cache& work = acts.work[blocks_[i]->kind()];
  if (acts.work_block != i) {  // the last block's forward is still there
    const Cache& kept = acts.caches[i];
    blocks_[i]->forward(kept.kept(0), kept.ctx, &work);
    acts.work_block = i;
  }
  return work;
}

Tensor Model::backward(const Tensor& dy, Activations& acts, const BlockHook& hook, size_t begin,
                       size_t end) {
  end = std::min(end, blocks_.size());
  TESSEL_CHECK(begin <= end && acts.caches.size() >= end, "model: backward over blocks [", begin,
               ", ", end, ") with ", acts.caches.size(), " caches; run forward() first");
  Tensor g = dy;
  for (size_t i = end; i-- > begin;) {
    if (hook) hook(Phase::kBeforeBackward, i);
    if (acts.recompute != Recompute::kNone) {  // g may sit in the scratch the block writes
      if (!acts.carry.defined() || acts.carry.dtype() != g.dtype() ||
          acts.carry.numel() < g.numel())
        acts.carry = Tensor::empty({g.numel()}, g.dtype());
      Tensor in = acts.carry.view(0, g.shape());
      std::memcpy(in.raw(), g.raw(), g.nbytes());
      g = in;
    }
    Module& block = *blocks_[i];
    g = block.backward(g, cache_for_backward(i, acts));
    // Zero-bubble B: the micro-batch keeps only what its W reads (full recompute refuses W).
    if (block.defer_weights() && acts.recompute != Recompute::kFull)
      block.release_for_weights(acts.caches[i]);
    if (hook) hook(Phase::kAfterBackward, i);
  }
  acts.work_block = SIZE_MAX;
  return g;
}

void Model::set_defer_weights(bool on) {
  for (auto& b : blocks_) b->set_defer_weights(on);
}

void Model::backward_weights(Activations& acts, const BlockHook& hook, size_t begin, size_t end) {
  end = std::min(end, blocks_.size());
  TESSEL_CHECK(begin <= end && acts.caches.size() >= end, "model: backward_weights over blocks [",
               begin, ", ", end, ") with ", acts.caches.size(), " caches; run backward() first");
  if (acts.recompute == Recompute::kFull)
    throw InvalidArgument(
        "model: deferred weight gradients need each block's own cache, which train.recompute = "
        "full does not keep; use train.recompute = selective or none");
  for (size_t i = end; i-- > begin;) {
    if (hook) hook(Phase::kBeforeBackward, i);
    blocks_[i]->backward_weights(acts.caches[i]);
    acts.caches[i].release_all();  // W's inputs and output gradients: the cache is done
    if (hook) hook(Phase::kAfterBackward, i);
  }
}

double Model::forward_flops(int64_t batch) const {
  double f = 0;
  for (const auto& b : blocks_) f += b->forward_flops(batch);
  return f;
}

}  // namespace tessel::nn
