// Text generation with a GPT model (embedding, transformer blocks, tied LM head): a batch of
// prompts advances in lockstep, one position per step, from the shortest prompt's length on; a
// sequence still inside its prompt takes its next prompt token, the others a token chosen from
// the last position's logits. With the KV cache each block keeps the keys and values of every
// position seen (nn::KvCache, paged) and a step runs the new position only; without it every step
// recomputes the whole sequence. Both do the same arithmetic for a position's row, so greedy
// decoding gives the same tokens. Tokens are chosen greedily (temperature 0) or sampled at a
// temperature among the top k (and top p), from a counter-based stream keyed by (seed, prompt key,
// position): the same tokens whatever the batch, worker or rank. No activation caches are kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/nn/model.h"
#include "tessel/text/tokenizer.h"

namespace tessel::infer {

struct SampleOptions {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // sample among the k most likely tokens (0: all)
  uint64_t seed = 0;
  bool kv_cache = true;
  float top_p = 1.0f;  // then among the fewest most likely holding this share of the mass
};

struct Prompt {
  std::vector<int32_t> tokens;  // at least one
  int64_t max_new_tokens = 1;
  uint64_t key = 0;  // the prompt's sampling stream: its global row, or a request's seed
};

// The new tokens of every prompt (max_new_tokens each). Throws InvalidArgument naming the prompt
// when it is empty or prompt + new tokens pass the model's context, or the model is no GPT.
std::vector<std::vector<int32_t>> generate(nn::Model& model, const std::vector<Prompt>& prompts,
                                           const SampleOptions& options);

// The context of a GPT model (its longest sequence); throws InvalidArgument for another model.
int64_t gpt_context(nn::Model& model);
// Throws InvalidArgument naming the prompt when it is empty or prompt + new tokens pass context.
void check_prompts(const std::vector<Prompt>& prompts, int64_t context);

// One step of decoding over a KV cache: `tokens` are the step's rows, runs of them continuing
// kv's sequences in the order of `runs`. Returns the logits [runs, V] of each run's last row
// (only those reach the LM head) and advances the sequences' lengths.
Tensor forward_step(nn::Model& model, nn::KvCache& kv, const std::vector<int32_t>& tokens,
                    std::vector<nn::KvCache::Run> runs);

// The token chosen from one position's logits[V] (greedy or sampled; see above).
int32_t choose_token(const float* logits, int64_t V, const SampleOptions& options, uint64_t key,
                     int64_t position);

// Text <-> token ids through the model's tokenizer (its checkpoint's: char-level bytes or BPE).
// Throws InvalidArgument when the model has none (trained on token files without
// data.tokenizer) or the tokenizer cannot encode the text.
std::vector<int32_t> encode(const std::string& text, const text::Tokenizer* tokenizer);
std::string decode(const std::vector<int32_t>& tokens, const text::Tokenizer* tokenizer);

}  // namespace tessel::infer
