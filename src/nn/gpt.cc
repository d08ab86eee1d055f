// GPT blocks: token + position embedding, the pre-LN transformer block and the tied LM head.
#include <cmath>
#include <cstring>

#include "checks.h"
#include "tessel/nn/layers.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::nn {
namespace {

constexpr float kGptInitStd = 0.02f;

void check_tokens(const Tensor& x, int64_t context) {
  if (!x.defined() || x.dtype() != DType::kI32 || x.ndim() != 2 || x.dim(1) < 1 ||
      x.dim(1) > context)
    throw InvalidArgument(
        str("embedding: input must be i32 token ids [B, T] with 1 <= T <= ", context, ", got ",
            x.defined() ? dtype_name(x.dtype()) : "undefined", " ",
            x.defined() ? shape_str(x.shape()) : "", "; a gpt model needs a token dataset"));
}

// x: [B, T, C] activations of the blocks' type t (train.precision).
void check_activations(const Tensor& x, int64_t C, DType t, const char* layer) {
  if (!x.defined() || x.dtype() != t || x.ndim() != 3 || x.dim(2) != C)
    throw InvalidArgument(str(layer, ": input must be ", dtype_name(t), " [B, T, ", C, "], got ",
                              described(x), "; place it after the embedding block"));
}

void prefix_names(const std::vector<Parameter*>& params, const std::string& prefix) {
  for (Parameter* p : params) p->name = prefix + p->name;
}

void set_normal(Parameter& p, float std) {
  p.init = Init::kNormal;
  p.scale = std;
}

void set_zeros(Parameter* p) {
  if (p != nullptr) p->init = Init::kZeros;
}

// The first position of this rank's output: its part of the sequence under sequence
// parallelism.
int64_t first_position(const TensorParallel* tp, int64_t local_T) {
  return sequence_split(tp) ? tp->rank() * local_T : 0;
}

// Adds (forward) or accumulates the gradient of (backward) the position table over x's rows
// [B, Tl, C] of type t, which are positions [t0, t0 + Tl). table: the values (type t), or the
// f32 gradient. One call for the B sequences (one launch on a device).
void positions(void* x, void* table, DType t, int64_t B, int64_t Tl, int64_t C, int64_t t0,
               bool grad) {
  const int64_t n = Tl * C, e = static_cast<int64_t>(dtype_size(t));
  if (grad)
    ops::accumulate(static_cast<float*>(table) + t0 * C, x, n, t, B);
  else
    ops::add_forward(x, x, static_cast<char*>(table) + t0 * C * e, n, t, B);
}

// The positions of the rows of kv's step: each run continues its sequence.
std::vector<int64_t> cached_positions(const KvCache& kv) {
  std::vector<int64_t> pos;
  for (const KvCache::Run& run : kv.step())
    for (int64_t i = 0; i < run.rows; ++i) pos.push_back(kv.length(run.seq) + i);
  return pos;
}

// Rotary positions where the kernel reads them: pos itself on the host; on a device, uploaded
// into `held`, which the caller keeps until the kernel is queued (the pool reuses a freed block
// in stream order).
const int64_t* rotary_positions(const std::vector<int64_t>& pos, Tensor& held) {
  if (!ops::on_device()) return pos.data();
  Tensor p = Tensor::empty({static_cast<int64_t>(pos.size())}, DType::kI64);
  std::memcpy(p.raw(), pos.data(), pos.size() * sizeof(int64_t));
  held = p.to_device(current_device());
  return held.device_data<int64_t>();
}

// Attention's cache where this thread works: the CPU's probabilities att[B,NH,T,T], or a
// device's lse[B,NH,T] (its flash kernels keep no T x T matrix and recompute the
// probabilities from qkv, the output and lse).
Shape attention_cache_shape(int64_t B, int64_t NH, int64_t T) {
  if (ops::on_device()) return {B, NH, T};
  return {B, NH, T, T};
}

// a[B,T,Ch] = causal attention over qkv[B,T,3Ch], writing `cache` (attention_cache_shape's).
void attend(const Tensor& a, const Tensor& cache, const Tensor& qkv, int64_t NH) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), Ch = qkv.dim(2) / 3;
  if (ops::on_device())
    return ops::attention_forward_device(a.raw(), cache.kernel_data<float>(), qkv.raw(), B, T, Ch,
                                         NH, qkv.dtype());
  ops::attention_forward(a.raw(), cache.data<float>(), qkv.raw(), B, T, Ch, NH, qkv.dtype());
}

