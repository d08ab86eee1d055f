// Private to src/infer: what the threads and MPI drivers of predict share -- the job, where a
// replica's chunks come from and its outputs go (Feed), and the loop every rank runs.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/infer/chunk_queue.h"
#include "tessel/infer/output.h"
#include "tessel/infer/predict.h"
#include "tessel/infer/replica.h"
#include "tessel/parallel/layout.h"

namespace tessel::infer::detail {

struct Job {
  const train::Config& config;
  PredictOptions options;
  ModelInfo info;
  OutputFormat format;
  parallel::ParallelSpec spec;  // the inference layout: pp only
  nlohmann::json identity;      // what the progress file must match on --resume
};

// A replica's source of chunks (its first stage) and sink of outputs (its last stage).
class Feed {
 public:
  virtual ~Feed() = default;
  virtual bool take(Chunk& chunk) = 0;
  virtual void finish(int64_t id, std::string bytes, int64_t rows) = 0;
  virtual void sleep(double seconds) = 0;        // debug.delay_ms
  virtual void die(const std::string& why) = 0;  // debug.kill_rank
};

// This rank's loop: chunks from the feed through the replica (a pipeline's stages agree on
// each chunk over pp) until the feed has no more. Returns the chunks this rank ran.
int64_t run_replica(const Job& job, Replica& replica, Feed& feed, comm::Communicator* pp, int rank);

// The replica index and pipeline of this rank (pp null without a pipeline).
struct Place {
  int replica = 0;
  comm::Communicator* pp = nullptr;
};
Place place_of(parallel::Mesh& mesh);

// The MPI driver (predict_mpi.cc).
nlohmann::json predict_mpi(const Job& job);

}  // namespace tessel::infer::detail
