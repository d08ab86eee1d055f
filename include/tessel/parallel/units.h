// Units: the parameter arena of the blocks this rank runs, cut into contiguous runs of whole
// blocks of about ddp.bucket_mb each, built from the last block backwards (the backward pass
// finishes the last blocks first). A unit is the one grain every parallel part works in:
//   - a gradient bucket: its reduction starts once the backward pass is done with it;
//   - a ZeRO-3 gather: its parameters are all-gathered before a block that reads them runs;
//   - sharded: each rank r of the dp group owns one shard of it (shard r of P, cut on 64-byte
//     lines), whose optimizer state it keeps (ZeRO >= 1), whose reduced gradient it gets
//     (reduce-scatter), whose values it writes into a checkpoint.
// Cutting every unit over the dp ranks, rather than the arena into P contiguous shards, keeps
// every reduce-scatter and all-gather evenly split among the ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "tessel/nn/model.h"

namespace tessel::parallel {

struct Unit {
  nn::Range range;                         // arena elements
  size_t first_block = 0, last_block = 0;  // blocks [first, last] whose own parameters it holds
  size_t first_user = 0, last_user = 0;    // the lowest and highest local block reading it
  std::vector<size_t> counts;              // elements of dp rank r's shard, r = 0..P-1
  int64_t shard_offset = 0;                // this rank's shard in its shard buffer

  nn::Range shard(int r) const;
};

struct Units {
  std::vector<Unit> list;                       // in model order
  std::vector<std::vector<int>> used_by_block;  // units each local block reads (model order)
  int dp = 1, dp_rank = 0;
  nn::Range span;           // from the first unit's start to the last one's end
  int64_t shard_numel = 0;  // this rank's shards of every unit, packed: its shard buffer
  // Arena ranges of tensor-parallel replicas (nn::Split::replica): values every rank of a tp
  // group holds and that count once, on the group's rank 0.
  std::vector<nn::Range> replicas;

  nn::Range own(const Unit& u) const { return u.shard(dp_rank); }
  // Units whose gradient is complete once local block b's backward is done (last pass).
  std::vector<int> completed_by(size_t b) const;
  std::string describe(int unit, const nn::Model& model) const;  // "unit 2 (blocks fc2..fc3)"
};

// The sum of squares of g (arena range r's values) without the replicas' elements: each
// element of the model counted once over the tp group. Without replicas in r: one
// optim::sum_squares over all of it.
double sum_squares_counted(const Units& units, nn::Range r, const float* g);

// Units over the blocks marked in `local` (all when empty), cut for a dp group of `dp` ranks
// seen from `dp_rank`. A unit never spans a block that is not local.
Units make_units(const nn::Model& model, double bucket_mb, const std::vector<bool>& local, int dp,
                 int dp_rank);

}  // namespace tessel::parallel
