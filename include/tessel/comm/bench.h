// `tessel bench comm`: times collectives per algorithm and message size on the threads or mpi
// transport, verifies every result, and prints median time, algorithm bandwidth (bytes / time)
// and bus bandwidth (allreduce x 2(n-1)/n; reduce-scatter and allgather x (n-1)/n) next to the
// single-thread memcpy bandwidth measured in the same run. Under MPI, rank 0 prints.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tessel/comm/types.h"

namespace tessel::comm {

struct CommBenchOptions {
  std::string backend = "threads";  // "threads" or "mpi" (then the launcher sets the world)
  int workers = 2;                  // threads backend: world size
  std::vector<std::string> collectives = {"allreduce"};  // allreduce, reduce_scatter, allgather
  std::vector<Algorithm> algorithms = {Algorithm::kRing, Algorithm::kHalvingDoubling,
                                       Algorithm::kTree, Algorithm::kDirect};  // + kNative (mpi)
  std::vector<size_t> sizes = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};  // bytes/rank
  ElemType elem = ElemType::kF32;
  int repeats = 0;           // timed repeats per point; 0: by size (50 small .. 5 at 64 MiB)
  std::string json_path;     // also write the results as JSON here ("" = no)
  bool verbose = false;
};

// Runs the bench and prints a table to stdout; returns 0, or 1 when a result failed
// verification. Throws tessel::Error on bad options (e.g. backend mpi not built).
int run_comm_bench(const CommBenchOptions& options);

}  // namespace tessel::comm
