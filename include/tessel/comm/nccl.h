// NcclCommunicator: the NCCL side of a device rank. NCCL moves the rank's device buffers
// (all-reduce, reduce-scatter, all-gather, broadcast, send/recv); the rank's ordinary
// Communicator (threads or mpi) stays the control plane: it carries the bootstrap (rank 0's
// unique id), the progress records that name a stuck rank, and the abort family, so a failure
// on either side ends both. Each call is enqueued on one stream and returns an NcclWork that
// completes on an event. The communicator is non-blocking (NCCL's blocking = 0): a wait polls
// the event, NCCL's async error and the control plane until the call's deadline, and on any
// failure aborts NCCL (ncclCommAbort) and the control group, then throws Timeout or CommError
// naming the rank that stopped. Not an algorithm host: NCCL chooses its own. One thread uses a
// communicator at a time (abort() from any thread); the control Communicator and the NcclApi
// must outlive it, and buffers must stay untouched until their work completes.
// DeviceCollectives, below, is the part of it the engine's device ranks use, which
// StagedCollectives (staged_collectives.h) also fills for ranks that share a GPU.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl_api.h"

namespace tessel::comm {

struct NcclOptions {
  // Where calls are enqueued. The rank's compute stream orders them after the kernels that
  // wrote their buffers; null: a stream of the communicator's own, on which each call first
  // waits for the work queued so far on the device's default stream (an event recorded there),
  // so ranks computing on the default stream need no more. (Not a blocking stream: with ranks
  // as threads sharing a GPU, the default stream would then wait for one rank's NCCL kernel,
  // which waits for a peer whose kernels queue behind it.) Work after a call waits for its
  // NcclWork.
  NcclStream stream = nullptr;
  double poll_us = 50;  // between polls of the event and the async error while waiting
};

namespace detail {
struct NcclState;
}

// One enqueued call. Copyable (copies share the call); wait for every NcclWork before close().
class NcclWork {
 public:
  NcclWork() = default;  // complete already
  // True once the call finished on the device; never blocks. Throws as wait() when NCCL or
  // the control plane failed meanwhile.
  bool done() const;
  // Until the call finished, its deadline passed (Timeout), NCCL reported an error or the
  // control plane was aborted (CommError); on failure both are aborted first.
  void wait() const;

 private:
  friend class NcclCommunicator;
  struct Call;
  std::shared_ptr<Call> c_;
};

// The collectives a group of device ranks runs on device memory (the gradient buckets of
// device ranks call them): NcclCommunicator below, where NCCL moves the buffers, or
// StagedCollectives (staged_collectives.h), which copies them through host memory over the
// ranks' ordinary Communicator, for ranks that share a GPU NCCL will not share. A call returns
// once it is enqueued (or done); its NcclWork completes when the buffer holds the result.
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // buf (count elements of device memory) becomes op over every rank's buf.
  [[nodiscard]] virtual NcclWork allreduce(void* buf, size_t count, ElemType elem, ReduceOp op,
                                           const CallOptions& call) = 0;
  // Blocks of every rank's lengths (rank order): in holds sum(counts), out counts[rank()] (it
  // may be this rank's own block of in); allgather the reverse (in may be out's own block).
  [[nodiscard]] virtual NcclWork reduce_scatter(const void* in, void* out,
                                                const std::vector<size_t>& counts, ElemType elem,
                                                ReduceOp op, const CallOptions& call) = 0;
  [[nodiscard]] virtual NcclWork allgather(const void* in, void* out,
                                           const std::vector<size_t>& counts, ElemType elem,
                                           const CallOptions& call) = 0;
  // Point to point (a pipeline boundary), matched in order per peer: send returns once buf
  // may be reused or its NcclWork says when; recv's work completes when buf holds the message.
  // A send and a receive between the same two ranks in opposite directions need send_recv on
  // NCCL: a boundary uses one group per direction.
  [[nodiscard]] virtual NcclWork send(const void* buf, size_t count, ElemType elem, int peer,
                                      const CallOptions& call) = 0;
  [[nodiscard]] virtual NcclWork recv(void* buf, size_t count, ElemType elem, int peer,
                                      const CallOptions& call) = 0;
  // Collective: waits for the issued work and releases what the group holds, within the
  // control plane's timeout_s (after an abort, only releases).
  virtual void close() = 0;
  // Stops the group's work and aborts the control plane with `reason`; never blocks.
  virtual void abort(const std::string& reason) noexcept = 0;
};

class NcclCommunicator final : public DeviceCollectives {
 public:
  // Collective over `control`: rank 0 makes the unique id, the control plane broadcasts it,
  // every rank initializes its NCCL communicator (rank and size are control's) within
  // control's timeout_s. Throws Timeout or CommError (both sides aborted) on failure.
  NcclCommunicator(Communicator& control, const NcclApi& api, const NcclOptions& options = {});
  // Aborts (never blocks) when close() was not called.
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  NcclStream stream() const;

  // The collectives. Unequal blocks (counts of every rank, in rank order) run as one NCCL group
  // of reduces or broadcasts, one per rank, so nothing is padded; equal blocks use NCCL's own.
  // reduce_scatter: in holds sum(counts), out counts[rank()]; allgather the reverse.
  [[nodiscard]] NcclWork allreduce(void* buf, size_t count, ElemType elem,
                                   ReduceOp op = ReduceOp::kSum,
                                   const CallOptions& call = {}) override;
  [[nodiscard]] NcclWork reduce_scatter(const void* in, void* out,
                                        const std::vector<size_t>& counts, ElemType elem,
                                        ReduceOp op = ReduceOp::kSum,
                                        const CallOptions& call = {}) override;
  [[nodiscard]] NcclWork allgather(const void* in, void* out, const std::vector<size_t>& counts,
                                   ElemType elem, const CallOptions& call = {}) override;
  [[nodiscard]] NcclWork broadcast(void* buf, size_t count, ElemType elem, int root,
                                   const CallOptions& call = {});
  // Point to point, matched in order per peer. A send and a receive between the same two
  // ranks in opposite directions must be one send_recv (two separate calls would each wait
  // for the other on the device).
  [[nodiscard]] NcclWork send(const void* buf, size_t count, ElemType elem, int peer,
                              const CallOptions& call = {}) override;
  [[nodiscard]] NcclWork recv(void* buf, size_t count, ElemType elem, int peer,
                              const CallOptions& call = {}) override;
  [[nodiscard]] NcclWork send_recv(const void* send_buf, size_t send_count, int to, void* recv_buf,
                                   size_t recv_count, int from, ElemType elem,
                                   const CallOptions& call = {});

  // Collective: waits for the issued work and frees the NCCL communicator (finalize, then
  // destroy) within control's timeout_s; after an abort it only releases what is left.
  void close() override;
  // Stops NCCL's work and frees it (ncclCommAbort) and aborts the control group with
  // `reason`; later calls and waits throw CommError. Idempotent, from any thread.
  void abort(const std::string& reason) noexcept override;
  bool aborted() const;

 private:
  // Makes the NCCL calls of one work item on `comm` (under the communicator's lock); returns
  // the result and names the call that gave it.
  using Enqueue = std::function<NcclResult(NcclComm comm, const char** what)>;
  NcclWork launch(const Stamp& stamp, const CallOptions& call, const Enqueue& enqueue);
  Stamp collective(OpKind op, ElemType elem, ReduceOp reduce, int root, size_t count,
                   const CallOptions& call);
  void check_counts(const std::vector<size_t>& counts) const;

  std::shared_ptr<detail::NcclState> s_;
};

}  // namespace tessel::comm
