// The MPI transport: one rank per process under any MPI launcher (mpirun, srun), built when
// TESSEL_WITH_MPI is on. MPI is initialised on first use with MPI_THREAD_MULTIPLE (the progress
// thread of async calls and the caller may both be inside MPI); if the library grants only
// MPI_THREAD_SERIALIZED, every MPI call is serialised by one process-wide mutex instead. Native
// collectives (Algorithm::kNative) call MPI_Allreduce and friends directly.
#pragma once

#include <string>

#include "tessel/comm/communicator.h"

namespace tessel::comm {

bool mpi_built();     // compiled with MPI support
bool mpi_launched();  // this process was started by an MPI launcher (environment variables)

// The world communicator (MPI_COMM_WORLD, duplicated). Initialises MPI on the first call and
// finalises it at exit; if a group was aborted, finalisation is bounded by a 30 s watchdog that
// aborts the job rather than hang on a dead peer. Throws CommError when MPI is not built.
Communicator mpi_world(const CommOptions& options = {});

// The MPI thread level granted ("MPI_THREAD_MULTIPLE", ...), "" before MPI_Init or after
// MPI_Finalize.
const char* mpi_thread_level();

// Ends this process after an error it cannot recover from, so that the whole MPI job ends at
// once instead of waiting out deadlines: every world (with its groups) is aborted (the other ranks
// learn of it within a heartbeat and stop with a CommError), and then this rank calls
// MPI_Abort(MPI_COMM_WORLD, exit_code), never MPI_Finalize, which would wait for the failed
// ranks. A rank whose error is a consequence of another rank's failure (mpi_failed_elsewhere)
// exits with exit_code quietly instead: that rank ends the job. Returns when MPI is not
// running or the job has one rank. Only main should call it.
void mpi_end_failed_job(const std::string& reason, int exit_code);
// Whether this process learnt of a failure from another rank's abort message before failing
// itself: its own error is then a consequence, which the other rank reports. Listens for 0.2 s
// on the control channels of the groups still open; a true answer is remembered, so call it
// once before closing the world and again when reporting.
bool mpi_failed_elsewhere();

}  // namespace tessel::comm
