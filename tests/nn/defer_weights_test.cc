// Deferred weight gradients (zero-bubble B/W split, Module::set_defer_weights): a backward
// that leaves the weight gradients to backward_weights() -- run after other micro-batches'
// backwards, which overwrite the shared scratch -- gives the same bits as the whole backward,
// for every model kind, with and without selective recompute, and for a bf16 Linear.
#include <gtest/gtest.h>

#include <cstring>

#include "nn_testing.h"
#include "tessel/core/memory.h"
#include "tessel/nn/layers.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::batch_for;
using testing::materialized;
using testing::same_bits;
using testing::small_specs;

// Two micro-batches, each with its own caches and one scratch shared between them (as a
// pipeline stage keeps them): F0 B0 F1 B1 whole, or F0 F1 B0 B1 W0 W1 split.
Tensor gradients(const ModelSpec& spec, Recompute mode, bool split) {
  auto m = materialized(spec, 3);
  m->set_input_grad(true);
  m->set_defer_weights(split);
  Activations shared;
  shared.caches.resize(m->num_blocks());
  Activations acts[2];
  for (Activations& a : acts) {
    a.recompute = mode;
    a.caches.resize(m->num_blocks());
    for (size_t b = 0; b < a.caches.size(); ++b) a.caches[b].share_scratch(&shared.caches[b]);
  }
  CrossEntropyLoss loss;
  Tensor dlogits[2], dx[2];
  auto forward = [&](int j) {
    const auto [x, y] = batch_for(spec, 4, 10 + j);
    loss.forward(m->forward(x, Context{true, 77, 5, 4 * j}, &acts[j]), y);
    dlogits[j] = loss.backward(0.5f).clone();
  };
  auto backward = [&](int j) {
    const Tensor g = m->backward(dlogits[j], acts[j]);
    if (g.defined()) dx[j] = g.clone();
  };
  if (split) {
    forward(0), forward(1), backward(0), backward(1);
    m->backward_weights(acts[0]);
    m->backward_weights(acts[1]);
  } else {
    forward(0), backward(0), forward(1), backward(1);
  }
  Tensor out = m->grads().clone();
  if (dx[1].defined() && dx[1].dtype() == DType::kF32) {  // the input gradients too
    Tensor both = Tensor::empty({out.numel() + dx[0].numel() + dx[1].numel()});
    std::memcpy(both.raw(), out.raw(), out.nbytes());
    std::memcpy(both.data<float>() + out.numel(), dx[0].raw(), dx[0].nbytes());
    std::memcpy(both.data<float>() + out.numel() + dx[0].numel(), dx[1].raw(), dx[1].nbytes());
    return both;
  }
  return out;
}

// The modern GPT: RMSNorm, rotary positions, SwiGLU (whose output selective recompute keeps).
ModelSpec modern_spec() {
  ModelSpec s = testing::gpt_spec();
  s.norm = Norm::kRmsNorm;
  s.position = Position::kRotary;
  s.mlp = Mlp::kSwiglu;
  return s;
}

TEST(DeferWeights, SplitBackwardIsBitIdenticalToWhole) {
  std::vector<ModelSpec> specs = small_specs();
  specs.push_back(modern_spec());
  for (const ModelSpec& spec : specs)
    for (Recompute mode : {Recompute::kNone, Recompute::kSelective}) {
      const Tensor whole = gradients(spec, mode, false);
      EXPECT_GT(whole.numel(), 0);
      EXPECT_TRUE(same_bits(whole, gradients(spec, mode, true)))
          << name_of(spec.kind) << " recompute " << static_cast<int>(mode);
    }
}

TEST(DeferWeights, LinearInBf16MovesOnlyTheWeightGradient) {
  Linear whole(8, 6), split(8, 6);
  Tensor w = testing::randn({6, 8}, 1), b = testing::randn({6}, 2);
  Tensor w16 = Tensor::empty({6, 8}, DType::kBF16), b16 = Tensor::empty({6}, DType::kBF16);
  ops::convert(w16.raw(), DType::kBF16, w.raw(), DType::kF32, w.numel());
  ops::convert(b16.raw(), DType::kBF16, b.raw(), DType::kF32, b.numel());
  Tensor x = Tensor::empty({5, 8}, DType::kBF16), dy = Tensor::empty({5, 6}, DType::kBF16);
  ops::convert(x.raw(), DType::kBF16, testing::randn({5, 8}, 3).raw(), DType::kF32, x.numel());
  ops::convert(dy.raw(), DType::kBF16, testing::randn({5, 6}, 4).raw(), DType::kF32, dy.numel());
  Tensor grads[2][2];
  Tensor dx[2];
  Linear* layers[2] = {&whole, &split};
  for (int k = 0; k < 2; ++k) {
    Linear& l = *layers[k];
    l.weight().value = w16;
    l.bias()->value = b16;
    l.weight().grad = grads[k][0] = Tensor::zeros({6, 8});
    l.bias()->grad = grads[k][1] = Tensor::zeros({6});
    l.set_defer_weights(k == 1);
    Cache cache;
    l.forward(x, Context{}, &cache);
    dx[k] = l.backward(dy, cache).clone();
    if (k == 1) {
      EXPECT_TRUE(same_bits(grads[1][1], grads[0][1]));  // the bias gradient stays in B
      EXPECT_TRUE(same_bits(grads[1][0], Tensor::zeros({6, 8})));
      l.release_for_weights(cache);
      l.backward_weights(cache);
    }
  }
  EXPECT_TRUE(same_bits(dx[0], dx[1]));
  EXPECT_TRUE(same_bits(grads[0][0], grads[1][0]));
  EXPECT_TRUE(same_bits(grads[0][1], grads[1][1]));
}

