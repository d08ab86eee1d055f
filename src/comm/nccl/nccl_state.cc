#include "nccl_state.h"

#include <chrono>
#include <thread>
#include <vector>

#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::comm {

const char* nccl_result_name(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return "an unknown ncclResult_t";
}

namespace detail {
namespace {

// What each NCCL failure means for the user.
const char* advice(NcclResult r) {
  switch (r) {
    case NcclResult::kRemoteError:
      return "a peer's process exited or its connection broke: look for the first failure "
             "among the other ranks' errors";
    case NcclResult::kInvalidArgument:
    case NcclResult::kInvalidUsage:
      return "the call's buffers, counts or order are wrong on some rank (a bug in the caller)";
    case NcclResult::kUnhandledCudaError:
      return "a CUDA call inside NCCL failed: check the device (nvidia-smi) and the "
             "driver's log";
    default:
      return "run with NCCL_DEBUG=WARN for NCCL's own account";
  }
}

}  // namespace

NcclState::~NcclState() {
  if (follow) api->event_destroy(follow);
  if (own_stream && stream) api->stream_destroy(stream);
}

std::string NcclState::where(const Stamp& s) const {
  if (s.op == OpKind::kNone)
    return str(s.seq == kSetUp ? "setting up" : "closing", " the NCCL communicator of rank ", rank);
  return str(describe(s), " on rank ", rank);
}

void NcclState::enter(const Stamp& s) {
  if (aborted.load(std::memory_order_acquire)) refuse(s);
  if (control->aborted()) fail_control(s);
  if (slots) {
    slots[rank].enter(s);
    slots[rank].beat();
  }
}

void NcclState::settle(NcclResult r, const char* call, const Stamp& s, Deadline deadline) {
  if (r == NcclResult::kSuccess) return;
  if (r != NcclResult::kInProgress) fail_nccl(r, call, s);
  wait_until([&] { return check_health(s) == NcclResult::kSuccess; }, s, deadline);
}

void NcclState::wait_until(const std::function<bool()>& reached, const Stamp& s,
                           Deadline deadline) {
  // Collectives have no single peer: the ring neighbour stands for "the others" in the
  // progress record (what name_stuck_rank prints for a rank that waits).
  WaitMark mark(slots ? &slots[rank] : nullptr, (rank + 1) % size);
  const double start = now_seconds();
  for (;;) {
    if (reached()) return;
    check_health(s);
    if (deadline.expired()) fail_timeout(s, now_seconds() - start);
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s));
  }
}

NcclResult NcclState::check_health(const Stamp& s) {
  if (slots) slots[rank].beat();  // this rank's NCCL side is active
  if (aborted.load(std::memory_order_acquire)) refuse(s);
  // The control plane first: its abort reason is the first failure's own account (a peer that
  // failed aborts both, and NCCL then only says "remote error").
  if (control->aborted()) fail_control(s);
  const NcclResult a = async_error();
  if (a != NcclResult::kSuccess && a != NcclResult::kInProgress) {
    if (control->aborted()) fail_control(s);  // the failure NCCL reports came from there
    fail_nccl(a, "ncclCommGetAsyncError", s);
  }
  return a;
}

bool NcclState::event_reached(NcclEvent event, const Stamp& s) {
  const int e = api->event_query(event);
  if (e == kCudaNotReady) return false;
  check_cuda(e, "cudaEventQuery", s);
  return true;
}

NcclResult NcclState::async_error() {
  std::lock_guard<std::mutex> lock(mu);
  if (!comm) return NcclResult::kSuccess;  // aborted meanwhile: the caller sees `aborted`
  NcclResult a = NcclResult::kSuccess;
  const NcclResult r = api->get_async_error(comm, &a);
  return r == NcclResult::kSuccess ? a : r;
}

void NcclState::abort(const std::string& reason) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted.load(std::memory_order_relaxed)) return;
    abort_reason = reason;
    aborted.store(true, std::memory_order_release);
  }
  // The control group first, so that peers read this account of the failure rather than
  // NCCL's bare "remote error", which NCCL's abort is about to cause.
  if (control->valid()) control->abort(reason);
  std::lock_guard<std::mutex> lock(mu);
  // NCCL's abort stops the device work and frees the communicator: the handle dies here.
  if (comm) api->abort(comm);
  comm = nullptr;
}

void NcclState::fail(const std::string& message) {
  abort(message);
  throw CommError(message);
}

void NcclState::fail_timeout(const Stamp& s, double waited_s) {
  std::string stuck = stuck_rank();
  std::string message =
      str("nccl: ", where(s), " did not complete within its deadline (waited ",
          static_cast<int64_t>(waited_s * 10 + 0.5) / 10.0, " s, comm.timeout_s = ", timeout_s,
          "); ", stuck.empty() ? "no rank stands out" : stuck,
          "; the NCCL communicator and the control group were aborted: check that rank (its "
          "log, the device), or raise comm.timeout_s if the call is merely slow");
  abort(message);
  throw Timeout(message);
}