// dqkv from da, the forward's qkv, output a and cache.
void attend_backward(const Tensor& dqkv, const Tensor& da, const Tensor& qkv, const Tensor& a,
                     const Tensor& cache, int64_t NH) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), Ch = qkv.dim(2) / 3;
  if (ops::on_device())
    return ops::attention_backward_device(dqkv.raw(), da.raw(), qkv.raw(), a.raw(),
                                          cache.kernel_data<float>(), B, T, Ch, NH, qkv.dtype());
  ops::attention_backward(dqkv.raw(), da.raw(), qkv.raw(), cache.data<float>(), B, T, Ch, NH,
                          qkv.dtype());
}

}  // namespace

// ---- Embedding ----

Embedding::Embedding(int64_t vocab, int64_t context, int64_t channels, TensorParallel* tp,
                     Position position)
    : V_(vocab), T_(context), C_(channels), tp_(tp), learned_(position == Position::kLearned) {
  TESSEL_CHECK(V_ > 0 && T_ > 0 && C_ > 0, "embedding: sizes must be positive, got vocab ", V_,
               ", context ", T_, ", channels ", C_);
  wte_ = {"wte", {V_, C_}, Init::kNormal, kGptInitStd, {}, {}, {}};
  wpe_ = {"wpe", {T_, C_}, Init::kNormal, kGptInitStd, {}, {}, {}};
  if (tp_) wte_.cut(0, 1, tp_->rank(), tp_->size());
}

std::vector<Parameter*> Embedding::parameters() {
  if (!learned_) return {&wte_};
  return {&wte_, &wpe_};
}

Tensor Embedding::forward(const Tensor& ids, const Context& /*ctx*/, Cache* cache) {
  check_tokens(ids, T_);
  if (cache) cache->keep(0, ids);
  return embed(ids, cache);
}

Tensor Embedding::forward_at(const Tensor& ids, const std::vector<int64_t>& positions) {
  TESSEL_CHECK(ids.defined() && ids.dtype() == DType::kI32 && ids.ndim() == 2 &&
                   static_cast<size_t>(ids.numel()) == positions.size() && !sequence_split(tp_),
               "embedding: forward_at takes i32 ids [B, T] and one position each, without "
               "sequence parallelism");
  for (int64_t p : positions)
    if (p < 0 || p >= T_)
      throw InvalidArgument(str("embedding: position ", p, " passes the context of ", T_,
                                "; shorten the prompt or generate fewer tokens"));
  const DType t = wte_.value.dtype();
  Tensor y = lookup(ids, nullptr);
  if (!learned_) return y;
  const int64_t e = static_cast<int64_t>(dtype_size(t));
  char* row = static_cast<char*>(y.raw());
  for (size_t i = 0; i < positions.size(); ++i, row += C_ * e)
    ops::add_forward(row, row, static_cast<const char*>(wpe_.value.raw()) + positions[i] * C_ * e,
                     C_, t);
  return y;
}

Tensor Embedding::lookup(const Tensor& ids, Cache* cache) {
  const int64_t B = ids.dim(0), T = ids.dim(1);
  const DType t = wte_.value.dtype();
  Tensor y = tp_whole_output(tp_, cache, 0, {B, T, C_}, t);
  ops::embedding_forward(y.raw(), ids.kernel_data<int32_t>(), wte_.value.raw(), B * T, V_, C_,
                         wte_.split.lo, wte_.shape[0], t);
  return tp_leave(tp_, y, cache, 1);
}

Tensor Embedding::embed(const Tensor& ids, Cache* cache) {
  Tensor y = lookup(ids, cache);
  if (!learned_) return y;
  positions(y.raw(), wpe_.value.raw(), wte_.value.dtype(), ids.dim(0), y.dim(1), C_,
            first_position(tp_, y.dim(1)), false);
  return y;
}

