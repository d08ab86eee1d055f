// The private state of an NcclCommunicator and the one place where its failures are decided:
// polling (event, async error, control plane, deadline), aborting both sides, and the messages
// that name the rank that stopped. Internal to the comm area.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "../heartbeat.h"
#include "tessel/comm/nccl.h"

namespace tessel::comm::detail {

// Stamps of the management steps (op kNone): seq tells which.
constexpr uint64_t kSetUp = 0;
constexpr uint64_t kClose = 1;

struct NcclState {
  const NcclApi* api = nullptr;
  Communicator* control = nullptr;
  int rank = 0;
  int size = 1;
  double timeout_s = 300;
  double poll_s = 50e-6;
  NcclStream stream = nullptr;
  bool own_stream = false;
  // With its own stream: recorded on the default stream before each call, which the stream
  // waits for (NcclOptions::stream).
  NcclEvent follow = nullptr;
  uint64_t seq = 0;      // next collective's number (equal on every rank)
  uint64_t p2p_seq = 0;  // next point-to-point call's number (this rank's own count)

  // Progress records of every rank (one HeartbeatSlot each) in memory the control plane's
  // ranks share, or null when they do not share a host (then no rank can be named). Each rank
  // records the calls it enters and the waits it is in, and beats its slot whenever its NCCL
  // side acts (a call, a poll): a rank whose NCCL side stays silent while the others' poll is
  // the one that went away (silent_ranks).
  std::shared_ptr<void> slots_memory;
  HeartbeatSlot* slots = nullptr;

  // Serializes NCCL calls on `comm` with abort() from another thread: after abort the handle
  // is dead and nothing may touch it.
  std::mutex mu;
  NcclComm comm = nullptr;  // null once aborted or destroyed
  std::atomic<bool> aborted{false};
  std::string abort_reason;  // under mu

  ~NcclState();  // releases the stream and event (the communicator is gone by then)

  // The call's description for messages: "allreduce #3 (1000 x f32, sum, native) on rank 1".
  std::string where(const Stamp& s) const;
  // Records entering the call `s` and throws CommError when it may not start (aborted, or the
  // control plane failed).
  void enter(const Stamp& s);
  // Turns the result of an enqueuing call into "enqueued": kSuccess returns, kInProgress is
  // polled until NCCL settles, anything else fails. `call` names the NCCL function.
  void settle(NcclResult r, const char* call, const Stamp& s, Deadline deadline);
  // One look at the communicator's health: throws when it was aborted, NCCL reports an error
  // or the control plane failed; returns NCCL's async state (kSuccess or kInProgress).
  NcclResult check_health(const Stamp& s);
  // Polls until reached() is true (asked first: work that finished counts even when a failure
  // follows): fails as check_health, or with Timeout at the deadline.
  void wait_until(const std::function<bool()>& reached, const Stamp& s, Deadline deadline);
  // True when `event` was reached; fails on a CUDA error.
  bool event_reached(NcclEvent event, const Stamp& s);

  // Aborts NCCL (once) and the control group with `reason`. Never throws or blocks for long.
  void abort(const std::string& reason) noexcept;
  // Abort, then throw CommError / Timeout.
  [[noreturn]] void fail(const std::string& message);
  [[noreturn]] void fail_timeout(const Stamp& s, double waited_s);

  // Helpers for one library each: an NCCL result or a CUDA error outside a wait.
  void check_nccl(NcclResult r, const char* call, const Stamp& s);
  void check_cuda(int error, const char* call, const Stamp& s);

 private:
  NcclResult async_error();
  [[noreturn]] void fail_nccl(NcclResult r, const char* call, const Stamp& s);
  [[noreturn]] void fail_control(const Stamp& s);
  [[noreturn]] void refuse(const Stamp& s);
  std::string stuck_rank() const;
  // After a failure NCCL may owe to a peer: polls the records (beating this rank's own slot,
  // at most 2 kSilentS) until every other rank either acted since or has been silent for
  // kSilentS, and names the silent ones ("" when none, or without records).
  std::string silent_ranks();
};

}  // namespace tessel::comm::detail
