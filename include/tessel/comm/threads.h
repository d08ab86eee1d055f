// The threads transport: ranks are threads of one process, the embedded default and how tests
// run. A send hands its buffer to the receiver through a per-pair mailbox; whichever side arrives
// second copies (or, for irecv_reduce, reduces) straight from the sender's buffer into the
// receiver's, so a message is copied at most once. Waits spin briefly, then yield the core, then
// sleep on a futex (waking a sleeping thread is expensive on small VMs; see docs/comm.md).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/transport.h"

namespace tessel::comm {

// world_size transports of one group, index = rank. Hand each to its own thread.
std::vector<std::unique_ptr<Transport>> make_thread_transports(int world_size,
                                                               const CommOptions& options = {});
// world_size communicators of one group, index = rank.
std::vector<Communicator> make_thread_world(int world_size, const CommOptions& options = {});

// Runs fn(comm) on world_size threads (rank 0 on the calling thread) and joins them. When a
// rank throws, the group is aborted so the other ranks' calls fail fast with CommError; then
// the first exception that is not such a consequence (the root cause) is rethrown.
void run_threads(int world_size, const std::function<void(Communicator&)>& fn,
                 const CommOptions& options = {});

}  // namespace tessel::comm
