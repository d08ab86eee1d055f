// Communicator: the collectives that parallel strategies call, over one Transport (a group of
// ranks). Each call picks an algorithm (per call, per communicator, or kAuto by size and world
// size), stamps every message with (op, sequence number, count, dtype, root) so that ranks which
// disagree get an error naming both sides, and runs under a deadline. Any failure (deadline,
// mismatch, peer failure, exception in a rank of run_threads) aborts the group and every group
// split from the same root: all later calls on every rank throw CommError at once.
// Async calls run in order on a per-communicator progress thread (started on first use); a
// blocking call first waits for the async calls before it. One user thread at a time may call
// a Communicator; buffers must stay valid and untouched until the call (or its Work) completes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/transport.h"
#include "tessel/comm/types.h"
#include "tessel/tensor/tensor.h"

namespace tessel::comm {

// Where kAuto switches algorithm, in bytes of the whole buffer (allreduce: the buffer;
// reduce-scatter: the input; allgather: the output). Defaults measured with `tessel bench comm`
// on the 2-core reference machine (docs/comm.md).
struct AutoThresholds {
  // From this size on: ring (allreduce, reduce-scatter, allgather, broadcast, reduce); below:
  // halving-doubling (recursive doubling up to 32 KiB), and tree for broadcast and reduce.
  // A quarter of it when the world size is not a power of two (halving-doubling's fold costs
  // two extra full-size steps there).
  size_t ring_min_bytes = 1 << 20;
  // The same for power-of-two worlds on the mpi transport, where every message costs a
  // rendezvous: halving-doubling's 2 log2 n messages beat the ring's 2(n-1) up to here.
  size_t mpi_ring_min_bytes = 32 << 20;
  size_t native_max_bytes = 0;  // mpi transport: native MPI up to this size (0: never)
};

struct CommOptions {
  double timeout_s = 300;  // deadline of every blocking call (config comm.timeout_s)
  Algorithm algorithm = Algorithm::kAuto;  // default for calls that leave it kAuto, where the
                                           // collective supports it (else kAuto applies)
  AutoThresholds thresholds;
  size_t segment_bytes = 0;  // ring pipelining unit; 0: the transport's (threads 1 MiB, mpi 4 MiB)
  int in_flight = 4;         // ring segments in flight per direction
  double spin_us = 20;       // busy-poll before yielding the core (0 = yield at once)
  double yield_us = 2000;    // then yield the core this long before sleeping
};

struct CallOptions {
  Algorithm algorithm = Algorithm::kAuto;  // kAuto: the communicator's default, then thresholds
  double timeout_s = 0;                    // 0: the communicator's timeout_s
  // Travels in the call's stamp: ranks whose calls differ only in their label (e.g. gathering
  // the parameters of different blocks) get an error naming both labels, not a silent match.
  uint32_t label = 0;
};

namespace detail {
struct WorkState;
struct CommState;
}  // namespace detail

// Handle of an async call. Copyable; all copies refer to the same call. Used by one thread at
// a time; wait for every Work before destroying its communicator.
class Work {
 public:
  Work() = default;  // complete already
  explicit Work(std::shared_ptr<detail::WorkState> s) : s_(std::move(s)) {}
  bool done() const;  // true once finished, successfully or not; never blocks or throws
  // Until the call ends (it fails by itself at its own deadline); rethrows its CommError.
  void wait() const;
  // As wait(), but gives up at `deadline`: the group is then aborted, the call stopped, and
  // CommError thrown.
  void wait(Deadline deadline) const;

 private:
  std::shared_ptr<detail::WorkState> s_;
};

class Communicator {
 public:
  Communicator();  // an invalid communicator (e.g. what split() returns for color < 0)
  explicit Communicator(std::unique_ptr<Transport> transport, CommOptions options = {});
  ~Communicator();  // waits for async calls still running (aborting them at their deadline)
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  bool valid() const { return s_ != nullptr; }
  int rank() const;
  int size() const;
  Backend backend() const;
  const CommOptions& options() const;
  Transport& transport();