Tensor Embedding::backward(const Tensor& dy, Cache& cache) {
  const Tensor& ids = cache.kept(0);
  const int64_t B = ids.dim(0), T = ids.dim(1);
  const int64_t Tl = sequence_split(tp_) ? T / tp_->size() : T;
  const DType t = wte_.value.dtype();
  check_gradient(dy, {B, Tl, C_}, t, "embedding");
  if (!defer_weights_) {
    table_grads(dy, ids);
    return {};
  }
  cache.release({0});  // the output, which neither B nor W reads, goes before dy's copy comes
  Tensor kept = cache.buffer(2, dy.shape(), t);  // for backward_weights()
  kept.copy_from(dy);
  cache.keep(1, kept);
  return {};
}

void Embedding::backward_weights(Cache& cache) {
  if (defer_weights_) table_grads(cache.kept(1), cache.kept(0));
}

void Embedding::release_for_weights(Cache& cache) { cache.release({0, 1}); }  // ids and dy

void Embedding::table_grads(const Tensor& dy, const Tensor& ids) {
  const int64_t B = ids.dim(0), T = ids.dim(1);
  const DType t = wte_.value.dtype();
  if (learned_)
    positions(dy.raw(), wpe_.grad.kernel_data<float>(), t, B, dy.dim(1), C_,
              first_position(tp_, dy.dim(1)), true);
  const Tensor g = tp_leave_backward(tp_, dy);
  ops::embedding_backward(wte_.grad.kernel_data<float>(), g.raw(), ids.kernel_data<int32_t>(),
                          B * T, C_, wte_.split.lo, wte_.shape[0], t);
}

// ---- TransformerBlock ----

TransformerBlock::TransformerBlock(int64_t channels, int64_t heads, int64_t context, int64_t layers,
                                   TensorParallel* tp, GptVariant variant)
    : C_(channels),
      NH_(heads),
      T_(context),
      variant_(variant),
      ln1_(make_norm(variant.norm, channels)),
      ln2_(make_norm(variant.norm, channels)),
      qkv_(channels, 3 * channels, true, {tp, Cut::kColumn, 3}),
      attn_proj_(channels, channels, true, {tp, Cut::kRow}),
      fc_(channels, variant.mlp == Mlp::kSwiglu ? 2 * swiglu_hidden(channels) : 4 * channels, true,
          {tp, Cut::kColumn, variant.mlp == Mlp::kSwiglu ? 2 : 1}),
      mlp_proj_(variant.mlp == Mlp::kSwiglu ? swiglu_hidden(channels) : 4 * channels, channels,
                true, {tp, Cut::kRow}) {
  const int parts = tp ? tp->size() : 1;
  TESSEL_CHECK(NH_ > 0 && C_ % NH_ == 0 && NH_ % parts == 0 && T_ > 0 && layers > 0,
               "transformer_block: heads must divide channels (and be split evenly over the ",
               parts, " tensor-parallel ranks) and sizes be positive, got channels ", C_,
               ", heads ", NH_, ", context ", T_, ", layers ", layers);
  NH_ /= parts;
  const float proj_std = kGptInitStd / std::sqrt(2.0f * static_cast<float>(layers));
  for (Linear* l : {&qkv_, &attn_proj_, &fc_, &mlp_proj_}) {
    set_normal(l->weight(), l == &attn_proj_ || l == &mlp_proj_ ? proj_std : kGptInitStd);
    set_zeros(l->bias());
    l->set_rows_per_sample(T_);
  }
  TESSEL_CHECK(variant.position != Position::kRotary || (C_ / heads) % 2 == 0,
               "transformer_block: rotary positions need an even head size, got channels ", C_,
               " over ", heads, " heads");
  prefix_names(ln1_->parameters(), "ln1.");
  prefix_names(qkv_.parameters(), "attn.qkv.");
  prefix_names(attn_proj_.parameters(), "attn.proj.");
  prefix_names(ln2_->parameters(), "ln2.");
  prefix_names(fc_.parameters(), "mlp.fc.");
  prefix_names(mlp_proj_.parameters(), "mlp.proj.");
}

std::vector<Parameter*> TransformerBlock::parameters() {
  std::vector<Parameter*> out;
  for (Module* m :
       std::initializer_list<Module*>{ln1_.get(), &qkv_, &attn_proj_, ln2_.get(), &fc_, &mlp_proj_})
    for (Parameter* p : m->parameters()) out.push_back(p);
  return out;
}