void NcclState::check_nccl(NcclResult r, const char* call, const Stamp& s) {
  if (r != NcclResult::kSuccess) fail_nccl(r, call, s);
}

void NcclState::check_cuda(int error, const char* call, const Stamp& s) {
  if (error == 0) return;
  fail(str("nccl: ", call, " failed in ", where(s), ", got error ", error, " (",
           api->device_error_string(error),
           "); the NCCL communicator and the control group were aborted: check the device "
           "(nvidia-smi) and the driver's log"));
}

void NcclState::fail_nccl(NcclResult r, const char* call, const Stamp& s) {
  std::string detail;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (comm && api->last_error(comm)) detail = api->last_error(comm);
  }
  // A failure that may come from a peer (not the caller's bug, not this rank's device): the
  // rank whose NCCL side went silent is the one that went away; a peer that named it first
  // aborted the control plane with that account meanwhile.
  std::string stuck;
  if (r == NcclResult::kRemoteError || r == NcclResult::kSystemError ||
      r == NcclResult::kInternalError) {
    stuck = silent_ranks();
    if (control->aborted()) fail_control(s);
    if (stuck.empty() && r == NcclResult::kRemoteError) stuck = stuck_rank();
  }
  fail(str("nccl: ", call, " failed in ", where(s), ", got ", nccl_result_name(r),
           detail.empty() ? "" : str(" (", detail, ")"), "; ", stuck.empty() ? "" : stuck + "; ",
           advice(r), ". The NCCL communicator and the control group were aborted"));
}

void NcclState::fail_control(const Stamp& s) {
  std::string reason = "the control group was aborted";
  try {
    control->transport().check_alive();
  } catch (const Error& e) {
    reason = e.what();
  }
  fail(str("nccl: ", where(s), " stopped: the control plane reports a failure: ", reason,
           "; the NCCL communicator was aborted"));
}

void NcclState::refuse(const Stamp& s) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu);
    reason = abort_reason;
  }
  throw CommError(str("nccl: ", where(s), " refused: the NCCL communicator was aborted (", reason,
                      "); make a new one after the job recovers"));
}

std::string NcclState::stuck_rank() const {
  if (!slots) return "";
  std::vector<RankState> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.push_back(slots[r].read(r));
    // The beats here are NCCL-side activity, not a process's heartbeat (a rank computing
    // between calls is silent too): name_stuck_rank's rules for stopped processes do not apply.
    ranks.back().silent_s = -1;
  }
  // NCCL hides which rank holds a collective up: when every rank waits inside the same call,
  // the ring neighbours in the records mean nothing.
  bool all_inside = true;
  for (const RankState& r : ranks)
    all_inside &=
        r.waiting_for >= 0 && r.calls == ranks[rank].calls && r.stamp == ranks[rank].stamp;
  if (all_inside && size > 1)
    return str("every rank is waiting inside ", describe(ranks[rank].stamp),
               ": no rank stands out (a hang on a device or inside NCCL; NCCL_DEBUG=INFO and "
               "nvidia-smi on each rank's host tell more)");
  return name_stuck_rank(ranks, rank);
}

std::string NcclState::silent_ranks() {
  if (!slots || size < 2) return "";
  const double start = now_seconds();
  std::vector<RankState> silent;
  for (;;) {
    slots[rank].beat();
    silent.clear();
    bool undecided = false;
    // Taken before the records are read: a peer whose last beat came just before `start` (the
    // failing peer's own entry into the call often does) then never looks as if it beat after
    // it, however long this thread is preempted between the two clock reads.
    const double waited_s = now_seconds() - start;
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const RankState st = slots[r].read(r);
      if (st.silent_s > kSilentS)
        silent.push_back(st);
      else if (st.silent_s < 0 || st.silent_s > waited_s)
        undecided = true;  // not active since this rank saw the failure, not silent long yet
    }
    if (!undecided || waited_s > 2 * kSilentS || control->aborted()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string out;
  for (const RankState& st : silent)
    out += str(out.empty() ? "" : "; ", "rank ", st.rank,
               " stopped making progress: its NCCL side has shown no activity for ",
               static_cast<int64_t>(st.silent_s * 10 + 0.5) / 10.0,
               " s while the other ranks' is (its process died, or it hangs outside NCCL)",
               st.entered_s < 0 ? "" : str("; its last NCCL call was ", describe(st.stamp)));
  return out;
}

}  // namespace detail
}  // namespace tessel::comm
