// Pipeline schedules over a partition of a model's blocks into chunks: every stage's order of
// forward and backward tasks, and the check, before anything runs, that the messages of a
// schedule pair up and cannot deadlock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessel::parallel {

// Chunk c holds blocks [begin[c], begin[c + 1]) and runs on stage stage[c]. Chunks are in model
// order; begin.back() is the number of blocks.
struct Partition {
  std::vector<size_t> begin;
  std::vector<int> stage;
  size_t chunks() const { return stage.size(); }
};

enum class TaskOp : uint8_t { kForward, kBackward };
struct Task {
  TaskOp op;
  int chunk;
  int micro;
};

// Every stage's task order for `micro` micro-batches: "gpipe" (all forwards, then all
// backwards), "1f1b" (backward first whenever one is ready; at most min(m, chunks after the
// stage's first chunk) micro-batches in flight), or "forward" (evaluation). The orders come from
// a simulation of the schedule in unit time (forward 1, backward 2 per chunk), so each stage's
// order is consistent with one global execution order: blocking receives cannot deadlock.
// "interleaved" is Megatron-LM's interleaved 1F1B over v >= 2 chunks per stage (chunk c on
// stage c mod P; throws InvalidArgument for another partition, and for m > P not a multiple of
// P, whose short last group can deadlock), built directly from its rule.
std::vector<std::vector<Task>> make_schedule(const Partition& part, int stages, int micro,
                                             const std::string& kind);

// Checks a schedule before it runs: every message (activation, activation gradient, tied-table
// gradient from chunk tied_from to tied_to; -1: none) is sent and received once, in the same
// order at both ends, and the schedule completes with non-blocking sends and blocking receives.
// Throws Error naming the stage and message otherwise.
void check_schedule(const Partition& part, const std::vector<std::vector<Task>>& schedule,
                    int micro, int tied_from, int tied_to);

// The bubble fraction (idle / schedule time) of a schedule with equal stages in theory:
// (P - 1) / (m + P - 1) for gpipe and 1f1b, (P - 1) / (v m + P - 1) for interleaved with
// m >= P (with m < P: (v (P - m) + m - 1) / (v P + m - 1), the same as 1f1b's at m = 1).
double bubble_model(const std::string& kind, int stages, int micro, int virtual_stages);

// One stage's order for people: "F0 F1 B0 ...", with "/chunk" after each task when the stages
// hold several chunks.
std::string order_str(const Partition& part, int stages, const std::vector<Task>& order);

}  // namespace tessel::parallel
