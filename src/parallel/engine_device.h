// A device rank's GPU and the collectives its gradient buckets run on device memory
// (comm/nccl.h's DeviceCollectives). A rank takes GPU (its rank on the host mod the GPUs it
// sees): a rank that is a thread sets it on its thread, an MPI process on its one thread; ranks
// share a GPU only when there are more of them than GPUs. The collectives are NCCL's where the
// installed NcclApi can hold this group's ranks (one per GPU, or NCCL 2.30+ sharing one), else
// copies through the host (comm/staged_collectives.h), which any number of ranks on one GPU can
// run. docs/nccl.md. Internal to the parallel area; built by the Engine.
#pragma once

#include <memory>
#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"

namespace tessel::parallel {

// Where a rank's device work runs.
struct DevicePlacement {
  int device = 0;  // the GPU index
  // The host has more ranks than GPUs, so some share one: every rank of the host says the
  // same, so that a group's ranks all choose the same collectives.
  bool shared = false;
};

// Collective-free. Places this rank (`world`: every rank of the job) on GPU (its rank on the
// host mod the GPUs the installed NcclApi counts; the rank for threads, OMPI_COMM_WORLD_LOCAL_RANK
// under MPI) and makes that GPU this thread's current device: call on the rank's thread before
// anything is allocated on the device (the caching pool hands out the current GPU's memory).
// Without an NcclApi there is one GPU, which every rank shares.
DevicePlacement place_device_rank(comm::Communicator& world);

// Collective over dp. The dp group's collectives on device memory; *kind says which ("nccl" or
// "staged") and why. Throws CommError or Timeout when NCCL fails to start.
std::unique_ptr<comm::DeviceCollectives> make_device_collectives(comm::Communicator& dp,
                                                                 const DevicePlacement& place,
                                                                 std::string* kind);

// The Engine's destructor: close() after a finished run (collective, within the control
// plane's timeout_s), abort() while an exception unwinds the rank (its peers must not wait).
void release_device_collectives(comm::DeviceCollectives& c) noexcept;

}  // namespace tessel::parallel
