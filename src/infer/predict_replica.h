// Private to src/infer: what the threads and MPI drivers of predict build on -- the run's
// setup, where a replica's chunks come from and its outputs go (ChunkIo), and the loop every
// rank runs (predict_replica.cc). The drivers are above it: predict.cc (threads, and the entry
// point) and predict_mpi.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/infer/chunk_queue.h"
#include "tessel/infer/ordered_writer.h"
#include "tessel/infer/output.h"
#include "tessel/infer/predict.h"
#include "tessel/infer/replica.h"
#include "tessel/parallel/layout.h"

namespace tessel::infer::detail {

// What a predict run does: the config and options, and what they resolve to.
struct PredictSetup {
  const train::Config& config;
  PredictOptions options;
  ModelInfo info;
  OutputFormat format;
  parallel::ParallelSpec spec;  // the inference layout: dp x pp x tp
  nlohmann::json identity;      // what the progress file must match on --resume
};

// A replica's source of chunks (its first stage) and sink of outputs (its last stage), one per
// rank. sleep() and die() are how the driver's rank sleeps and dies, for faulty_chunk_io().
class ChunkIo {
 public:
  virtual ~ChunkIo() = default;
  virtual bool take(Chunk& chunk) = 0;
  virtual void finish(int64_t id, std::string bytes, int64_t rows) = 0;
  virtual void sleep(double seconds) = 0;
  virtual void die(const std::string& why) = 0;
  // Before each chunk this rank runs, `done` chunks after its first (optional: nothing).
  virtual void before_chunk(int64_t done) { (void)done; }
};

// Fault injection: `io` of rank `rank` wrapped so that it sleeps debug.delay_ms before every
// chunk (debug.slow_rank) or dies after debug.kill_after chunks (debug.kill_rank); null when
// neither names this rank.
std::unique_ptr<ChunkIo> faulty_chunk_io(ChunkIo& io, const train::Config& config, int rank);

// The replica index, pipeline and tensor-parallel group of this rank (null: none). The lead
// (tp rank 0) of a replica's first stage takes its chunks from its ChunkIo, that of its last stage
// hands their outputs over.
struct RankInReplica {
  int replica = 0;
  comm::Communicator* pp = nullptr;
  comm::Communicator* tp = nullptr;
  bool lead() const { return tp == nullptr || tp->rank() == 0; }
};
RankInReplica rank_in_replica(parallel::Mesh& mesh);

// This rank's loop: chunks from `io` through the replica until it has no more; a
// replica's ranks agree on each chunk (over tp, then pp) and the first stage's tensor-parallel
// ranks get its rows from their lead. Returns the chunks this rank ran.
int64_t run_replica(const PredictSetup& setup, Replica& replica, ChunkIo& io,
                    const RankInReplica& place);

// A finished run's figures into its summary (both drivers): the rows and chunks written, this
// run's rows over `seconds`, each rank's chunks and peak bytes, the process's huge pages.
void add_run_figures(nlohmann::json& summary, const OrderedWriter& writer, int64_t first_rows,
                     double seconds, const std::vector<int64_t>& chunks,
                     const std::vector<int64_t>& peak_bytes);

}  // namespace tessel::infer::detail
