#include "tessel/infer/generate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "tessel/core/memory.h"
#include "tessel/core/rng.h"
#include "tessel/nn/layers.h"

namespace tessel::infer {
namespace {

// The GPT's blocks by role.
struct Gpt {
  nn::Embedding* embed = nullptr;
  std::vector<nn::TransformerBlock*> blocks;
  nn::LmHead* head = nullptr;
};

Gpt gpt_of(nn::Model& model) {
  Gpt g;
  const size_t n = model.num_blocks();
  if (n >= 2) {
    g.embed = dynamic_cast<nn::Embedding*>(&model.block(0));
    g.head = dynamic_cast<nn::LmHead*>(&model.block(n - 1));
    for (size_t i = 1; i + 1 < n; ++i)
      if (auto* b = dynamic_cast<nn::TransformerBlock*>(&model.block(i))) g.blocks.push_back(b);
  }
  if (!g.embed || !g.head || g.blocks.size() + 2 != n)
    throw InvalidArgument(
        str("generate: needs a gpt model (embedding, transformer blocks, lm "
            "head), got ",
            n, " blocks starting with '", n ? model.block(0).kind() : "",
            "'; set model.kind = gpt, or state a stack of text layers (docs/models.md)"));
  return g;
}

// Rows [B, T] of token ids.
Tensor ids_tensor(const std::vector<std::vector<int32_t>>& seqs, int64_t lo, int64_t hi) {
  const int64_t B = static_cast<int64_t>(seqs.size()), T = hi - lo;
  Tensor t = Tensor::empty({B, T}, DType::kI32);
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(t.data<int32_t>() + b * T, seqs[b].data() + lo, static_cast<size_t>(T) * 4);
  return t;
}

// Position t's logits of every row of logits [B, T, V] as [B, V].
Tensor at_position(const Tensor& logits, int64_t t) {
  const int64_t B = logits.dim(0), T = logits.dim(1), V = logits.dim(2);
  Tensor out = Tensor::empty({B, V});
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(out.data<float>() + b * V, logits.data<float>() + (b * T + t) * V,
                static_cast<size_t>(V) * sizeof(float));
  return out;
}

}  // namespace

void check_prompts(const std::vector<Prompt>& prompts, int64_t context) {
  for (size_t b = 0; b < prompts.size(); ++b) {
    const int64_t len = static_cast<int64_t>(prompts[b].tokens.size());
    if (len == 0)
      throw InvalidArgument(str("generate: prompt ", b,
                                " is empty, got 0 tokens; give each "
                                "prompt at least one character"));
    if (prompts[b].max_new_tokens < 1 || len + prompts[b].max_new_tokens > context)
      throw InvalidArgument(str(
          "generate: prompt ", b, " has ", len, " tokens and asks for ", prompts[b].max_new_tokens,
          " more, got ", len + prompts[b].max_new_tokens, " positions > the model's context ",
          context, "; shorten the prompt or lower max_new_tokens"));
  }
}

int64_t gpt_context(nn::Model& model) { return gpt_of(model).embed->context(); }

Tensor forward_step(nn::Model& model, nn::KvCache& kv, const std::vector<int32_t>& tokens,
                    std::vector<nn::KvCache::Run> runs) {
  Gpt g = gpt_of(model);
  const int64_t N = static_cast<int64_t>(tokens.size()), R = static_cast<int64_t>(runs.size());
  std::vector<int64_t> positions;
  positions.reserve(tokens.size());
  for (const nn::KvCache::Run& r : runs)
    for (int64_t i = 0; i < r.rows; ++i) positions.push_back(kv.length(r.seq) + i);
  TESSEL_CHECK(static_cast<int64_t>(positions.size()) == N, "generate: a step of ", N,
               " tokens for runs of ", positions.size(), " rows");
  Tensor ids = Tensor::empty({1, N}, DType::kI32);
  std::memcpy(ids.data<int32_t>(), tokens.data(), tokens.size() * sizeof(int32_t));
  kv.set_step(std::move(runs));
  Tensor h = g.embed->forward_at(ids, positions);
  for (size_t l = 0; l < g.blocks.size(); ++l) h = g.blocks[l]->forward_cached(h, kv, l);
  // Each run's last row reaches the LM head.
  const int64_t C = h.dim(2);
  Tensor last = Tensor::empty({R, 1, C});
  int64_t row = 0;
  for (int64_t r = 0; r < R; ++r) {
    row += kv.step()[static_cast<size_t>(r)].rows;
    std::memcpy(last.data<float>() + r * C, h.data<float>() + (row - 1) * C,
                static_cast<size_t>(C) * sizeof(float));
  }
  kv.finish_step();
  return at_position(g.head->forward(last, nn::Context{false}, nullptr), 0);
}

int32_t choose_token(const float* logits, int64_t V, const SampleOptions& options, uint64_t key,
                     int64_t position) {
  if (options.temperature == 0.0f)
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  // Candidates by decreasing logit (ties: lower id first), cut to the top k.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  int64_t k = options.top_k > 0 ? std::min(options.top_k, V) : V;
  auto before = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  std::vector<double> weight(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i)
    total += weight[i] =
        std::exp((static_cast<double>(logits[order[i]]) - logits[order[0]]) / options.temperature);
  if (options.top_p < 1.0f) {  // nucleus: the fewest candidates holding top_p of the mass
    double kept = 0;
    int64_t n = 0;
    while (n < k && kept < options.top_p * total) kept += weight[n++];
    k = std::max<int64_t>(n, 1);
    total = kept > 0 ? kept : weight[0];
  }
  const CounterRng rng(options.seed,
                       mix_stream(RngPurpose::kSample, key, static_cast<uint64_t>(position)));
  double u = static_cast<double>(rng.uniform(0)) * total;
  for (int64_t i = 0; i < k; ++i) {
    if (u < weight[i]) return order[i];
    u -= weight[i];
  }
  return order[k - 1];
}

std::vector<std::vector<int32_t>> generate(nn::Model& model, const std::vector<Prompt>& prompts,
                                           const SampleOptions& options) {
  Gpt g = gpt_of(model);
  check_prompts(prompts, g.embed->context());
  const int64_t B = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int32_t>> seqs(prompts.size()), out(prompts.size());
  int64_t start = INT64_MAX, end = 0;  // positions the lockstep runs through
  for (int64_t b = 0; b < B; ++b) {
    seqs[b] = prompts[b].tokens;
    const int64_t len = static_cast<int64_t>(seqs[b].size());
    start = std::min(start, len);
    end = std::max(end, len + prompts[b].max_new_tokens);
  }
  if (B == 0) return out;
  for (auto& s : seqs) s.resize(static_cast<size_t>(end));
  MemoryScope scope(MemCategory::kActivations);
  nn::KvCache kv(g.blocks.size());
  for (int64_t b = 0; b < B; ++b) kv.add();  // sequence b
  // Positions [lo, hi) of every row through the KV cache.
  auto cached_step = [&](int64_t lo, int64_t hi) {
    std::vector<int32_t> tokens;
    std::vector<nn::KvCache::Run> runs;
    for (int64_t b = 0; b < B; ++b) {
      tokens.insert(tokens.end(), seqs[b].begin() + lo, seqs[b].begin() + hi);
      runs.push_back({b, hi - lo});
    }
    return forward_step(model, kv, tokens, std::move(runs));
  };
  // Logits of position p - 1 for every row, then the token at p, from `start` to the end.
  Tensor logits =
      options.kv_cache
          ? cached_step(0, start)
          : at_position(model.forward(ids_tensor(seqs, 0, start), {false}, nullptr), start - 1);
  for (int64_t p = start;; ++p) {
    bool more = false;
    for (int64_t b = 0; b < B; ++b) {
      const Prompt& pr = prompts[b];
      const int64_t len = static_cast<int64_t>(pr.tokens.size());
      if (p < len) continue;  // still inside its prompt: seqs[b][p] is the prompt's token
      if (p >= len + pr.max_new_tokens) continue;  // done: later positions run, unread
      const int64_t V = logits.dim(1);
      seqs[b][p] = choose_token(logits.data<float>() + b * V, V, options, pr.key, p);
      out[b].push_back(seqs[b][p]);
    }
    for (int64_t b = 0; b < B; ++b)
      more |= p + 1 < static_cast<int64_t>(prompts[b].tokens.size()) + prompts[b].max_new_tokens;
    if (!more) break;
    logits = options.kv_cache
                 ? cached_step(p, p + 1)
                 : at_position(model.forward(ids_tensor(seqs, 0, p + 1), {false}, nullptr), p);
  }
  return out;
}

namespace {

const text::Tokenizer& need(const text::Tokenizer* tokenizer) {
  if (!tokenizer)
    throw InvalidArgument(
        "generate: the model has no tokenizer (it was trained on token files without "
        "data.tokenizer), so it cannot read or write text; train with data.tokenizer set");
  return *tokenizer;
}

}  // namespace

std::vector<int32_t> encode(const std::string& text, const text::Tokenizer* tokenizer) {
  return need(tokenizer).encode(text);
}

std::string decode(const std::vector<int32_t>& tokens, const text::Tokenizer* tokenizer) {
  return need(tokenizer).decode(tokens);
}

}  // namespace tessel::infer
