#include <algorithm>
#include <atomic>
#include <functional>
#include <numeric>

#include "../reduce.h"
#include "nccl_state.h"
#include "tessel/core/error.h"

namespace tessel::comm {

using detail::NcclState;

// One enqueued call: the event recorded after it on the communicator's stream.
struct NcclWork::Call {
  std::shared_ptr<NcclState> s;
  NcclEvent event = nullptr;
  Stamp stamp;
  Deadline deadline = Deadline::never();
  bool finished = false;

  ~Call() {
    if (event) s->api->event_destroy(event);
  }
};

bool NcclWork::done() const {
  if (!c_ || c_->finished) return true;
  c_->finished = c_->s->event_reached(c_->event, c_->stamp);
  if (!c_->finished) c_->s->check_health(c_->stamp);
  return c_->finished;
}

void NcclWork::wait() const {
  if (!c_ || c_->finished) return;
  c_->s->wait_until([this] { return c_->s->event_reached(c_->event, c_->stamp); }, c_->stamp,
                    c_->deadline);
  c_->finished = true;
}

namespace {

// Enqueues NCCL calls as one group (NCCL fuses them; unequal blocks and send_recv need it):
// every call is made even after one fails, so that the group always ends.
class Group {
 public:
  explicit Group(const NcclApi& api) : api_(api) { add(api.group_start(), "ncclGroupStart"); }
  void add(NcclResult r, const char* call) {
    if (r != NcclResult::kSuccess && first_ == NcclResult::kSuccess) {
      first_ = r;
      call_ = call;
    }
  }
  // The group's result: its first failure, else ncclGroupEnd's (kInProgress while NCCL
  // enqueues in the background).
  NcclResult end(const char** call) {
    const NcclResult r = api_.group_end();
    if (first_ != NcclResult::kSuccess) {
      *call = call_;
      return first_;
    }
    *call = "ncclGroupEnd";
    return r;
  }

 private:
  const NcclApi& api_;
  NcclResult first_ = NcclResult::kSuccess;
  const char* call_ = "";
};

bool all_equal(const std::vector<size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}

size_t offset_of(const std::vector<size_t>& counts, int r) {
  return std::accumulate(counts.begin(), counts.begin() + r, size_t{0});
}

const char* byte_ptr(const void* p, size_t elems, ElemType elem) {
  return static_cast<const char*>(p) + elems * elem_size(elem);
}

std::atomic<const NcclApi*> g_installed{nullptr};

}  // namespace

void install_nccl_api(const NcclApi* api) { g_installed.store(api, std::memory_order_release); }
const NcclApi* installed_nccl_api() { return g_installed.load(std::memory_order_acquire); }

NcclCommunicator::NcclCommunicator(Communicator& control, const NcclApi& api,
                                   const NcclOptions& options)
    : s_(std::make_shared<NcclState>()) {
  NcclState& s = *s_;
  s.api = &api;
  s.control = &control;
  s.rank = control.rank();
  s.size = control.size();
  s.timeout_s = control.options().timeout_s;
  s.poll_s = std::max(options.poll_us, 1.0) * 1e-6;
  s.slots_memory = control.shared_memory(s.size * sizeof(HeartbeatSlot));
  s.slots = static_cast<HeartbeatSlot*>(s.slots_memory.get());
  const Stamp stamp{.op = OpKind::kNone, .seq = detail::kSetUp};
  s.stream = options.stream;
  if (!s.stream) {
    s.check_cuda(api.stream_create(&s.stream), "cudaStreamCreate", stamp);
    s.own_stream = true;
    s.check_cuda(api.event_create(&s.follow), "cudaEventCreate", stamp);
  }
  // Bootstrap: rank 0's unique id travels over the control plane.
  NcclUniqueId id{};
  if (s.rank == 0) s.check_nccl(api.get_unique_id(&id), "ncclGetUniqueId", stamp);
  control.broadcast(&id, sizeof id, ElemType::kU8, 0);
  const Deadline deadline = Deadline::after(s.timeout_s);
  NcclResult r;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    r = api.init_rank(&s.comm, s.size, &id, s.rank);
    if (r != NcclResult::kSuccess && r != NcclResult::kInProgress) s.comm = nullptr;
  }
  s.settle(r, "ncclCommInitRankConfig", stamp, deadline);
}

