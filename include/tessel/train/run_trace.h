// RunTrace: train.trace for one rank of a run. It owns the rank's Tracer (core/trace.h), which
// records the steps of the trace.steps window; at the start it measures how far each rank's
// clock is from rank 0's (round trips of messages, the fastest of several; ranks on rank 0's
// host share its clock and get offset 0); at the end rank 0
// gathers every rank's events and writes the run folder's trace.json in Trace Event Format
// (Perfetto and chrome://tracing open it): one process per rank, its threads as rows, every
// time on rank 0's clock. Used by the rank's thread; the tracer by every thread of the rank.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/core/trace.h"

namespace tessel::train {

class RunTrace {
 public:
  // window: trace.steps; process: this rank's title in the trace ("rank 1 (dp 0, pp 1)").
  RunTrace(const std::string& window, std::string process);
  Tracer* tracer() { return &tracer_; }

  // Collective over world (rank 0 exchanges messages with each rank in turn): measures every
  // clock's offset to rank 0's and tells each rank where rank 0's time origin lies on its clock.
  void align(comm::Communicator& world);
  // Collective over world: every rank sends its events to rank 0, which writes `path` with
  // `meta` (and the clock offsets) under otherData.
  void write(comm::Communicator& world, const std::string& path, nlohmann::json meta);

 private:
  Tracer tracer_;
  std::string process_;
  double origin_ = 0;  // rank 0's time origin, on this rank's clock
  // Rank 0: every rank's clock minus rank 0's as applied (0 on rank 0's host), its uncertainty,
  // and as measured by round trips.
  std::vector<double> offset_s_, uncertainty_s_, measured_s_;
};

}  // namespace tessel::train
