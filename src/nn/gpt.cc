// GPT blocks: token + position embedding, the pre-LN transformer block and the tied LM head.
#include <cmath>
#include <cstring>

#include "tessel/nn/layers.h"
#include "tessel/ops/cpu.h"

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
                              x.defined() ? str(dtype_name(x.dtype()), " ", shape_str(x.shape()))
                                          : "undefined",
                              "; place it after the embedding block"));
}

void check_gradient(const Tensor& dy, const Shape& shape, DType t, const char* layer) {
  TESSEL_CHECK(dy.defined() && dy.shape() == shape && dy.dtype() == t, layer,
               ": backward gradient ",
               dy.defined() ? str(dtype_name(dy.dtype()), " ", shape_str(dy.shape())) : "undefined",
               ", expected ", dtype_name(t), " ", shape_str(shape));
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

}  // namespace

// ---- Embedding ----

Embedding::Embedding(int64_t vocab, int64_t context, int64_t channels)
    : V_(vocab), T_(context), C_(channels) {
  TESSEL_CHECK(V_ > 0 && T_ > 0 && C_ > 0, "embedding: sizes must be positive, got vocab ", V_,
               ", context ", T_, ", channels ", C_);
  wte_ = {"wte", {V_, C_}, Init::kNormal, kGptInitStd, {}, {}};
  wpe_ = {"wpe", {T_, C_}, Init::kNormal, kGptInitStd, {}, {}};
}

Tensor Embedding::forward(const Tensor& ids, const Context& ctx, Cache* cache) {
  (void)ctx;
  check_tokens(ids, T_);
  if (cache) cache->keep(0, ids);
  const int64_t B = ids.dim(0), T = ids.dim(1);
  const DType t = wte_.value.dtype();
  Tensor y = output(cache, 0, {B, T, C_}, t);
  ops::embedding_forward(y.raw(), ids.data<int32_t>(), wte_.value.raw(), B * T, V_, C_, t);
  // Position embedding: rows [0, T) of the [context, C] table onto each sequence.
  for (int64_t b = 0; b < B; ++b) {
    const Tensor seq = y.view(b * T * C_, {T * C_});
    ops::add_forward(seq.raw(), seq.raw(), wpe_.value.raw(), T * C_, t);
  }
  return y;
}

Tensor Embedding::backward(const Tensor& dy, Cache& cache) {
  const Tensor& ids = cache.kept(0);
  const int64_t B = ids.dim(0), T = ids.dim(1);
  const DType t = wte_.value.dtype();
  check_gradient(dy, {B, T, C_}, t, "embedding");
  ops::embedding_backward(wte_.grad.data<float>(), dy.raw(), ids.data<int32_t>(), B * T, C_, t);
  for (int64_t b = 0; b < B; ++b)
    ops::accumulate(wpe_.grad.data<float>(), dy.view(b * T * C_, {T * C_}).raw(), T * C_, t);
  return {};
}

// ---- TransformerBlock ----

TransformerBlock::TransformerBlock(int64_t channels, int64_t heads, int64_t context, int64_t layers)
    : C_(channels),
      NH_(heads),
      T_(context),
      ln1_(channels),
      ln2_(channels),
      qkv_(channels, 3 * channels),
      attn_proj_(channels, channels),
      fc_(channels, 4 * channels),
      mlp_proj_(4 * channels, channels) {
  TESSEL_CHECK(NH_ > 0 && C_ % NH_ == 0 && T_ > 0 && layers > 0,
               "transformer_block: heads must divide channels and sizes be positive, got "
               "channels ",
               C_, ", heads ", NH_, ", context ", T_, ", layers ", layers);
  const float proj_std = kGptInitStd / std::sqrt(2.0f * static_cast<float>(layers));
  for (Linear* l : {&qkv_, &attn_proj_, &fc_, &mlp_proj_}) {
    set_normal(l->weight(), l == &attn_proj_ || l == &mlp_proj_ ? proj_std : kGptInitStd);
    set_zeros(l->bias());
    l->set_rows_per_sample(T_);
  }
  prefix_names(ln1_.parameters(), "ln1.");
  prefix_names(qkv_.parameters(), "attn.qkv.");
  prefix_names(attn_proj_.parameters(), "attn.proj.");
  prefix_names(ln2_.parameters(), "ln2.");
  prefix_names(fc_.parameters(), "mlp.fc.");
  prefix_names(mlp_proj_.parameters(), "mlp.proj.");
}

std::vector<Parameter*> TransformerBlock::parameters() {
  std::vector<Parameter*> out;
  for (Module* m :
       std::initializer_list<Module*>{&ln1_, &qkv_, &attn_proj_, &ln2_, &fc_, &mlp_proj_})
    for (Parameter* p : m->parameters()) out.push_back(p);
  return out;
}

// Sub-module caches (child k of the block's cache), in forward order.
enum Sub : size_t { kLn1, kQkv, kAttnProj, kLn2, kFc, kGelu, kMlpProj };

