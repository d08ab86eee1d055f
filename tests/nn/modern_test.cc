// The modern GPT variant (model.norm = rmsnorm, model.position = rotary, model.mlp = swiglu):
// its kernels against direct formulas in double (and bf16 against f32), finite-difference
// gradient checks of RMSNorm, SwiGLU, the modern block and the whole model, the parameter count
// against the classic GPT, and generation with the KV cache against recomputing the context.
#include "tessel/nn/modern.h"

#include <gtest/gtest.h>

#include <cmath>

#include "nn_testing.h"
#include "tessel/infer/generate.h"
#include "tessel/nn/layers.h"
#include "tessel/ops/cpu.h"

namespace tessel::nn {
namespace {

using testing::check_model_grads;
using testing::check_module_grads;
using testing::materialized;
using testing::randn;
using testing::random_ids;

const Context kTrain{true, 1234, 3, 40};

// ---- Kernels against the formulas ----

TEST(ModernKernels, RmsNormMatchesTheFormula) {
  const int64_t N = 3, C = 10;
  const Tensor x = randn({N, C}, 1, 2.0f), w = randn({C}, 2);
  Tensor y = Tensor::empty({N, C}), rstd = Tensor::empty({N});
  ops::rmsnorm_forward(y.data<float>(), rstd.data<float>(), x.data<float>(), w.data<float>(), N, C);
  for (int64_t r = 0; r < N; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += std::pow(double{x.data<float>()[r * C + c]}, 2) / C;
    for (int64_t c = 0; c < C; ++c)
      EXPECT_NEAR(y.data<float>()[r * C + c],
                  x.data<float>()[r * C + c] / std::sqrt(ms + 1e-5) * w.data<float>()[c], 1e-5);
  }
}

TEST(ModernKernels, SwigluMatchesTheFormula) {
  const int64_t N = 2, H = 5;
  const Tensor x = randn({N, 2 * H}, 3, 2.0f);
  Tensor y = Tensor::empty({N, H});
  ops::swiglu_forward(y.data<float>(), x.data<float>(), N, H);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < H; ++j) {
      const double a = x.data<float>()[r * 2 * H + j], b = x.data<float>()[r * 2 * H + H + j];
      EXPECT_NEAR(y.data<float>()[r * H + j], a / (1 + std::exp(-a)) * b, 1e-5);
    }
}

// Each head's pair (i, i + hs/2) of q and k turns by pos * 10000^(-2i/hs) (a complex product);
// v stays; the backward turns back (a rotation's transpose is its inverse).
TEST(ModernKernels, RotaryRotatesQueryAndKeyPairsAndTheBackwardUndoesIt) {
  const int64_t N = 3, C = 8, NH = 2, hs = 4;
  const Tensor qkv = randn({N, 3 * C}, 4);
  Tensor out = qkv.clone();
  const std::vector<int64_t> pos = {0, 5, 17};
  ops::rotary_forward(out.data<float>(), pos.data(), N, C, NH);
  const float* in = qkv.data<float>();
  const float* o = out.data<float>();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < 2 * NH; ++h)
      for (int64_t i = 0; i < hs / 2; ++i) {
        const int64_t a = r * 3 * C + h * hs + i, b = a + hs / 2;
        const double angle = pos[r] * std::pow(10000.0, -2.0 * i / hs);
        EXPECT_NEAR(o[a], in[a] * std::cos(angle) - in[b] * std::sin(angle), 1e-5);
        EXPECT_NEAR(o[b], in[a] * std::sin(angle) + in[b] * std::cos(angle), 1e-5);
      }
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 2 * C; c < 3 * C; ++c) EXPECT_EQ(o[r * 3 * C + c], in[r * 3 * C + c]);
  ops::rotary_backward(out.data<float>(), pos.data(), N, C, NH);
  for (int64_t i = 0; i < qkv.numel(); ++i) EXPECT_NEAR(o[i], in[i], 1e-5);
}

