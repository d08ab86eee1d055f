// Hugging Face's GPT-2 layout for a tessel GPT, both ways. A folder of
//   model.safetensors  the parameters under GPT-2's names (transformer.wte.weight, ...,
//                      transformer.h.{i}.attn.c_attn.weight, ..., transformer.ln_f.bias), f32;
//                      GPT-2's Conv1D weights are [in, out], tessel's Linear weights [out, in]
//   config.json        GPT2Config: sizes, activation_function "gelu_new" (the tanh GELU),
//                      layer_norm_epsilon 1e-5, tied word embeddings
//   vocab.json, merges.txt   the tokenizer, as GPT2Tokenizer reads it (text/bpe.h gpt2_files)
// is what transformers' GPT2LMHeadModel.from_pretrained and GPT2Tokenizer load. tessel's GPT is
// GPT-2's architecture (pre-LN blocks, learned positions, fused qkv in q, k, v order, tied head),
// so the conversion moves and transposes tensors and never changes a value.
#pragma once

#include <cstdint>
#include <string>

namespace tessel::ckpt {

// The sizes of a GPT: what a run's config says (model.layers, heads, embed), its context
// (data.context) and vocabulary.
struct GptSizes {
  int64_t layers = 0, heads = 0, embed = 0, context = 0, vocab = 0;
};

// Writes the GPT checkpoint at `path` (a run, checkpoints or step folder) into the folder
// out_dir (created; files in it replaced) in GPT-2's layout, with the tokenizer when the
// checkpoint has one. `heads` is the run's model.heads (the parameters do not tell it). Throws
// InvalidArgument when the model is not a classic GPT (another kind, other parameters).
void export_hf(const std::string& path, int64_t heads, const std::string& out_dir);

// Reads a GPT-2 folder (config.json, model.safetensors in f32, f16 or bf16, and vocab.json +
// merges.txt when present) into a checkpoint of step 0 in run_dir/checkpoints and returns the
// model's sizes, which the caller writes into the run's config. Throws IoError naming the file
// and InvalidArgument naming the config.json field when tessel's GPT cannot express the model
// (another activation, untied head, n_inner other than 4 n_embd, ...).
GptSizes import_hf(const std::string& hf_dir, const std::string& run_dir);

}  // namespace tessel::ckpt
