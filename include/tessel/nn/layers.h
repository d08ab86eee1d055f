// The layer blocks models are made of, each a Module over the CPU kernels of tessel/ops. Public
// so that other code (tensor-parallel blocks, tests) can compose them. Each layer owns the
// buffers it returns: an output of forward() or backward() stays valid until that layer's next
// forward() or backward() with the same role, which lets a steady-state step allocate nothing.
// Layers keep a reference to their input until backward(); the caller must not overwrite it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/nn/module.h"

namespace tessel::nn {

// A reusable output buffer: get() returns a tensor of the requested shape sharing the storage
// of earlier calls when that is big enough, so repeated shapes cost no allocation.
class Buffer {
 public:
  // A copy starts empty: a cloned module must not write into the original's outputs.
  Buffer() = default;
  Buffer(const Buffer&) {}
  Buffer& operator=(const Buffer&) { return *this; }
  Tensor get(const Shape& shape, DType dtype = DType::kF32);

 private:
  Tensor storage_;
};

// y[..., out] = x[..., in] @ weight[out, in]^T + bias[out]; leading dimensions are rows.
// Init as PyTorch: weight and bias U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, bool bias = true);
  std::string kind() const override { return "linear"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<Linear>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override;
  // Rows per sample (1 for [N, in] inputs, T for [B, T, in]) for the FLOP count.
  void set_rows_per_sample(int64_t rows) { rows_per_sample_ = rows; }
  double forward_flops(int64_t batch) const override;

  Parameter& weight() { return weight_; }
  Parameter* bias() { return has_bias_ ? &bias_ : nullptr; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 private:
  int64_t in_, out_, rows_per_sample_ = 1;
  bool has_bias_;
  Parameter weight_, bias_;
  Tensor x_;
  Buffer y_, dx_;
};

class ReLU : public Module {
 public:
  std::string kind() const override { return "relu"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<ReLU>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;

 private:
  Tensor y_;
  Buffer ybuf_, dx_;
};

// GELU, tanh approximation.
class GELU : public Module {
 public:
  std::string kind() const override { return "gelu"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<GELU>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;

 private:
  Tensor x_;
  Buffer y_, dx_;
};

// Inverted dropout keyed by (ctx.seed, ctx.step, ctx.first_sample + row): the identity when
// not training or p == 0. Dimension 0 of the input is the sample.
class Dropout : public Module {
 public:
  explicit Dropout(float p);
  std::string kind() const override { return "dropout"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<Dropout>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;

 private:
  float p_;
  bool active_ = false;  // whether the last forward() applied a mask
  Context ctx_;
  int64_t rows_ = 0, cols_ = 0;
  Buffer y_, dx_;
};

// [N, d1, d2, ...] -> [N, d1*d2*...]; a view, no copy.
class Flatten : public Module {
 public:
  std::string kind() const override { return "flatten"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<Flatten>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;

 private:
  Shape in_shape_;
};

// x[N, C, H, W] -> y[N, OC, OH, OW], square kernel k. Init U(-1/sqrt(C*k*k), +1/sqrt(C*k*k)).
// in_h, in_w (optional) are the expected input size: checked in forward() and used for FLOPs.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1,
         int64_t pad = 0, int64_t in_h = 0, int64_t in_w = 0);
  std::string kind() const override { return "conv2d"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<Conv2d>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  double forward_flops(int64_t batch) const override;

 private:
  int64_t C_, OC_, k_, stride_, pad_, in_h_, in_w_;
  Parameter weight_, bias_;
  Tensor x_;
  Buffer y_, dx_, scratch_;
};

// Max pooling with a square window k and stride: x[N, C, H, W] -> y[N, C, OH, OW].
class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride);
  std::string kind() const override { return "maxpool2d"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<MaxPool2d>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;

 private:
  int64_t k_, stride_;
  Shape in_shape_;
  Buffer y_, argmax_, dx_;
};

// LayerNorm over the last dimension C (eps 1e-5); weight starts at ones, bias at zeros.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t channels);
  std::string kind() const override { return "layernorm"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<LayerNorm>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }

 private:
  int64_t C_;
  Parameter weight_, bias_;
  Tensor x_;
  Buffer y_, mean_, rstd_, dx_;
};

// ---- GPT blocks (gpt.cc) ----

// Token ids i32 [B, T] -> wte[ids] + wpe[t]: [B, T, C], T <= context. Parameters "wte" [V, C]
// and "wpe" [context, C], both N(0, 0.02). backward() returns an undefined Tensor (ids have no
// gradient).
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t context, int64_t channels);
  std::string kind() const override { return "embedding"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<Embedding>(*this); }
  Tensor forward(const Tensor& ids, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return {&wte_, &wpe_}; }
  Parameter* token_table() { return &wte_; }

 private:
  int64_t V_, T_, C_;
  Parameter wte_, wpe_;
  Tensor ids_;
  Buffer y_;
};

// Pre-LN transformer block on [B, T, C]: x1 = x + proj(attention(qkv(ln1(x)))), then
// y = x1 + mlp.proj(gelu(mlp.fc(ln2(x1)))). GPT-2 init: weights N(0, 0.02), the two residual
// projections N(0, 0.02/sqrt(2*layers)), biases 0.
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t channels, int64_t heads, int64_t context, int64_t layers);
  std::string kind() const override { return "transformer_block"; }
  std::unique_ptr<Module> clone() const override {
    return std::make_unique<TransformerBlock>(*this);
  }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override;
  double forward_flops(int64_t batch) const override;

 private:
  int64_t C_, NH_, T_;
  LayerNorm ln1_, ln2_;
  Linear qkv_, attn_proj_, fc_, mlp_proj_;
  GELU gelu_;
  Tensor qkv_out_;  // attention input, cached for backward
  int64_t B_ = 0, T_cur_ = 0;
  Buffer att_, attn_out_, dqkv_, x1_, y_, dx1_, dx_;
};

// Final LayerNorm + LM head whose weight is the token table of an Embedding (tied): logits
// [B, T, V]. The table is borrowed, not listed in parameters(); backward() adds the head's
// share of the table gradient into the same Parameter::grad.
class LmHead : public Module {
 public:
  LmHead(Parameter* token_table, int64_t vocab, int64_t channels, int64_t context);
  std::string kind() const override { return "lm_head"; }
  std::unique_ptr<Module> clone() const override { return std::make_unique<LmHead>(*this); }
  Tensor forward(const Tensor& x, const Context& ctx) override;
  Tensor backward(const Tensor& dy) override;
  std::vector<Parameter*> parameters() override { return ln_.parameters(); }
  double forward_flops(int64_t batch) const override;
  Parameter* token_table() const { return wte_; }  // the borrowed (tied) table

 private:
  Parameter* wte_;
  int64_t V_, C_, T_;
  LayerNorm ln_;
  Tensor h_;
  Buffer y_, dh_;
};

}  // namespace tessel::nn
