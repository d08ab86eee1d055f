// Built when TESSEL_WITH_MPI is off: the MPI entry points exist and say how to get MPI.
#include "tessel/comm/mpi.h"
#include "tessel/core/error.h"

namespace tessel::comm {

bool mpi_built() { return false; }

const char* mpi_thread_level() { return ""; }

void mpi_end_failed_job(const std::string&, int) {}

bool mpi_failed_elsewhere() { return false; }

Communicator mpi_world(const CommOptions&) {
  throw CommError(
      "comm: this build has no MPI transport (TESSEL_WITH_MPI=OFF); install "
      "libopenmpi-dev and reconfigure with -DTESSEL_WITH_MPI=ON, or use the threads "
      "backend");
}

}  // namespace tessel::comm
