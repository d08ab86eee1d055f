// Collective algorithms as stateless functions over a Transport (the Communicator picks one per
// call; tests and the bench call them directly). Each function is a fixed schedule of
// isend / irecv / irecv_reduce that every rank of the group runs with equal arguments; the
// result is bitwise identical on every rank. Buffers are the caller's; temporary memory comes
// from ctx.scratch. kAvg is summed here (the Communicator divides afterwards).
// Counts are in elements. For the variable-size calls, counts[i] is rank i's block and blocks
// lie back to back in rank order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tessel/comm/transport.h"
#include "tessel/comm/types.h"

namespace tessel::comm {

// Halving-doubling all-reduces up to this size swap whole buffers (log2 p rounds of the whole
// buffer, fewer latencies than halving it); larger ones reduce-scatter then all-gather.
constexpr size_t kWholeDoublingMaxBytes = 32 << 10;

// Reusable temporary memory (64-byte aligned, grows, never shrinks). Not thread safe: one per
// communicator, used by one collective at a time.
class Scratch {
 public:
  Scratch() = default;
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // A buffer of at least `bytes` for slot 0..kSlots-1; valid until the next get() of that slot.
  void* get(int slot, size_t bytes);
  static constexpr int kSlots = 3;

 private:
  void* data_[kSlots] = {};
  size_t bytes_[kSlots] = {};
};

// Everything an algorithm needs besides its buffers.
struct CollContext {
  Transport* transport = nullptr;
  Stamp stamp;       // carried by every message of the call
  uint64_t tag = 0;  // transport tag of this group's collective traffic
  Deadline deadline = Deadline::never();
  size_t segment_bytes = 1 << 20;  // ring / chain pipelining unit
  int in_flight = 4;               // segments in flight per direction (ring / chain)
  Scratch* scratch = nullptr;      // required for the calls that need temporary memory
};

// Splits `count` elements into n nearly equal blocks (the first count % n get one more).
std::vector<size_t> even_counts(size_t count, int n);

// --- allreduce: buf (count elements, every rank) becomes the reduction over all ranks ---
// ring: reduce-scatter then allgather around the ring, 2(n-1) steps, each block cut into
// segments of ctx.segment_bytes with ctx.in_flight in flight. Bandwidth optimal, n-1 latencies.
void allreduce_ring(const CollContext& ctx, void* buf, size_t count, ElemType elem, ReduceOp op);
// Rabenseifner: recursive-halving reduce-scatter then recursive-doubling allgather over the
// largest power of two p <= n; the n - p extra ranks fold into a partner first and get the
// result back last. 2 log2(p) (+2) latencies, bandwidth optimal when n is a power of two.
void allreduce_halving_doubling(const CollContext& ctx, void* buf, size_t count, ElemType elem,
                                ReduceOp op);
// Binomial-tree reduce to rank 0, then binomial broadcast. 2 log2(n) latencies, whole
// messages on every edge: for small messages.
void allreduce_tree(const CollContext& ctx, void* buf, size_t count, ElemType elem, ReduceOp op);
// Every rank sends to rank 0, which reduces in rank order and sends the result back (the
// parameter-server pattern). 2 latencies, rank 0 moves 2(n-1) messages.
void allreduce_direct(const CollContext& ctx, void* buf, size_t count, ElemType elem, ReduceOp op);

// --- reduce_scatter: in holds sum(counts) elements on every rank; out (counts[rank]) gets this
// rank's block of the reduction. in is not modified. ---
void reduce_scatter_ring(const CollContext& ctx, const void* in, void* out,
                         const std::vector<size_t>& counts, ElemType elem, ReduceOp op);
void reduce_scatter_halving_doubling(const CollContext& ctx, const void* in, void* out,
                                     const std::vector<size_t>& counts, ElemType elem, ReduceOp op);
void reduce_scatter_direct(const CollContext& ctx, const void* in, void* out,
                           const std::vector<size_t>& counts, ElemType elem, ReduceOp op);

// --- allgather: in (counts[rank] elements) lands at block `rank` of out (sum(counts)) on every
// rank. in may point at its own block of out (in place). ---
void allgather_ring(const CollContext& ctx, const void* in, void* out,
                    const std::vector<size_t>& counts, ElemType elem);
void allgather_halving_doubling(const CollContext& ctx, const void* in, void* out,
                                const std::vector<size_t>& counts, ElemType elem);
void allgather_direct(const CollContext& ctx, const void* in, void* out,
                      const std::vector<size_t>& counts, ElemType elem);

// --- broadcast: root's buf is copied into every rank's buf ---
void broadcast_tree(const CollContext& ctx, void* buf, size_t count, ElemType elem, int root);
// ring: a pipelined chain root -> root+1 -> ... in segments; for large messages.
void broadcast_ring(const CollContext& ctx, void* buf, size_t count, ElemType elem, int root);
void broadcast_direct(const CollContext& ctx, void* buf, size_t count, ElemType elem, int root);

// --- reduce: root's buf becomes the reduction; other ranks' buf is left unchanged ---
void reduce_tree(const CollContext& ctx, void* buf, size_t count, ElemType elem, ReduceOp op,
                 int root);
void reduce_direct(const CollContext& ctx, void* buf, size_t count, ElemType elem, ReduceOp op,
                   int root);
// ring: ring reduce-scatter, then every block is sent to the root. For large messages.
void reduce_ring(const CollContext& ctx, void* buf, size_t count, ElemType elem, ReduceOp op,
                 int root);

// --- gather: every rank's in (count elements) lands at block `rank` of root's out ---
void gather_direct(const CollContext& ctx, const void* in, void* out, size_t count, ElemType elem,
                   int root);

// --- all_to_all: block j of in (count elements each) goes to rank j, landing at block `rank`
// of its out. in and out must not overlap. ---
void all_to_all_direct(const CollContext& ctx, const void* in, void* out, size_t count,
                       ElemType elem);

// --- barrier: dissemination, ceil(log2 n) rounds of empty messages ---
void barrier_dissemination(const CollContext& ctx);

}  // namespace tessel::comm
