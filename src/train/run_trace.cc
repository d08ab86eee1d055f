#include "tessel/train/run_trace.h"

#include <algorithm>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/config/config.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/train/run_folder.h"

namespace tessel::train {

namespace {

constexpr int kTag = 7001;  // point-to-point tag of the trace's messages on the world
constexpr int kRounds = 8;  // round trips per rank; the fastest gives the offset

}  // namespace

RunTrace::RunTrace(const std::string& window, std::string process) : process_(std::move(process)) {
  const auto [first, end] = parse_step_window(window);
  tracer_.set_window(first, end);
}

// Cristian's algorithm: rank 0 sends at t0, rank k answers with its clock tk, rank 0 receives
// at t1; tk - (t0 + t1) / 2 is k's offset, off by at most (t1 - t0) / 2. Ranks on rank 0's host
// read the same clock (steady_clock is the host's CLOCK_MONOTONIC): their offset is 0 exactly,
// and the measurement is kept only to show its error.
void RunTrace::align(comm::Communicator& world) {
  const int n = world.size(), me = world.rank();
  if (me == 0) {
    origin_ = now_seconds();
    offset_s_.assign(static_cast<size_t>(n), 0.0);
    uncertainty_s_.assign(static_cast<size_t>(n), 0.0);
    measured_s_.assign(static_cast<size_t>(n), 0.0);
    const std::string host = host_name();
    for (int k = 1; k < n; ++k) {
      int64_t bytes = 0;
      world.recv(&bytes, 1, comm::ElemType::kI64, k, kTag);
      std::string theirs(static_cast<size_t>(bytes), '\0');
      world.recv(theirs.data(), theirs.size(), comm::ElemType::kU8, k, kTag);
      double best = 1e30, offset = 0;
      for (int round = 0; round < kRounds; ++round) {
        double tk = 0;
        const double t0 = now_seconds();
        world.send(&t0, 1, comm::ElemType::kF64, k, kTag);
        world.recv(&tk, 1, comm::ElemType::kF64, k, kTag);
        const double t1 = now_seconds();
        if (t1 - t0 < best) best = t1 - t0, offset = tk - (t0 + t1) / 2;
      }
      const size_t i = static_cast<size_t>(k);
      measured_s_[i] = offset;
      if (theirs != host) offset_s_[i] = offset, uncertainty_s_[i] = best / 2;
      const double origin_k = origin_ + offset_s_[i];
      world.send(&origin_k, 1, comm::ElemType::kF64, k, kTag);
    }
    return;
  }
  const std::string host = host_name();
  const int64_t bytes = static_cast<int64_t>(host.size());
  world.send(&bytes, 1, comm::ElemType::kI64, 0, kTag);
  world.send(host.data(), host.size(), comm::ElemType::kU8, 0, kTag);
  for (int round = 0; round < kRounds; ++round) {
    double ping = 0;
    world.recv(&ping, 1, comm::ElemType::kF64, 0, kTag);
    const double tk = now_seconds();
    world.send(&tk, 1, comm::ElemType::kF64, 0, kTag);
  }
  world.recv(&origin_, 1, comm::ElemType::kF64, 0, kTag);
}

void RunTrace::write(comm::Communicator& world, const std::string& path, nlohmann::json meta) {
  const int me = world.rank();
  const std::string head =
      str("{\"ph\":\"M\",\"pid\":", me,
          ",\"name\":\"process_name\",\"args\":{\"name\":", json_escape(process_),
          "}},\n{\"ph\":\"M\",\"pid\":", me,
          ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":", me, "}}");
  const std::string events = tracer_.render(me, origin_);
  std::string mine = events.empty() ? head : head + ",\n" + events;
  if (me != 0) {
    int64_t bytes = static_cast<int64_t>(mine.size());
    world.send(&bytes, 1, comm::ElemType::kI64, 0, kTag);
    world.send(mine.data(), mine.size(), comm::ElemType::kU8, 0, kTag);
    return;
  }
  std::string out = "{\"traceEvents\":[\n" + mine;
  for (int k = 1; k < world.size(); ++k) {
    int64_t bytes = 0;
    world.recv(&bytes, 1, comm::ElemType::kI64, k, kTag);
    std::string theirs(static_cast<size_t>(bytes), '\0');
    world.recv(theirs.data(), theirs.size(), comm::ElemType::kU8, k, kTag);
    out += ",\n" + theirs;
  }
  std::vector<double> offset_us, uncertainty_us, measured_us;
  for (size_t k = 0; k < offset_s_.size(); ++k) {
    offset_us.push_back(offset_s_[k] * 1e6);
    uncertainty_us.push_back(uncertainty_s_[k] * 1e6);
    measured_us.push_back(measured_s_[k] * 1e6);
  }
  meta["clock_offset_us"] = offset_us;  // applied: ranks on rank 0's host share its clock
  meta["clock_uncertainty_us"] = uncertainty_us;
  meta["clock_offset_measured_us"] = measured_us;
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":" + meta.dump() + "}\n";
  ckpt::write_file_atomic(path, out);
}

}  // namespace tessel::train