void TransformerBlock::freeze(bool values_too) {
  for (Linear* l : {&qkv_, &attn_proj_, &fc_, &mlp_proj_}) l->freeze(values_too);
}

// Sub-module caches (child k of the block's cache), in forward order.
enum Sub : size_t { kLn1, kQkv, kAttnProj, kLn2, kFc, kGelu, kMlpProj };

// x is [B, T, C], or this rank's [B, T/t, C] under sequence parallelism; qkv and the
// attention are always over the whole sequence and this rank's heads (Ch = C_ / t channels).
Tensor TransformerBlock::forward(const Tensor& x, const Context& ctx, Cache* cache) {
  return run(x, ctx, cache, nullptr, 0);
}

Tensor TransformerBlock::forward_cached(const Tensor& x, KvCache& kv, size_t block) {
  return run(x, Context{false}, nullptr, &kv, block);
}

Tensor TransformerBlock::run(const Tensor& x, const Context& ctx, Cache* cache, KvCache* kv,
                             size_t block) {
  const DType t = qkv_.weight().value.dtype();
  check_activations(x, C_, t, "transformer_block");
  const int64_t n = x.numel();
  auto sub = [cache](Sub k) { return cache ? &cache->child(k) : nullptr; };
  // Attention branch: x1 = x + proj(attention(qkv(ln1(x)))).
  Tensor qkv = qkv_.forward(ln1_->forward(x, ctx, sub(kLn1)), ctx, sub(kQkv));
  const int64_t B = qkv.dim(0), T = qkv.dim(1), Ch = qkv.dim(2) / 3;
  if (variant_.position == Position::kRotary) {  // q and k rotated in place: what attention reads
    const std::vector<int64_t> pos = kv ? cached_positions(*kv) : sequence_positions(B, T);
    Tensor held;
    ops::rotary_forward(qkv.raw(), rotary_positions(pos, held), B * T, Ch, NH_, t);
  }
  // Selective recompute: the attention probabilities and the GELU output go to scratch, which
  // the blocks share; backward() rewrites them from the kept qkv and GELU input before use.
  const bool drop = cache && ctx.selective;
  if (cache) cache->ctx = ctx;
  Tensor a = output(cache, 0, {B, T, Ch}, t);
  Tensor att;
  if (kv) {
    TESSEL_CHECK(t == DType::kF32 && B * T == kv->step_rows(),
                 "transformer_block: generation with a KV cache needs f32 weights and the rows "
                 "of the cache's step, got ",
                 dtype_name(t), " ", shape_str(qkv.shape()), " for ", kv->step_rows(), " rows");
    kv->attend(block, a.data<float>(), qkv.data<float>(), Ch, NH_);
  } else {
    const Shape att_shape = attention_cache_shape(B, NH_, T);
    att = drop ? cache->scratch(3, att_shape) : output(cache, 1, att_shape);
    attend(a, att, qkv, NH_);
  }
  Tensor x1 = output(cache, 2, x.shape(), t);
  ops::add_forward(x1.raw(), x.raw(), attn_proj_.forward(a, ctx, sub(kAttnProj)).raw(), n, t);
  // MLP branch: y = x1 + proj(gelu(fc(ln2(x1)))).
  Tensor h = fc_.forward(ln2_->forward(x1, ctx, sub(kLn2)), ctx, sub(kFc));
  Tensor g;
  if (variant_.mlp == Mlp::kSwiglu) {
    g = swiglu_.forward(h, ctx, sub(kGelu));
  } else if (drop) {  // GELU's forward, its output in scratch (it keeps its input as GELU does)
    g = cache->scratch(4, h.shape(), t);
    ops::gelu_forward(g.raw(), h.raw(), h.numel(), t);
    cache->child(kGelu).keep(0, h);
  } else {
    g = gelu_.forward(h, ctx, sub(kGelu));
  }
  Tensor m = mlp_proj_.forward(g, ctx, sub(kMlpProj));
  Tensor y = output(cache, 3, x.shape(), t);
  ops::add_forward(y.raw(), x1.raw(), m.raw(), n, t);
  if (cache) {
    cache->keep(0, qkv);
    cache->keep(1, att);
    cache->keep(2, a);  // a device's attention backward reads its output
    cache->shape = x.shape();
  }
  return y;
}