// The any-type kernels in bf16 track the f32 ones to bf16's precision.
TEST(ModernKernels, Bf16TracksF32) {
  const int64_t N = 4, C = 16, NH = 2;
  auto bf16 = [](const Tensor& t) {
    Tensor h = Tensor::empty(t.shape(), DType::kBF16);
    ops::convert(h.raw(), DType::kBF16, t.raw(), DType::kF32, t.numel());
    return h;
  };
  auto f32 = [](const Tensor& h) {
    Tensor t = Tensor::empty(h.shape());
    ops::convert(t.raw(), DType::kF32, h.raw(), h.dtype(), h.numel());
    return t;
  };
  auto expect_close = [](const Tensor& a, const Tensor& b, const char* what) {
    for (int64_t i = 0; i < a.numel(); ++i)
      EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], 0.02 * (1 + std::abs(b.data<float>()[i])))
          << what << " " << i;
  };
  const Tensor x = randn({N, 3 * C}, 5), w = randn({C}, 6);
  Tensor y = Tensor::empty({N, C}), yh = Tensor::empty({N, C}, DType::kBF16);
  Tensor rstd = Tensor::empty({N}), rstd_h = Tensor::empty({N});
  const Tensor x3 = x.view(0, {N, C});  // its first N * C values as an [N, C] input
  ops::rmsnorm_forward(y.raw(), rstd.data<float>(), x3.raw(), w.raw(), N, C, DType::kF32);
  ops::rmsnorm_forward(yh.raw(), rstd_h.data<float>(), bf16(x3).raw(), bf16(w).raw(), N, C,
                       DType::kBF16);
  expect_close(f32(yh), y, "rmsnorm");
  Tensor s = Tensor::empty({N, C}), sh = Tensor::empty({N, C}, DType::kBF16);
  const Tensor x2 = x.view(0, {N, 2 * C});
  ops::swiglu_forward(s.raw(), x2.raw(), N, C, DType::kF32);
  ops::swiglu_forward(sh.raw(), bf16(x2).raw(), N, C, DType::kBF16);
  expect_close(f32(sh), s, "swiglu");
  const std::vector<int64_t> pos = {1, 2, 3, 40};
  Tensor r = x.clone(), rh = bf16(x);
  ops::rotary_forward(r.raw(), pos.data(), N, C, NH, DType::kF32);
  ops::rotary_forward(rh.raw(), pos.data(), N, C, NH, DType::kBF16);
  expect_close(f32(rh), r, "rotary");
}

// ---- Gradients (finite differences) ----

TEST(ModernGrad, RmsNorm) {
  check_module_grads(std::make_unique<RMSNorm>(6), randn({2, 3, 6}, 11, 2.0f), kTrain);
}

TEST(ModernGrad, Swiglu) {
  check_module_grads(std::make_unique<SwiGLU>(), randn({3, 8}, 12, 2.0f), kTrain);
}

// Each part alone and all three together, in a block and a shorter sequence than the context.
TEST(ModernGrad, TransformerBlockVariants) {
  const std::vector<GptVariant> variants = {{Norm::kRmsNorm, Position::kLearned, Mlp::kGelu},
                                            {Norm::kLayerNorm, Position::kRotary, Mlp::kGelu},
                                            {Norm::kLayerNorm, Position::kLearned, Mlp::kSwiglu},
                                            {Norm::kRmsNorm, Position::kRotary, Mlp::kSwiglu}};
  for (const GptVariant& v : variants) {
    SCOPED_TRACE(str(name_of(v.norm), " ", name_of(v.position), " ", name_of(v.mlp)));
    check_module_grads(std::make_unique<TransformerBlock>(8, 2, 6, 2, nullptr, v),
                       randn({2, 5, 8}, 13), kTrain, {.max_coords = 12});
  }
}

ModelSpec modern_gpt() {
  ModelSpec s;
  s.kind = ModelKind::kGpt;
  s.input_shape = {6};
  s.num_classes = 7;
  s.layers = 2;
  s.heads = 2;
  s.embed = 8;
  s.norm = Norm::kRmsNorm;
  s.position = Position::kRotary;
  s.mlp = Mlp::kSwiglu;
  return s;
}

// The whole model: embedding without a position table, the tied head after an RMSNorm.
TEST(ModernGrad, ModernGpt) {
  auto m = materialized(modern_gpt(), 4);
  for (const Parameter* p : m->parameters()) {
    EXPECT_EQ(p->name.find("wpe"), std::string::npos) << p->name;
    EXPECT_EQ(p->name.find("bias") != std::string::npos && p->name.find("ln") != std::string::npos,
              false)
        << p->name << ": RMSNorm has no bias";
  }
  check_model_grads(*m, random_ids({2, 6}, 7, 36), random_ids({2, 6}, 7, 37), kTrain,
                    {.max_coords = 8});
}

