#include "engine_device.h"

#include <algorithm>
#include <cstdlib>
#include <exception>

#include "tessel/comm/staged_collectives.h"
#include "tessel/core/error.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

}  // namespace

DevicePlacement place_device_rank(comm::Communicator& world) {
  const comm::NcclApi* api = comm::installed_nccl_api();
  if (api == nullptr) return {0, world.ranks_on_host() > 1};  // the runtime's one device
  int count = 1;
  if (const int e = api->device_count(&count); e != 0)
    throw Error(str("runtime.device = cuda: cudaGetDeviceCount failed, got ",
                    api->device_error_string(e), "; check the driver with nvidia-smi"));
  count = std::max(count, 1);
  // Ranks as threads: one process holds every rank of this host, numbered as the world's.
  const bool mpi = world.backend() == comm::Backend::kMpi;
  const int local_rank = mpi ? env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0) : world.rank();
  const DevicePlacement p{local_rank % count, world.ranks_on_host() > count};
  if (const int e = api->set_device(p.device); e != 0)
    throw Error(str("runtime.device = cuda: cudaSetDevice(", p.device, ") for ",
                    mpi ? "local rank " : "rank ", local_rank, " of ", world.ranks_on_host(),
                    " on ", count, " GPUs failed, got ", api->device_error_string(e),
                    "; check CUDA_VISIBLE_DEVICES"));
  return p;
}

std::unique_ptr<comm::DeviceCollectives> make_device_collectives(comm::Communicator& dp,
                                                                 const DevicePlacement& place,
                                                                 std::string* kind) {
  const comm::NcclApi* api = comm::installed_nccl_api();
  if (api != nullptr && (!place.shared || api->shares_device())) {
    *kind = "nccl";
    return std::make_unique<comm::NcclCommunicator>(dp, *api);
  }
  // NCCL before 2.30 refuses two ranks on one GPU: their buffers go through the host instead.
  *kind = api == nullptr ? "staged (no NCCL in this build)"
                         : "staged (ranks share a GPU; NCCL needs 2.30+ and "
                           "NCCL_MULTI_RANK_GPU_ENABLE=1 for that)";
  return std::make_unique<comm::StagedCollectives>(dp, current_device(), current_stream());
}

void release_device_collectives(comm::DeviceCollectives& c) noexcept {
  if (std::uncaught_exceptions() > 0) {
    c.abort("engine: a device rank failed; its collectives were aborted");
    return;
  }
  try {
    c.close();
  } catch (const std::exception&) {
    // A peer that failed meanwhile: its own error is the one the run reports.
  }
}

}  // namespace tessel::parallel
