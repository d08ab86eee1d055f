// A mock NCCL behind NcclApi, for testing NcclCommunicator's control logic without a GPU.
// Ranks are threads of one process and device memory is host memory; a stream is a worker
// thread that runs its queue in order; ranks meet in a rendezvous keyed by the unique id, and
// collectives compute real results (the comm area's reduction kernels). NCCL's non-blocking
// rules are kept: init, every enqueue (outside a group, or ncclGroupEnd) and finalize answer
// ncclInProgress, and the caller must poll get_async_error out of kInProgress before its next
// call on that communicator; finalize settles only once every rank finalized; abort frees the
// communicator. Breaking a rule (a call before the last settled, a call on an aborted or
// destroyed communicator, ranks whose calls differ) counts as a misuse, which tests check.
// Once a rank aborts or dies, nothing more completes in its group and the other ranks' async
// error turns ncclRemoteError (what NCCL's network transports report when a peer goes away).
// Its CUDA slots are the fake device's (tests/support/fake_device.h): device_count its GPUs (1
// without a FakeDevice), set_device this thread's fake GPU. A communicator belongs to the GPU
// current at init_rank, and a buffer of another GPU's memory given to it is a misuse. Ranks may
// share a GPU (as NCCL 2.30 with NCCL_MULTI_RANK_GPU_ENABLE) unless mock_nccl_shares_device(false).
#pragma once

#include <string>

#include "tessel/comm/nccl_api.h"

namespace tessel::comm::testing {

const NcclApi& mock_nccl();

enum class MockFault {
  kNone,
  kStall,  // the rank's device work never ends (a hung kernel); its process stays alive
  // The rank's process is gone: its work never runs, peers see ncclRemoteError, and its thread
  // shows no more life (it stays inside the call it died in until a peer aborts the group).
  kDie,
};
// For communicators created from now on: rank `rank`'s work items from the `after`-th
// (0-based, in enqueue order) on meet `fault`.
void mock_nccl_fault(int rank, MockFault fault, int after = 0);
// For communicators created from now on: every work item starts `seconds` after its turn on its
// stream (work that completes late, as a slow link's).
void mock_nccl_delay(double seconds);

struct MockNcclState {
  int live_comms = 0;    // initialized and neither destroyed nor aborted
  int live_streams = 0;  // created and not destroyed
  int misuses = 0;
  std::string first_misuse;
};
MockNcclState mock_nccl_state();
// For communicators created from now on: whether ranks of one group may share a GPU (true by
// default). Without, a second rank's init_rank on a GPU of the group is a misuse and fails with
// kInvalidUsage, as NCCL before 2.30 refuses it; shares_device answers the same.
void mock_nccl_shares_device(bool allowed);
// Forgets faults, delays, sharing, misuses and dead communicators; call between tests, with no
// stream left.
void mock_nccl_reset();

}  // namespace tessel::comm::testing
