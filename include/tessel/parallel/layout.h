// Layout: how the world's ranks are arranged, as a mesh over named axes. Training ranks form a
// grid dp x pp x tp with tp fastest: rank = (dp_index * pp + pp_index) * tp + tp_index, so a
// pipeline's tensor-parallel ranks are neighbours. With a parameter
// server the last ps.servers ranks are servers and every other rank is a worker (a dp axis of
// workers, no pipeline). zero.shard_size = k splits the dp axis in two: an inner shard axis of
// k consecutive dp ranks (e.g. one host's), within which ZeRO shards, and an outer replica axis
// of dp / k groups, across which the shards' gradients are all-reduced (hierarchical sharding);
// without it the shard axis is the whole dp axis and the replica axis one rank. Mesh adds this
// rank's communicators: one per axis (the ranks that differ from it only along that axis) and
// one over every training rank. Pure arithmetic in Layout; Mesh is collective to build (every
// rank of the world builds its own).
#pragma once

#include <memory>
#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/nn/tensor_parallel.h"
#include "tessel/parallel/spec.h"

namespace tessel::parallel {

// kShard and kReplica split kDp: dp index = replica index * shard + shard index.
enum class Axis { kDp, kPp, kTp, kShard, kReplica };

struct Coord {
  int dp = 0, pp = 0, tp = 0;
};

struct Layout {
  int world = 1;
  int dp = 1;       // data-parallel replicas (workers, with a parameter server)
  int pp = 1;       // pipeline stages
  int tp = 1;       // tensor-parallel ranks
  int servers = 0;  // parameter-server ranks
  int shard = 1;    // dp ranks per shard group (zero.shard_size; dp without it)

  // The layout of `spec` over `world` ranks: dp = (world - servers) / (pp * tp). Throws
  // InvalidArgument naming the keys when the numbers do not fit (zero.shard_size included).
  static Layout resolve(const ParallelSpec& spec, int world);

  int workers() const { return world - servers; }
  bool is_server(int rank) const { return rank >= workers(); }
  Coord coord(int rank) const;  // training ranks only
  int rank_of(const Coord& c) const;
  // "single", "dp=4", "dp=2 pp=2", "dp=4 shard=2" (2 groups of 2), "ps: 1 server x 4 workers"
  std::string str() const;
};

class Mesh {
 public:
  Mesh(comm::Communicator& world, const Layout& layout);  // collective over world
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const Layout& layout() const { return layout_; }
  int rank() const { return world_.rank(); }
  bool is_server() const { return layout_.is_server(world_.rank()); }
  Coord coord() const { return layout_.coord(world_.rank()); }  // training ranks only
  comm::Communicator& world() { return world_; }
  // The ranks that differ from this one only along `axis` (invalid on a server rank).
  comm::Communicator& group(Axis axis);
  comm::Communicator& workers() { return workers_; }  // every training rank

 private:
  comm::Communicator& world_;
  Layout layout_;
  comm::Communicator groups_[5];  // per Axis, in its order
  comm::Communicator workers_;
};

// The tensor-parallel collectives that cut layers call, over a mesh's tp communicator (which
// must outlive it); tp.sequence_parallel: `sequence`.
std::unique_ptr<nn::TensorParallel> make_tensor_parallel(comm::Communicator& tp, bool sequence);

}  // namespace tessel::parallel
