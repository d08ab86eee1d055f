// The planner on paper: a GPT of 1.5B-175B parameters on 8-1024 ranks, given each rank's memory,
// compute rate and links. The same state table as plan.h (engine_state_terms, state_bytes) and
// the schedule's bubble_model; activations from Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", Table 2), compute from the model's flops
// (6 x parameters x tokens per step, 8 x with full recompute). Nothing is measured here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessel/train/plan.h"

namespace tessel::train {

struct GptShape {
  int64_t layers = 0, hidden = 0, heads = 0, seq = 2048, vocab = 50257;
};
// GPT-2 1.5B and the GPT-3 family's sizes: "1.5b", "2.7b", "6.7b", "13b", "175b".
GptShape gpt_preset(const std::string& name);
// 12 L h^2 + 13 L h (blocks) + (V + s) h (token and position tables; the head is tied).
double gpt_parameters(const GptShape& g);

// Bytes of activations one transformer layer keeps for the backward pass of b sequences in
// 16-bit precision (Korthikanti et al. Table 2): s b h (34 + 5 a s / h) without parallelism,
// s b h (10 + 24 / t + 5 a s / (h t)) with t-way tensor parallelism, s b h / t (34 + 5 a s / h)
// with sequence parallelism too; selective recompute drops the 5 a s / h attention terms,
// full recompute keeps the layer's input (2 s b h / t with sequence parallelism, else 2 s b h).
double layer_activation_bytes(const GptShape& g, int64_t b, int tp, bool sequence,
                              const std::string& recompute);

struct ScaleOptions {
  int workers = 8;
  int ranks_per_host = 8;          // tp stays within a host
  int64_t memory_per_rank = 0;     // bytes (0: no cap)
  int64_t global_batch = 512;      // sequences per step
  int64_t micro_batch = 1;         // sequences per micro-batch
  double flops_per_rank = 150e12;  // sustained 16-bit FLOP/s
  double bandwidth = 25e9;         // bytes/s between hosts (per rank)
  double latency = 5e-6;
  double host_bandwidth = 150e9;  // bytes/s within a host (tp, pp neighbours)
};

// Every layout (dp x pp x tp, zero 0-3, recompute; sequence parallelism with tp) of
// options.workers ranks for `g` in bf16 with AdamW, ranked as plan_layouts ranks.
std::vector<Candidate> plan_gpt(const GptShape& g, const ScaleOptions& options);

}  // namespace tessel::train