Tensor TransformerBlock::forward(const Tensor& x, const Context& ctx, Cache* cache) {
  const DType t = qkv_.weight().value.dtype();
  check_activations(x, C_, t, "transformer_block");
  const int64_t B = x.dim(0), T = x.dim(1), n = x.numel();
  auto sub = [cache](Sub k) { return cache ? &cache->child(k) : nullptr; };
  // Attention branch: x1 = x + proj(attention(qkv(ln1(x)))).
  Tensor qkv = qkv_.forward(ln1_.forward(x, ctx, sub(kLn1)), ctx, sub(kQkv));
  // Selective recompute: the attention probabilities and the GELU output go to scratch, which
  // the blocks share; backward() rewrites them from the kept qkv and GELU input before use.
  const bool drop = cache && ctx.selective;
  if (cache) cache->ctx = ctx;
  Tensor a = output(cache, 0, {B, T, C_}, t);
  Tensor att = drop ? cache->scratch(3, {B, NH_, T, T}) : output(cache, 1, {B, NH_, T, T});
  ops::attention_forward(a.raw(), att.data<float>(), qkv.raw(), B, T, C_, NH_, t);
  Tensor x1 = output(cache, 2, x.shape(), t);
  ops::add_forward(x1.raw(), x.raw(), attn_proj_.forward(a, ctx, sub(kAttnProj)).raw(), n, t);
  // MLP branch: y = x1 + proj(gelu(fc(ln2(x1)))).
  Tensor h = fc_.forward(ln2_.forward(x1, ctx, sub(kLn2)), ctx, sub(kFc));
  Tensor g;
  if (drop) {  // GELU's forward, its output in scratch (it keeps its input as GELU does)
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
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  Tensor a = cache.scratch(5, {B, T, C_}, qkv.dtype());  // equals the kept output: unused
  ops::attention_forward(a.raw(), att.data<float>(), qkv.raw(), B, T, C_, NH_, qkv.dtype());
}

Tensor TransformerBlock::backward(const Tensor& dy, Cache& cache) {
  const Tensor &qkv = cache.kept(0), &att = cache.kept(1);
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  const Shape shape{B, T, C_};
  const DType t = qkv.dtype();
  check_gradient(dy, shape, t, "transformer_block");
  const int64_t n = dy.numel();
  const bool dropped = cache.ctx.selective;
  if (dropped) recompute_gelu(cache);
  // The residual passes dy through unchanged; the MLP branch adds its share.
  Tensor dh2 = fc_.backward(gelu_.backward(mlp_proj_.backward(dy, cache.child(kMlpProj)),
                                           cache.child(kGelu)),
                            cache.child(kFc));
  Tensor dx1 = cache.scratch(0, shape, t);
  ops::add_forward(dx1.raw(), dy.raw(), ln2_.backward(dh2, cache.child(kLn2)).raw(), n, t);
  // Attention branch, then its residual.
  Tensor da = attn_proj_.backward(dx1, cache.child(kAttnProj));
  if (dropped) recompute_attention(cache);
  Tensor dqkv = cache.scratch(1, {B, T, 3 * C_}, t);
  ops::attention_backward(dqkv.raw(), da.raw(), qkv.raw(), att.data<float>(), B, T, C_, NH_, t);
  ln1_.set_input_grad(input_grad_);
  Tensor dln1 = ln1_.backward(qkv_.backward(dqkv, cache.child(kQkv)), cache.child(kLn1));
  if (!input_grad_) return {};
  Tensor dx = cache.scratch(2, shape, t);
  ops::add_forward(dx.raw(), dx1.raw(), dln1.raw(), n, t);
  return dx;
}

double TransformerBlock::forward_flops(int64_t batch) const {
  double f = 0;
  for (const Linear* l : {&qkv_, &attn_proj_, &fc_, &mlp_proj_}) f += l->forward_flops(batch);
  // q @ k^T and att @ v, each T x T x C multiply-adds per sequence (causal half not discounted).
  return f + 4.0 * static_cast<double>(batch) * T_ * T_ * C_;
}

// ---- LmHead ----

LmHead::LmHead(Parameter* token_table, int64_t vocab, int64_t channels, int64_t context)
    : wte_(token_table), V_(vocab), C_(channels), T_(context), ln_(channels) {
  TESSEL_CHECK(wte_ != nullptr && wte_->shape == Shape({V_, C_}),
               "lm_head: tied token table must be [", V_, ", ", C_, "], got ",
               wte_ ? shape_str(wte_->shape) : "none");
  prefix_names(ln_.parameters(), "ln.");
}

Tensor LmHead::forward(const Tensor& x, const Context& ctx, Cache* cache) {
  const DType t = wte_->value.dtype();
  check_activations(x, C_, t, "lm_head");
  Tensor h = ln_.forward(x, ctx, cache ? &cache->child(0) : nullptr);
  Tensor y = output(cache, 0, {x.dim(0), x.dim(1), V_}, t);
  ops::linear_forward(y.raw(), h.raw(), t, wte_->value.raw(), nullptr, t, h.numel() / C_, C_, V_);
  if (cache) cache->keep(0, h);
  return y;
}

Tensor LmHead::backward(const Tensor& dy, Cache& cache) {
  const Tensor& h = cache.kept(0);
  const DType t = h.dtype();
  check_gradient(dy, {h.dim(0), h.dim(1), V_}, t, "lm_head");
  Tensor dh = cache.scratch(0, h.shape(), t);
  // Accumulates into the embedding's table gradient: the tied weight gets both uses.
  ops::linear_backward(dh.raw(), t, wte_->grad.data<float>(), nullptr, dy.raw(), h.raw(),
                       wte_->value.raw(), t, h.numel() / C_, C_, V_);
  ln_.set_input_grad(input_grad_);
  return ln_.backward(dh, cache.child(0));
}

double LmHead::forward_flops(int64_t batch) const {
  return 2.0 * static_cast<double>(batch) * T_ * C_ * V_;
}

}  // namespace tessel::nn
