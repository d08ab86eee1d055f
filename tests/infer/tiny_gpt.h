// What the generation tests share: a GPT small enough to run in milliseconds (2 blocks, 2
// heads, width 16), its weights drawn from `seed`.
#pragma once

#include <memory>

#include "tessel/nn/models.h"

namespace tessel::infer::testing {

inline std::unique_ptr<nn::Model> tiny_gpt(int64_t vocab, int64_t context, uint64_t seed) {
  nn::ModelSpec spec;
  spec.kind = nn::ModelKind::kGpt;
  spec.input_shape = {context};
  spec.num_classes = vocab;
  spec.layers = 2;
  spec.heads = 2;
  spec.embed = 16;
  auto model = nn::build_model(spec);
  model->materialize(seed);
  return model;
}

}  // namespace tessel::infer::testing