  // ---- blocking collectives ----
  void allreduce(void* buf, size_t count, ElemType elem, ReduceOp op = ReduceOp::kSum,
                 const CallOptions& call = {});
  // Equal blocks: in holds count * size() elements, out count elements.
  void reduce_scatter(const void* in, void* out, size_t count, ElemType elem,
                      ReduceOp op = ReduceOp::kSum, const CallOptions& call = {});
  // Variable blocks: in holds sum(counts), out counts[rank()] (e.g. ZeRO shards r*n/P..).
  // out may be this rank's own block of in (in place); the rest of in is then clobbered.
  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, ElemType elem,
                      ReduceOp op = ReduceOp::kSum, const CallOptions& call = {});
  void allgather(const void* in, void* out, size_t count, ElemType elem,
                 const CallOptions& call = {});
  void allgather(const void* in, void* out, const std::vector<size_t>& counts, ElemType elem,
                 const CallOptions& call = {});
  void broadcast(void* buf, size_t count, ElemType elem, int root, const CallOptions& call = {});
  // root's buf becomes the reduction; the others' buf is unchanged.
  void reduce(void* buf, size_t count, ElemType elem, ReduceOp op, int root,
              const CallOptions& call = {});
  // out (count * size() elements) is written on root only and may be null elsewhere.
  void gather(const void* in, void* out, size_t count, ElemType elem, int root,
              const CallOptions& call = {});
  void all_to_all(const void* in, void* out, size_t count, ElemType elem,
                  const CallOptions& call = {});
  void barrier(const CallOptions& call = {});

  // Point to point; tag in [0, 2^30). Matched in order per (peer, tag); count and dtype must
  // agree with the peer's call.
  void send(const void* buf, size_t count, ElemType elem, int peer, int tag = 0,
            const CallOptions& call = {});
  void recv(void* buf, size_t count, ElemType elem, int peer, int tag = 0,
            const CallOptions& call = {});

  // Collective: ranks with equal color form a new communicator, ordered by (key, rank).
  // color < 0 returns an invalid communicator. Options are inherited.
  Communicator split(int color, int key);
  // Collective: memory shared by every rank of this communicator (Transport::shared_memory),
  // or nullptr when its ranks do not share a host. Every rank must pass the same size.
  std::shared_ptr<void> shared_memory(size_t bytes);
  // Ranks of this communicator's job that run on this host: threads, the whole group; mpi,
  // the launcher's local size (OMPI_COMM_WORLD_LOCAL_SIZE, 1 if unset). Spare cores are
  // hardware_concurrency() minus this.
  int ranks_on_host() const;

  // ---- async variants: start now (in call order), complete on the progress thread ----
  Work allreduce_async(void* buf, size_t count, ElemType elem, ReduceOp op = ReduceOp::kSum,
                       const CallOptions& call = {});
  Work reduce_scatter_async(const void* in, void* out, const std::vector<size_t>& counts,
                            ElemType elem, ReduceOp op = ReduceOp::kSum,
                            const CallOptions& call = {});
  Work allgather_async(const void* in, void* out, const std::vector<size_t>& counts, ElemType elem,
                       const CallOptions& call = {});
  Work isend(const void* buf, size_t count, ElemType elem, int peer, int tag = 0,
             const CallOptions& call = {});
  Work irecv(void* buf, size_t count, ElemType elem, int peer, int tag = 0,
             const CallOptions& call = {});

  // ---- tensor conveniences ----
  void broadcast(const Tensor& t, int root, const CallOptions& call = {});
  // out.numel() == in.numel() * size(); in may be out's own block (in place).
  void allgather(const Tensor& in, const Tensor& out, const CallOptions& call = {});
  // in.numel() == out.numel() * size().
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::kSum,
                      const CallOptions& call = {});
  void send(const Tensor& t, int peer, int tag = 0, const CallOptions& call = {});
  void recv(const Tensor& t, int peer, int tag = 0, const CallOptions& call = {});

  // ---- failure ----
  // Poisons this group and every group split from the same root, on every rank.
  void abort(const std::string& reason) noexcept;
  bool aborted() const;

  // The algorithm a call would use (resolves kAuto); for the bench, logs and tests.
  Algorithm choose(OpKind op, size_t bytes, Algorithm requested = Algorithm::kAuto) const;

 private:
  std::unique_ptr<detail::CommState> s_;
};

}  // namespace tessel::comm