// Selective recompute: what the forward left in shared scratch, rewritten in place (the views
// the backward reads) from the kept tensors: the same kernels on the same inputs, so the same
// bits as the forward's.
void TransformerBlock::recompute_gelu(Cache& cache) {
  const Tensor& h = cache.child(kGelu).kept(0);
  const Tensor& g = cache.child(kMlpProj).kept(0);
  ops::gelu_forward(g.raw(), h.raw(), h.numel(), h.dtype());
}

void TransformerBlock::recompute_attention(Cache& cache) {
  const Tensor &qkv = cache.kept(0), &att = cache.kept(1);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), Ch = qkv.dim(2) / 3;
  Tensor a = cache.scratch(5, {B, T, Ch}, qkv.dtype());  // equals the kept output: unused
  attend(a, att, qkv, NH_);
}

Tensor TransformerBlock::backward(const Tensor& dy, Cache& cache) {
  const Tensor &qkv = cache.kept(0), &att = cache.kept(1);
  const Shape shape = cache.shape;
  const DType t = qkv.dtype();
  check_gradient(dy, shape, t, "transformer_block");
  const int64_t n = dy.numel(), B = qkv.dim(0), T = qkv.dim(1), Ch = qkv.dim(2) / 3;
  const bool dropped = cache.ctx.selective;
  const bool swiglu = variant_.mlp == Mlp::kSwiglu;
  if (gelu_dropped(cache)) recompute_gelu(cache);
  for (Linear* l : {&qkv_, &attn_proj_, &fc_, &mlp_proj_}) l->set_defer_weights(defer_weights_);
  // The residual passes dy through unchanged; the MLP branch adds its share.
  Module& act = swiglu ? static_cast<Module&>(swiglu_) : gelu_;
  Tensor dh2 =
      fc_.backward(act.backward(mlp_proj_.backward(dy, cache.child(kMlpProj)), cache.child(kGelu)),
                   cache.child(kFc));
  Tensor dx1 = cache.scratch(0, shape, t);
  ops::add_forward(dx1.raw(), dy.raw(), ln2_->backward(dh2, cache.child(kLn2)).raw(), n, t);
  // Attention branch, then its residual.
  Tensor da = attn_proj_.backward(dx1, cache.child(kAttnProj));
  if (dropped) recompute_attention(cache);
  Tensor dqkv = cache.scratch(1, qkv.shape(), t);
  attend_backward(dqkv, da, qkv, cache.kept(2), att, NH_);
  if (variant_.position == Position::kRotary) {
    const std::vector<int64_t> pos = sequence_positions(B, T);
    Tensor held;
    ops::rotary_backward(dqkv.raw(), rotary_positions(pos, held), B * T, Ch, NH_, t);
  }
  ln1_->set_input_grad(input_grad_);
  Tensor dln1 = ln1_->backward(qkv_.backward(dqkv, cache.child(kQkv)), cache.child(kLn1));
  if (!input_grad_) return {};
  Tensor dx = cache.scratch(2, shape, t);
  ops::add_forward(dx.raw(), dx1.raw(), dln1.raw(), n, t);
  return dx;
}

void TransformerBlock::backward_weights(Cache& cache) {
  if (!defer_weights_) return;
  // mlp.proj reads the GELU output, which selective recompute left in shared scratch.
  if (gelu_dropped(cache)) recompute_gelu(cache);
  mlp_proj_.backward_weights(cache.child(kMlpProj));
  fc_.backward_weights(cache.child(kFc));
  attn_proj_.backward_weights(cache.child(kAttnProj));
  qkv_.backward_weights(cache.child(kQkv));
}

// W reads the four projections' inputs and output gradients (and, when selective recompute
// dropped the GELU output, the GELU input it rewrites it from); the rest goes after B.
void TransformerBlock::release_for_weights(Cache& cache) {
  for (auto [k, l] :
       {std::pair{kQkv, &qkv_}, {kAttnProj, &attn_proj_}, {kFc, &fc_}, {kMlpProj, &mlp_proj_}})
    l->release_for_weights(cache.child(k));
  if (gelu_dropped(cache))
    cache.child(kGelu).release({0});
  else
    cache.child(kGelu).release_all();
  cache.child(kLn1).release_all();
  cache.child(kLn2).release_all();
  cache.release();  // qkv, the attention probabilities, the residual sums
}

