// The CUDA half of the mock NCCL (nccl_mock.h), private to it: a stream is a worker thread that
// runs its queue in order, an event a pair of counters a stream advances, and the GPUs are the
// fake device's (tests/support/fake_device.h). nccl_mock.cc fills the NCCL slots.
#pragma once

#include <functional>
#include <string>

#include "tessel/comm/nccl_api.h"

namespace tessel::comm::testing::mock {

// Counts a misuse for mock_nccl_state (nccl_mock.cc) and answers kInvalidUsage.
NcclResult misuse(const std::string& what);

// Queues `task` on a stream of the table's stream_create; the stream runs it after what it holds.
void stream_push(NcclStream stream, std::function<void()> task);
int live_streams();  // created and not destroyed
void forget_events();

// Sets the table's CUDA runtime slots (device_count to device_error_string).
void fill_cuda_slots(NcclApi& api);

}  // namespace tessel::comm::testing::mock
