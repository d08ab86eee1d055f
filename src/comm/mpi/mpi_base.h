// Internals shared by the MPI transport files: error conversion, the call lock used when MPI
// grants less than MPI_THREAD_MULTIPLE, the watchdog that bounds uninterruptible MPI calls,
// and datatype/op mapping. Internal to the comm area.
#pragma once

#include <mpi.h>

#include <memory>
#include <mutex>
#include <string>

#include "../wait.h"
#include "tessel/comm/communicator.h"
#include "tessel/comm/transport.h"

namespace tessel::comm::mpi_detail {

// The one place MPI error codes become exceptions (CommError naming the call).
void check(int rc, const char* call);

// Initialises MPI once (MPI_THREAD_MULTIPLE requested; a rank that does not join within
// timeout_s ends the job) and registers finalisation at exit.
void ensure_initialized(double timeout_s);
bool thread_multiple();
int tag_upper_bound();

// Holds the process-wide MPI lock when MPI granted only MPI_THREAD_SERIALIZED; a no-op with
// MPI_THREAD_MULTIPLE.
class Guard {
 public:
  Guard();

 private:
  std::unique_lock<std::mutex> lock_;
};

// Bounds a blocking MPI call that cannot be interrupted: if it is still armed at its deadline,
// the job ends (mpi_end_failed_job, exit code 1) after logging `what` and the rank that stopped
// making progress.
class WatchdogArm {
 public:
  WatchdogArm(Deadline deadline, std::string what);
  ~WatchdogArm();
  WatchdogArm(const WatchdogArm&) = delete;
  WatchdogArm& operator=(const WatchdogArm&) = delete;

 private:
  uint64_t id_;
};

MPI_Datatype datatype(ElemType e);
MPI_Op reduce_op(ElemType e, ReduceOp op);  // kAvg maps to a sum

// The world transport over a duplicate of MPI_COMM_WORLD.
// timeout_s bounds the blocking MPI calls of the world and its groups (splits, windows).
std::unique_ptr<Transport> make_world_transport(const WaitPolicy& policy, double timeout_s);

}  // namespace tessel::comm::mpi_detail
