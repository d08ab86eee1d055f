// train.recompute: the gradients of two steps (the second reusing every buffer) equal those
// of a run that keeps everything, bit for bit, and a transformer keeps less.
#include <gtest/gtest.h>

#include "nn_testing.h"
#include "tessel/nn/loss.h"
#include "tessel/nn/models.h"

namespace tessel::nn {
namespace {

using testing::batch_for;
using testing::materialized;
using testing::same_bits;
using testing::small_specs;

const Context kTrain{true, 77, 5, 0};

TEST(Recompute, GradientsAreBitIdenticalToNone) {
  for (const ModelSpec& spec : small_specs()) {
    auto run = [&](Recompute mode, int64_t* bytes) {
      auto m = materialized(spec, 3);
      Activations acts;
      acts.recompute = mode;
      acts.caches.resize(m->num_blocks());
      if (mode != Recompute::kNone)
        for (Cache& c : acts.caches) c.share_scratch(&acts.scratch);
      CrossEntropyLoss loss;
      for (uint64_t step = 0; step < 2; ++step) {
        const auto [x, y] = batch_for(spec, 4, 10 + step);
        loss.forward(m->forward(x, kTrain, &acts), y);
        m->backward(loss.backward(1.0f), acts);
      }
      *bytes = acts.bytes();
      return m;
    };
    int64_t none_bytes = 0, bytes = 0;
    auto none = run(Recompute::kNone, &none_bytes);
    for (Recompute mode : {Recompute::kFull, Recompute::kSelective}) {
      auto other = run(mode, &bytes);
      EXPECT_TRUE(same_bits(none->grads(), other->grads())) << name_of(spec.kind);
      // (An MLP's blocks are single layers that keep little more than their inputs.)
      if (spec.kind == ModelKind::kGpt) {
        EXPECT_LT(bytes, none_bytes) << static_cast<int>(mode);
      }
    }
  }
}

}  // namespace
}  // namespace tessel::nn
