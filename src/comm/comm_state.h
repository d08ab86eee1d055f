// The Communicator's private state and its progress engine. Internal to the comm area.
//
// Progress engine: async calls are queued, in call order, to one thread per communicator,
// started on the first async call. Why a thread and not progress-on-wait: a gradient bucket's
// allreduce must move while the caller computes the next block's backward, and nothing
// computes-and-polls in between. Why one thread: collectives of one communicator must run in
// the same order on every rank, and one thread gives that order for free. On a 2-core machine
// the thread competes with compute, so it never busy-waits for long: idle, it spins a few
// microseconds (back-to-back buckets) and then sleeps on a futex; inside a call it waits with
// the short-yield policy of effective_policy() (wait.h). A blocking call first drains the queue,
// so blocking and async calls keep their order too.
#pragma once

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "spin_lock.h"
#include "tessel/comm/algorithms.h"
#include "tessel/comm/communicator.h"
#include "wait.h"

namespace tessel::comm::detail {

struct WorkState {
  Event done;
  std::exception_ptr error;  // written before done is set
  WaitPolicy policy;
  Transport* transport = nullptr;
  std::function<void()> task;  // a collective, run by the progress thread
  RequestPtr request;          // or a point-to-point transfer, polled by its waiter
  bool p2p = false;
  std::string what;  // for messages: "allreduce #4 (..) on rank 1"

  // Drives a point-to-point request to completion; returns true when done (error included).
  bool poll() noexcept;
};

class Progress {
 public:
  explicit Progress(const WaitPolicy& policy);
  ~Progress();
  void submit(std::shared_ptr<WorkState> work);
  // Waits for every submitted call to finish (each is bounded by its own deadline).
  void drain();

 private:
  void loop();
  WaitPolicy policy_;
  SpinLock mu_;
  std::deque<std::shared_ptr<WorkState>> queue_;
  std::shared_ptr<WorkState> last_;
  std::atomic<uint32_t> signal_{0};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct CommState {
  std::unique_ptr<Transport> transport;
  CommOptions options;
  WaitPolicy policy;
  uint64_t seq = 0;     // next collective's sequence number (equal on every rank)
  uint64_t splits = 0;  // splits made so far
  uint64_t shared = 0;  // shared_memory() calls made so far
  Scratch scratch;
  std::unique_ptr<Progress> progress;  // started on the first async call
  // For traces (core/trace.h): the group's name, equal on its members ("world", then one
  // "/<split>.<color>" per split), and its members as ranks of the job (a JSON array).
  std::string group = "world";
  std::vector<int> job_ranks;
  std::string job_ranks_json;

  void drain() {
    if (progress) progress->drain();
  }
};

}  // namespace tessel::comm::detail