NcclCommunicator::~NcclCommunicator() {
  if (s_)
    s_->abort(str("nccl: the NCCL communicator of rank ", s_->rank,
                  " was destroyed without close() (its rank failed or left early)"));
}

int NcclCommunicator::rank() const { return s_->rank; }
int NcclCommunicator::size() const { return s_->size; }
NcclStream NcclCommunicator::stream() const { return s_->stream; }
bool NcclCommunicator::aborted() const { return s_->aborted.load(std::memory_order_acquire); }
void NcclCommunicator::abort(const std::string& reason) noexcept { s_->abort(reason); }

NcclWork NcclCommunicator::launch(const Stamp& stamp, const CallOptions& call,
                                  const Enqueue& enqueue) {
  NcclState& s = *s_;
  s.enter(stamp);
  const Deadline deadline = Deadline::after(call.timeout_s > 0 ? call.timeout_s : s.timeout_s);
  if (s.follow) {  // after the kernels queued so far on the default stream
    s.check_cuda(s.api->event_record(s.follow, nullptr), "cudaEventRecord", stamp);
    s.check_cuda(s.api->stream_wait_event(s.stream, s.follow), "cudaStreamWaitEvent", stamp);
  }
  const char* what = "";
  NcclResult r = NcclResult::kSuccess;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.comm) r = enqueue(s.comm, &what);  // else aborted meanwhile: check_health refuses
  }
  s.settle(r, what, stamp, deadline);
  s.check_health(stamp);
  auto c = std::make_shared<NcclWork::Call>();
  c->s = s_;
  c->stamp = stamp;
  c->deadline = deadline;
  s.check_cuda(s.api->event_create(&c->event), "cudaEventCreate", stamp);
  s.check_cuda(s.api->event_record(c->event, s.stream), "cudaEventRecord", stamp);
  NcclWork work;
  work.c_ = std::move(c);
  return work;
}

Stamp NcclCommunicator::collective(OpKind op, ElemType elem, ReduceOp reduce, int root,
                                   size_t count, const CallOptions& call) {
  TESSEL_CHECK(root >= -1 && root < s_->size, "nccl: root ", root, " outside the ", s_->size,
               " ranks");
  return Stamp{op, elem, reduce, Algorithm::kNative, root, s_->seq++, count, call.label};
}

NcclWork NcclCommunicator::allreduce(void* buf, size_t count, ElemType elem, ReduceOp op,
                                     const CallOptions& call) {
  check_reducible(elem, op);
  const Stamp st = collective(OpKind::kAllreduce, elem, op, -1, count, call);
  const NcclApi& api = *s_->api;
  return launch(st, call, [&](NcclComm comm, const char** what) {
    *what = "ncclAllReduce";
    return api.all_reduce(buf, buf, count, elem, op, comm, s_->stream);
  });
}

NcclWork NcclCommunicator::reduce_scatter(const void* in, void* out,
                                          const std::vector<size_t>& counts, ElemType elem,
                                          ReduceOp op, const CallOptions& call) {
  check_counts(counts);
  check_reducible(elem, op);
  const size_t total = offset_of(counts, size());
  const Stamp st = collective(OpKind::kReduceScatter, elem, op, -1, total, call);
  const NcclApi& api = *s_->api;
  if (all_equal(counts))
    return launch(st, call, [&](NcclComm comm, const char** what) {
      *what = "ncclReduceScatter";
      return api.reduce_scatter(in, out, counts[0], elem, op, comm, s_->stream);
    });
  // Unequal blocks: block r is reduced onto rank r, all ranks' reduces in one group.
  return launch(st, call, [&](NcclComm comm, const char** what) {
    Group group(api);
    for (int r = 0; r < size(); ++r)
      group.add(api.reduce(byte_ptr(in, offset_of(counts, r), elem), r == rank() ? out : nullptr,
                           counts[r], elem, op, r, comm, s_->stream),
                "ncclReduce");
    return group.end(what);
  });
}

