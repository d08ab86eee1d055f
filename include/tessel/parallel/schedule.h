// Pipeline schedules over a partition of a model's blocks into chunks: every stage's order of
// forward and backward tasks, and the check, before anything runs, that the messages of a
// schedule pair up and cannot deadlock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tessel/parallel/spec.h"

namespace tessel::parallel {

// Chunk c holds blocks [begin[c], begin[c + 1]) and runs on stage stage[c]. Chunks are in model
// order; begin.back() is the number of blocks.
struct Partition {
  std::vector<size_t> begin;
  std::vector<int> stage;
  size_t chunks() const { return stage.size(); }
};

// kBackward is the whole backward, or under zb-h1 its input-gradient half (B); kWeight is the
// weight-gradient half (W, Module::backward_weights): no messages, and the micro-batch's
// activations stay until it has run.
enum class TaskOp : uint8_t { kForward, kBackward, kWeight };
struct Task {
  TaskOp op;
  int chunk;
  int micro;
};

// Every stage's training task order for `micro` micro-batches: gpipe (all forwards, then all
// backwards), 1f1b (backward first whenever one is ready; at most min(m, chunks after the
// stage's first chunk) micro-batches in flight). The orders come from
// a simulation of the schedule in unit time (forward 1, backward 2 per chunk), so each stage's
// order is consistent with one global execution order: blocking receives cannot deadlock.
// interleaved is Megatron-LM's interleaved 1F1B over v >= 2 chunks per stage (chunk c on
// stage c mod P; throws InvalidArgument for another partition, and for m > P not a multiple of
// P, whose short last group can deadlock), built directly from its rule. zb-h1 is the
// zero-bubble schedule ZB-H1 (Qi et al. 2023; PyTorch's ZB1P) over one chunk per stage: stage s
// warms up with min(m, P - 1 - s) forwards like 1f1b, then runs F, B and -- from its (s + 1)-th
// B on -- the W of its oldest pending micro-batch, then the remaining Bs (each with its W
// likewise) and Ws. The delayed Ws fill the drain: the bubble is about a third of 1f1b's, with
// at most min(m, P) micro-batches holding activations on every stage (1f1b's stage 0).
std::vector<std::vector<Task>> make_schedule(const Partition& part, int stages, int micro,
                                             PpSchedule kind);
// Evaluation: every stage's forwards, from the same simulation.
std::vector<std::vector<Task>> forward_schedule(const Partition& part, int stages, int micro);

// Activation sets (chunk, micro-batch) a training schedule holds at most on each stage, from
// a forward until its backward (and its W): gpipe m x the stage's chunks, 1f1b min(m, chunks
// from the stage's first on) x the stage's chunks, interleaved min(v m, warm-up + 1), zb-h1
// min(m, P).
std::vector<int> inflight_bound(const Partition& part, int stages, int micro, PpSchedule kind);

// Checks a schedule before it runs: every task once (with a W for every B when any stage has
// one, after it), every message (activation, activation gradient, tied-table gradient from
// chunk tied_from to tied_to; -1: none) sent and received once, in the same order at both ends,
// and the schedule completes with non-blocking sends and blocking receives; with `bound` (one
// per stage), no stage holds more activation sets than its bound. The tied-table gradient
// travels per micro-batch from B to B, or, with W tasks, once from the head's last W to the
// embedding's last W. Throws Error naming the stage and message otherwise.
void check_schedule(const Partition& part, const std::vector<std::vector<Task>>& schedule,
                    int micro, int tied_from, int tied_to, const std::vector<int>& bound = {});

// The bubble fraction (idle / schedule time) of a schedule with equal stages in theory:
// (P - 1) / (m + P - 1) for gpipe and 1f1b, (P - 1) / (v m + P - 1) for interleaved with
// m >= P (with m < P: (v (P - m) + m - 1) / (v P + m - 1), the same as 1f1b's at m = 1);
// zb-h1 with F, B and W of equal time (a backward of 2 forwards split in halves):
// (P - 1) / (3 m + P - 1) for m >= P, (2 P - m - 1) / (2 P + 2 m - 1) for m < P.
double bubble_model(PpSchedule kind, int stages, int micro, int virtual_stages);

// One stage's order for people: "F0 F1 B0 W0 ...", with "/chunk" after each task when the
// stages hold several chunks.
std::string order_str(const Partition& part, int stages, const std::vector<Task>& order);

}  // namespace tessel::parallel
