// `tessel launch`: a thin supervisor over mpirun, in the spirit of torchrun's restarts (OpenMPI
// stays the engine that starts and connects the ranks). It runs
//   mpirun -np N [--hostfile F] <this tessel> train CONFIG [options]
// and, when the job fails (a rank killed, a host lost, a rank stalled past comm.timeout_s),
// starts it again from the newest checkpoint of its run folder, up to --max-restarts times. With
// --hostfile the hostfile is read again before every start, so that a host taken out of it
// (by the operator or the scheduler) is not used: the job restarts on fewer ranks, down to
// --min-np, resharded from the layout-free checkpoint (in deterministic mode the results are
// the same). SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 stop the job gracefully: they reach the
// ranks as SIGUSR1, which mpirun forwards without killing them after a second, and each rank
// checkpoints at its next step boundary; the launcher then exits 130 (SIGINT) or 143.
#pragma once

#include <string>
#include <vector>

namespace tessel::app {

// args: everything after `tessel launch`. Returns the exit code.
int run_launch(const std::vector<std::string>& args);

}  // namespace tessel::app
