#include <cstdlib>

#include "tessel/comm/mpi.h"

namespace tessel::comm {

bool mpi_launched() {
  // OpenMPI, PMIx (srun, prterun), MPICH / Intel MPI (PMI).
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(var)) return true;
  return false;
}

}  // namespace tessel::comm
