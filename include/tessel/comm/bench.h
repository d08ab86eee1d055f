// `tessel bench comm`: times collectives per algorithm and message size on the threads or mpi
// transport, out of place and in place (allreduce: in place only), verifies every result, and
// prints nccl-tests' columns: size, count, type, redop, root, then for each placement the
// median time, algorithm bandwidth (bytes / time), bus bandwidth (allreduce x 2(n-1)/n;
// reduce-scatter and allgather x (n-1)/n) and the number of wrong elements; the single-thread
// memcpy bandwidth measured in the same run heads the table. Variants are timed interleaved
// (one call of each in turn, per repeat) so that drift hits them alike. Sizes are bytes of the
// whole buffer (allreduce: the buffer; reduce-scatter: the input; allgather: the output).
// Under MPI, rank 0 prints.
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
  std::vector<Algorithm> algorithms;  // empty: ring, halving_doubling, tree, direct (+ native
                                      // on mpi); kAuto times what auto picks
  std::vector<size_t> sizes = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20};  // buffer bytes
  ElemType elem = ElemType::kF32;
  int repeats = 0;           // timed repeats per point; 0: by size (50 small .. 7 at 64 MiB)
  size_t segment_bytes = 0;  // ring segment (0: the communicator's default)
  int in_flight = 0;         // ring segments in flight (0: default)
  std::string json_path;     // also write the results as JSON here ("" = no)
};

// Runs the bench and prints a table to stdout; returns 0, or 1 when a result failed
// verification. Throws tessel::Error on bad options (e.g. backend mpi not built).
int run_comm_bench(const CommBenchOptions& options);

}  // namespace tessel::comm
