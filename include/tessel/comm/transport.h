// Transport: moves bytes between the ranks of one group, point to point, and nothing else
// (the gloo/NCCL split: transport -> algorithms -> communicator). Implementations: threads
// (ranks are threads of one process; threads.h) and mpi (one rank per process; mpi.h).
// Matching follows MPI: messages from one sender with one tag are received in the order sent.
// Every message carries a Stamp (which collective it belongs to). Messages whose stamps differ
// never complete each other: the transport reports them, or a waiting rank whose peer is in
// another call, as a CommError naming both sides, so ranks that disagree on a collective get an
// error instead of a hang (threads: stamps compared directly; mpi: the stamp's hash is the tag
// and a waiting rank queries its peer). isend/irecv/test/wait may be called from several
// threads at once; one Request is used by one thread at a time. Buffers belong to the caller and
// must stay valid and untouched until the request completes or is destroyed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/types.h"

namespace tessel::comm {

// Identifies the collective a message belongs to. Ranks running the same call produce equal
// stamps; describe() renders one for error messages ("allreduce #12 (1000 x f32, sum, ring)").
enum class OpKind : uint8_t {
  kNone,
  kAllreduce,
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kReduce,
  kGather,
  kAllToAll,
  kBarrier,
  kP2p,
  kSplit,
  kSharedMemory
};
const char* op_kind_name(OpKind k);

struct Stamp {
  OpKind op = OpKind::kNone;
  ElemType elem = ElemType::kU8;
  ReduceOp reduce = ReduceOp::kSum;
  Algorithm algorithm = Algorithm::kAuto;
  int32_t root = -1;   // root rank, or -1
  uint64_t seq = 0;    // per-communicator collective number (the user tag for p2p)
  uint64_t count = 0;  // elements of the call (total over ranks for variable-size calls)
  uint32_t label = 0;  // the caller's CallOptions::label (e.g. which block's parameters)

  bool operator==(const Stamp&) const = default;
};
std::string describe(const Stamp& s);

// A pending send or receive. The destructor of an unfinished request cancels it if no peer has
// matched it yet; a matched one first finishes its copy (or waits for the peer's) so that no
// peer touches the buffer afterwards.
class Request {
 public:
  virtual ~Request() = default;
  // True once complete; throws CommError if the transfer failed (mismatch, peer failure).
  virtual bool test() = 0;
  // Blocks until complete: spins briefly, then yields, then sleeps. Throws CommError naming
  // op, rank, peer, tag and bytes when the deadline passes, the transfer failed or the group
  // was aborted; after a deadline the group is aborted (poisoned) on every rank.
  virtual void wait(Deadline deadline) = 0;
};
using RequestPtr = std::unique_ptr<Request>;

class NativeCollectives;

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Backend backend() const = 0;

  virtual RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes,
                           const Stamp& stamp) = 0;
  virtual RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes,
                           const Stamp& stamp) = 0;
  // Receives `count` elements and combines them into acc (acc = acc op incoming; kAvg sums).
  // The default receives into a private buffer and reduces on completion; the threads
  // transport reduces straight from the sender's buffer (no copy). Two pending irecv_reduce
  // calls must not target overlapping acc ranges.
  virtual RequestPtr irecv_reduce(int peer, uint64_t tag, void* acc, size_t count, ElemType elem,
                                  ReduceOp op, const Stamp& stamp);

  // Poisons the group: every pending and later wait on every rank throws CommError carrying
  // `reason`. Idempotent; the first reason wins.
  virtual void abort(const std::string& reason) noexcept = 0;
  // Throws CommError with the abort reason if the group was aborted; cheap.
  virtual void check_alive() = 0;
  virtual bool aborted() const = 0;

  // Collective over this group. `members` lists this rank's new group as old ranks in new-rank
  // order (empty: color < 0, returns nullptr); split_id is equal on all ranks and distinct for
  // every split of this group. The communicator computes both with an allgather first.
  virtual std::unique_ptr<Transport> split(int color, int key, const std::vector<int>& members,
                                           uint64_t split_id) = 0;

  // Collective over this group: `bytes` of zeroed, 64-byte aligned memory that every rank of
  // the group reads and writes directly (the same bytes on every rank), or nullptr on every
  // rank when the ranks do not share memory (mpi ranks on several hosts). id is equal on all
  // ranks and distinct per call. The memory lives while any rank holds it; ordering accesses
  // (e.g. with barriers) is the caller's business.
  virtual std::shared_ptr<void> shared_memory(size_t bytes, uint64_t id) = 0;
  // The library's own collectives (MPI), or nullptr.
  virtual NativeCollectives* native() { return nullptr; }

  // True when more ranks of this host than cores are polling: waits then yield at once.
  virtual bool oversubscribed() const = 0;

  // The pipelining unit that suits this transport (CommOptions::segment_bytes = 0 uses it):
  // small enough on threads that both sides share the copying, large on mpi where every
  // message costs a rendezvous and the receiver's core does the copy anyway.
  virtual size_t default_segment_bytes() const = 0;

  // Payload bytes this rank has posted to send on this group (collectives and point to point,
  // counted where the communicator posts them; not the library's native collectives): the
  // measured traffic of gradient compression and its tests.
  uint64_t sent_bytes() const { return sent_bytes_.load(std::memory_order_relaxed); }
  void count_sent(size_t bytes) { sent_bytes_.fetch_add(bytes, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> sent_bytes_{0};
};

// Collectives of an underlying library, used by Algorithm::kNative. They cannot be interrupted:
// when a deadline passes inside one, the process group is aborted (MPI_Abort) with a message
// naming the op, so a stuck peer still ends the job instead of hanging it.
class NativeCollectives {
 public:
  virtual ~NativeCollectives() = default;
  virtual void allreduce(void* buf, size_t count, ElemType elem, ReduceOp op, const Stamp& stamp,
                         Deadline deadline) = 0;
  virtual void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts,
                              ElemType elem, ReduceOp op, const Stamp& stamp,
                              Deadline deadline) = 0;
  virtual void allgather(const void* in, void* out, const std::vector<size_t>& counts,
                         ElemType elem, const Stamp& stamp, Deadline deadline) = 0;
  virtual void broadcast(void* buf, size_t count, ElemType elem, int root, const Stamp& stamp,
                         Deadline deadline) = 0;
  virtual void reduce(void* buf, size_t count, ElemType elem, ReduceOp op, int root,
                      const Stamp& stamp, Deadline deadline) = 0;
  virtual void gather(const void* in, void* out, size_t count, ElemType elem, int root,
                      const Stamp& stamp, Deadline deadline) = 0;
  virtual void all_to_all(const void* in, void* out, size_t count, ElemType elem,
                          const Stamp& stamp, Deadline deadline) = 0;
  virtual void barrier(const Stamp& stamp, Deadline deadline) = 0;
};

}  // namespace tessel::comm
