// The floor of the MPI files (what the rest of src/comm/mpi builds on): error conversion, the
// call lock used when MPI grants less than MPI_THREAD_MULTIPLE, and the datatype/op mapping.
// Callers hold a communicator, so MPI is initialised (mpi_world). Internal to the comm area.
#pragma once

#include <mpi.h>

#include <mutex>

#include "tessel/comm/types.h"

namespace tessel::comm::mpi_detail {

// The one place MPI error codes become exceptions (CommError naming the call).
void check(int rc, const char* call);

bool thread_multiple();  // MPI granted MPI_THREAD_MULTIPLE
int tag_upper_bound();   // MPI_TAG_UB of the world

// Holds the process-wide MPI lock when MPI granted only MPI_THREAD_SERIALIZED; a no-op with
// MPI_THREAD_MULTIPLE.
class Guard {
 public:
  Guard();

 private:
  std::unique_lock<std::mutex> lock_;
};

MPI_Datatype datatype(ElemType e);
MPI_Op reduce_op(ElemType e, ReduceOp op);  // kAvg maps to a sum

}  // namespace tessel::comm::mpi_detail