// SwiGLU's hidden width keeps the MLP's parameters within 5% of the classic one's (rounding 8C/3
// to a multiple of 8 moves it by at most 4 units): the modern model differs only by that, the
// position table and the norms' biases.
TEST(ModernGpt, ParameterCountMatchesTheClassicMlp) {
  EXPECT_EQ(swiglu_hidden(64), 168);
  EXPECT_EQ(swiglu_hidden(8), 24);
  for (int64_t C : {32, 64, 128, 256}) {
    const double classic = 8.0 * C * C, modern = 3.0 * C * swiglu_hidden(C);
    EXPECT_NEAR(modern / classic, 1.0, 0.05) << C;
  }
  ModelSpec classic = modern_gpt();
  classic.norm = Norm::kLayerNorm;
  classic.position = Position::kLearned;
  classic.mlp = Mlp::kGelu;
  classic.embed = 64;
  ModelSpec modern = modern_gpt();
  modern.embed = 64;
  const int64_t C = 64, T = 6, L = 2;
  const int64_t mlp_diff = L * ((8 * C * C + 4 * C) - (3 * C * 168 + 2 * 168));
  // Classic: + wpe (T x C) + one bias per LayerNorm (2 per block, the head's).
  EXPECT_EQ(build_model(classic)->num_parameters() - build_model(modern)->num_parameters(),
            T * C + (2 * L + 1) * C + mlp_diff);
}

TEST(ModernGpt, BadOptionsNameTheKey) {
  ModelSpec s = modern_gpt();
  s.heads = 8;  // head size 1: no pairs to rotate
  try {
    build_model(s);
    ADD_FAILURE() << "an odd head size was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("even size"), std::string::npos) << e.what();
  }
  ModelSpec mlp;
  mlp.input_shape = {4};
  mlp.num_classes = 3;
  mlp.norm = Norm::kRmsNorm;
  try {
    build_model(mlp);
    ADD_FAILURE() << "model.norm on an mlp was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("model.kind = gpt"), std::string::npos) << e.what();
  }
}

// ---- Generation ----

// Rotary positions in the KV cache path: a step's rows turn by their sequence positions, so
// decoding token by token gives the logits (to float rounding: the GEMMs' shapes differ) and
// the tokens of running the whole context again.
TEST(ModernGpt, KvCacheGivesTheLogitsAndTokensOfRecomputing) {
  ModelSpec s = modern_gpt();
  s.input_shape = {24};
  s.num_classes = 13;
  s.embed = 16;
  auto m = materialized(s, 9);
  testing::jitter_params(*m, 0.3f);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 10; ++i) tokens.push_back((7 * i + 3) % 13);
  KvCache kv(2);
  const int64_t seq = kv.add();
  Tensor step = infer::forward_step(*m, kv, {tokens.begin(), tokens.begin() + 4}, {{seq, 4}});
  for (size_t t = 4; t <= tokens.size(); ++t) {
    Tensor ids = Tensor::empty({1, static_cast<int64_t>(t)}, DType::kI32);
    std::copy(tokens.begin(), tokens.begin() + t, ids.data<int32_t>());
    const Tensor full = m->forward(ids, Context{false}, nullptr);
    const float* last = full.data<float>() + (t - 1) * 13;
    for (int64_t v = 0; v < 13; ++v)
      EXPECT_NEAR(step.data<float>()[v], last[v], 1e-4 * (1 + std::abs(last[v]))) << t;
    if (t < tokens.size()) step = infer::forward_step(*m, kv, {tokens[t]}, {{seq, 1}});
  }
  std::vector<infer::Prompt> prompts(2);
  prompts[0].tokens = {1, 2, 3};
  prompts[1].tokens = {4};
  for (auto& p : prompts) p.max_new_tokens = 12;
  for (float temperature : {0.0f, 1.0f}) {
    infer::SampleOptions cached{temperature, 5, 11, true}, recompute = cached;
    recompute.kv_cache = false;
    EXPECT_EQ(infer::generate(*m, prompts, cached), infer::generate(*m, prompts, recompute));
  }
}

}  // namespace
}  // namespace tessel::nn