double TransformerBlock::forward_flops(int64_t batch) const {
  double f = 0;
  for (const Linear* l : {&qkv_, &attn_proj_, &fc_, &mlp_proj_}) f += l->forward_flops(batch);
  // q @ k^T and att @ v, each T x T x C multiply-adds per sequence (causal half not discounted),
  // over this rank's heads.
  return f + 4.0 * static_cast<double>(batch) * T_ * T_ * (qkv_.out_features() / 3);
}

// ---- LmHead ----

LmHead::LmHead(Parameter* token_table, int64_t vocab, int64_t channels, int64_t context,
               TensorParallel* tp, Norm norm)
    : wte_(token_table),
      V_(vocab),
      C_(channels),
      T_(context),
      tp_(tp),
      ln_(make_norm(norm, channels)) {
  TESSEL_CHECK(wte_ != nullptr && wte_->full_shape() == Shape({V_, C_}),
               "lm_head: tied token table must be [", V_, ", ", C_, "], got ",
               wte_ ? shape_str(wte_->full_shape()) : "none");
  V_ = wte_->shape[0];
  prefix_names(ln_->parameters(), "ln.");
}

// Buffer and scratch slots: 0 the logits / input gradient, 1 this rank's part of the input
// gradient under sequence parallelism. Like a column-cut linear layer it keeps its input's
// sequence part and gathers it again in the backward.
Tensor LmHead::forward(const Tensor& x, const Context& ctx, Cache* cache) {
  const DType t = wte_->value.dtype();
  check_activations(x, C_, t, "lm_head");
  const Tensor normed = ln_->forward(x, ctx, cache ? &cache->child(0) : nullptr);
  const Tensor h = tp_enter(tp_, normed);
  Tensor y = output(cache, 0, {h.dim(0), h.dim(1), V_}, t);
  ops::linear_forward(y.raw(), h.raw(), t, wte_->value.raw(), nullptr, t, h.numel() / C_, C_, V_);
  if (cache) cache->keep(0, normed);
  return y;
}

// Deferred (zero-bubble B): dy goes to buffer 1 and kept slot 1 for backward_weights().
Tensor LmHead::backward(const Tensor& dy, Cache& cache) {
  const Shape h_shape = tp_entered_shape(tp_, cache.kept(0).shape());
  const DType t = cache.kept(0).dtype();
  check_gradient(dy, {h_shape[0], h_shape[1], V_}, t, "lm_head");
  Tensor h;
  if (defer_weights_) {
    Tensor kept = cache.buffer(1, dy.shape(), t);
    kept.copy_from(dy);
    cache.keep(1, kept);
  } else {
    h = tp_enter(tp_, cache.kept(0));
  }
  Tensor dh = tp_whole_grad(tp_, cache, 0, h_shape, t);
  // Accumulates into the embedding's table gradient: the tied weight gets both uses.
  ops::linear_backward(dh.raw(), t, defer_weights_ ? nullptr : wte_->grad.kernel_data<float>(),
                       nullptr, dy.raw(), defer_weights_ ? nullptr : h.raw(), wte_->value.raw(), t,
                       shape_numel(h_shape) / C_, C_, V_);
  ln_->set_input_grad(input_grad_);
  return ln_->backward(tp_enter_backward(tp_, dh, cache, 1), cache.child(0));
}

void LmHead::backward_weights(Cache& cache) {
  if (!defer_weights_) return;
  const Tensor h = tp_enter(tp_, cache.kept(0));
  const Tensor& dy = cache.kept(1);
  ops::linear_backward(nullptr, h.dtype(), wte_->grad.kernel_data<float>(), nullptr, dy.raw(),
                       h.raw(), wte_->value.raw(), h.dtype(), h.numel() / C_, C_, V_);
}

void LmHead::release_for_weights(Cache& cache) {
  cache.child(0).release_all();  // the norm's statistics (its output is kept slot 0)
  cache.release({0, 1});
}

double LmHead::forward_flops(int64_t batch) const {
  return 2.0 * static_cast<double>(batch) * T_ * C_ * V_;
}

}  // namespace tessel::nn