// After B, a Linear's cache holds its output gradient for W (the input is the caller's) and
// nothing else: its output and its input gradient's scratch are gone.
TEST(DeferWeights, ReleasedLinearHoldsOnlyWhatItsWReads) {
  Linear l(5, 7);
  Tensor w = testing::randn({7, 5}, 1), b = testing::randn({7}, 2);
  l.weight().value = w, l.bias()->value = b;
  l.weight().grad = Tensor::zeros({7, 5}), l.bias()->grad = Tensor::zeros({7});
  l.set_defer_weights(true);
  const Tensor x = testing::randn({4, 5}, 3), dy = testing::randn({4, 7}, 4);
  auto ledger = std::make_shared<MemoryLedger>();
  MemoryScope scope(ledger, MemCategory::kActivations);
  Cache cache;
  l.forward(x, Context{}, &cache);
  const int64_t one = ledger->current(MemCategory::kActivations);  // the output, [4, 7]
  EXPECT_GE(one, 4 * 7 * 4);
  l.backward(dy, cache);
  // The output went before dy's copy came (neither B nor W reads it): dy's copy and dx (each
  // charged as the output is here), not the output besides.
  EXPECT_EQ(ledger->current(MemCategory::kActivations), 2 * one);
  l.release_for_weights(cache);
  EXPECT_EQ(ledger->current(MemCategory::kActivations), one);  // dy's copy
  l.backward_weights(cache);
  Linear whole(5, 7);  // W from what stayed gives the whole backward's weight gradient
  whole.weight().value = w, whole.bias()->value = b;
  whole.weight().grad = Tensor::zeros({7, 5}), whole.bias()->grad = Tensor::zeros({7});
  Cache c;
  whole.forward(x, Context{}, &c);
  whole.backward(dy, c);
  EXPECT_TRUE(same_bits(whole.weight().grad, l.weight().grad));
}

// A GPT micro-batch waiting for its W holds less than after its forward (the attention
// probabilities, residual sums, norms' outputs and statistics are gone; the projections'
// inputs and output gradients stay), for classic and modern blocks, with selective recompute.
TEST(DeferWeights, GptMicroBatchWaitingForWHoldsLessThanAfterForward) {
  for (const ModelSpec& spec : {testing::gpt_spec(), modern_spec()})
    for (Recompute mode : {Recompute::kNone, Recompute::kSelective}) {
      auto m = materialized(spec, 3);
      m->set_defer_weights(true);
      const auto [x, y] = batch_for(spec, 4, 10);
      CrossEntropyLoss loss;
      Activations scratch, acts;
      scratch.caches.resize(m->num_blocks());
      acts.recompute = mode;
      acts.caches.resize(m->num_blocks());
      for (size_t b = 0; b < acts.caches.size(); ++b)
        acts.caches[b].share_scratch(&scratch.caches[b]);
      auto ledger = std::make_shared<MemoryLedger>();
      int64_t after_forward = 0, after_backward = 0;
      {
        MemoryScope scope(ledger, MemCategory::kActivations);
        loss.forward(m->forward(x, Context{true, 77, 5, 0}, &acts), y);
        after_forward = ledger->current(MemCategory::kActivations);
      }
      const Tensor dlogits = loss.backward(1.0f).clone();
      {
        MemoryScope scope(ledger, MemCategory::kActivations);
        m->backward(dlogits, acts);
        after_backward = ledger->current(MemCategory::kActivations) - scratch.bytes();
      }
      EXPECT_LT(after_backward, after_forward) << name_of(spec.mlp) << " recompute " << int(mode);
      m->backward_weights(acts);
    }
}

TEST(DeferWeights, FullRecomputeIsRefused) {
  auto m = materialized(small_specs().front(), 3);
  m->set_defer_weights(true);
  Activations acts;
  acts.recompute = Recompute::kFull;
  acts.caches.resize(m->num_blocks());
  try {
    m->backward_weights(acts);
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("train.recompute = selective"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessel::nn