NcclWork NcclCommunicator::allgather(const void* in, void* out, const std::vector<size_t>& counts,
                                     ElemType elem, const CallOptions& call) {
  check_counts(counts);
  const size_t total = offset_of(counts, size());
  const Stamp st = collective(OpKind::kAllgather, elem, ReduceOp::kSum, -1, total, call);
  const NcclApi& api = *s_->api;
  if (all_equal(counts))
    return launch(st, call, [&](NcclComm comm, const char** what) {
      *what = "ncclAllGather";
      return api.all_gather(in, out, counts[0], elem, comm, s_->stream);
    });
  // Unequal blocks: rank r broadcasts its block into its place of every rank's out.
  return launch(st, call, [&](NcclComm comm, const char** what) {
    Group group(api);
    for (int r = 0; r < size(); ++r) {
      void* dst = const_cast<char*>(byte_ptr(out, offset_of(counts, r), elem));
      group.add(api.broadcast(in, dst, counts[r], elem, r, comm, s_->stream), "ncclBroadcast");
    }
    return group.end(what);
  });
}

NcclWork NcclCommunicator::broadcast(void* buf, size_t count, ElemType elem, int root,
                                     const CallOptions& call) {
  TESSEL_CHECK(root >= 0, "nccl: broadcast needs a root in [0, ", size(), "), got ", root);
  const Stamp st = collective(OpKind::kBroadcast, elem, ReduceOp::kSum, root, count, call);
  const NcclApi& api = *s_->api;
  return launch(st, call, [&](NcclComm comm, const char** what) {
    *what = "ncclBroadcast";
    return api.broadcast(buf, buf, count, elem, root, comm, s_->stream);
  });
}

NcclWork NcclCommunicator::send(const void* buf, size_t count, ElemType elem, int peer,
                                const CallOptions& call) {
  return send_recv(buf, count, peer, nullptr, 0, -1, elem, call);
}

NcclWork NcclCommunicator::recv(void* buf, size_t count, ElemType elem, int peer,
                                const CallOptions& call) {
  return send_recv(nullptr, 0, -1, buf, count, peer, elem, call);
}

NcclWork NcclCommunicator::send_recv(const void* send_buf, size_t send_count, int to,
                                     void* recv_buf, size_t recv_count, int from, ElemType elem,
                                     const CallOptions& call) {
  for (int peer : {to, from})
    if (peer != -1)
      TESSEL_CHECK(peer >= 0 && peer < size(), "nccl: peer rank ", peer, " outside the ", size(),
                   " ranks");
  const Stamp st{OpKind::kP2p, elem,          ReduceOp::kSum,          Algorithm::kNative,
                 -1,           s_->p2p_seq++, send_count + recv_count, call.label};
  const NcclApi& api = *s_->api;
  return launch(st, call, [&](NcclComm comm, const char** what) {
    Group group(api);
    if (to >= 0) group.add(api.send(send_buf, send_count, elem, to, comm, s_->stream), "ncclSend");
    if (from >= 0)
      group.add(api.recv(recv_buf, recv_count, elem, from, comm, s_->stream), "ncclRecv");
    return group.end(what);
  });
}

void NcclCommunicator::check_counts(const std::vector<size_t>& counts) const {
  if (static_cast<int>(counts.size()) != size())
    throw InvalidArgument(str("nccl: counts must hold one block length per rank (", size(),
                              "), got ", counts.size(),
                              "; pass every rank's block, in rank order"));
}

void NcclCommunicator::close() {
  if (!s_) return;
  NcclState& s = *s_;
  if (!s.aborted.load(std::memory_order_acquire)) {
    const Stamp stamp{.op = OpKind::kNone, .seq = detail::kClose};
    NcclResult r = NcclResult::kSuccess;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.comm) r = s.api->finalize(s.comm);
    }
    // Finalize flushes the issued work on every rank: a peer that never finalizes keeps this
    // in kInProgress until the deadline.
    s.settle(r, "ncclCommFinalize", stamp, Deadline::after(s.timeout_s));
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (s.comm) r = s.api->destroy(s.comm);
      s.comm = nullptr;
    }
    if (r != NcclResult::kSuccess) {
      const int rank = s.rank;
      s_.reset();
      throw CommError(str("nccl: ncclCommDestroy failed on rank ", rank, ", got ",
                          nccl_result_name(r), "; the communicator's resources may leak"));
    }
  }
  s_.reset();
}

}  // namespace tessel::comm
