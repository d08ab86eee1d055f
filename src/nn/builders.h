// What the model builders share (models.cc's gpt, sequential.cc's stack of text layers): the
// checks of a token model's sizes against the data and the tensor-parallel group, each message
// naming the keys (TextKeys) that set the size at fault.
#pragma once

#include <cstdint>
#include <string>

#include "tessel/nn/models.h"

namespace tessel::nn {

// The keys that set a token model's width, a block's heads and the number of blocks, as
// messages name them: "model.embed", "model.heads", "model.layers" for a gpt.
struct TextKeys {
  std::string embed, heads, layers;
};

// The input must be token ids [T] (the context); `what` names the model or layer.
void check_token_input(const ModelSpec& spec, const std::string& what);
// Sizes that fit in 64 bits, the context split by sequence parallelism, SwiGLU's hidden width
// split by tp, for `layers` blocks of width `embed` over spec's context and vocabulary.
void check_text_sizes(const ModelSpec& spec, int64_t embed, int64_t layers, const TextKeys& keys,
                      TensorParallel* tp);
// One block's heads: dividing embed, an even head size for rotary positions, split by tp.
void check_heads(const ModelSpec& spec, int64_t embed, int64_t heads, const TextKeys& keys,
                 TensorParallel* tp);
// The parts of the blocks (model.norm, model.position, model.mlp).
inline GptVariant gpt_variant(const ModelSpec& spec) {
  return {spec.norm, spec.position, spec.mlp};
}

// The layer types of a stack of text layers: embedding, transformer, lm_head.
bool is_text_layer(const std::string& type);

}  // namespace tessel::nn
