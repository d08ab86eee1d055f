// Ring schedules. Terms: the buffer is cut into n blocks, one per rank (Blocks); every block is
// cut into S segments of ctx.segment_bytes (S from the largest block, so every rank derives the
// same S); a step moves one block from each rank to its successor. A unit is one segment of one
// step; unit u = (step - first_step) * S + segment. Sends and receives run ctx.in_flight units
// ahead, so the reduction of one segment overlaps the transfer of the next.
#include <algorithm>
#include <deque>

#include "algo_common.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

// Where the ring's blocks live. In place (buf set), every block sits at its Blocks offset of
// buf. For a reduce-scatter (in set), the input stays untouched: step 0 sends straight from in,
// and each block this rank reduces into is staged from in, one segment just before its receive
// is posted, into work (its own block r into out). That copies (n-1)/n of the input once,
// interleaved with the transfers, instead of copying all of it up front.
struct RingStorage {
  void* buf = nullptr;
  const void* in = nullptr;
  void* work = nullptr;
  void* out = nullptr;
};

// Steps [g0, g1) of the ring. Step g (0 <= g < 2(n-1)): rank r sends block (r - g - 1) to r + 1
// and receives block (r - g - 2) from r - 1, reducing it in for g < n - 1 (reduce-scatter
// phase) and copying it for g >= n - 1 (allgather phase). After step n - 2 rank r holds the
// reduction of its own block r, which the allgather phase starts by sending.
void ring_pass(const CollContext& ctx, const RingStorage& m, const Blocks& b, int g0, int g1,
               ElemType e, ReduceOp op) {
  const int n = b.n(), r = ctx.transport->rank();
  if (n == 1 || g0 >= g1) return;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t seg = segment_elems(ctx, e);
  const size_t S = std::max<size_t>(1, (b.max_count() + seg - 1) / seg);
  const size_t units = static_cast<size_t>(g1 - g0) * S;
  const size_t window = static_cast<size_t>(std::max(1, ctx.in_flight));
  auto block_at = [&](size_t unit, int shift) {
    int g = g0 + static_cast<int>(unit / S);
    return ((r - g - shift) % n + n) % n;
  };
  // Segment of `unit` in block blk: offset lo within the block, length len.
  auto piece = [&](int blk, size_t unit, size_t* lo, size_t* len) {
    size_t cnt = b.count(blk);
    *lo = std::min(cnt, (unit % S) * seg);
    *len = std::min(seg, cnt - *lo);
  };
  // Start of block blk's working copy.
  auto base = [&](int blk) -> void* {
    if (m.buf) return at(m.buf, b.begin(blk), e);
    return blk == r ? m.out : at(m.work, b.begin(blk), e);
  };
  auto send_ptr = [&](int blk, size_t unit, size_t lo) -> const void* {
    if (!m.buf && g0 + static_cast<int>(unit / S) == 0) return at(m.in, b.begin(blk) + lo, e);
    return at(base(blk), lo, e);
  };

  std::deque<RequestPtr> sends, recvs;
  size_t posted_s = 0, posted_r = 0, done_r = 0;
  while (done_r < units || posted_s < units || !sends.empty()) {
    // Post sends whose data is final (the first step's, or the segment received one step ago)
    // before receives: on mpi, posting a receive may copy a waiting message on the spot, and the
    // peer should not wait for this rank's send meanwhile.
    while (posted_s < units && sends.size() < window && (posted_s < S || posted_s - S < done_r)) {
      size_t lo, len;
      int blk = block_at(posted_s, 1);
      piece(blk, posted_s, &lo, &len);
      sends.push_back(post_send(ctx, next, send_ptr(blk, posted_s, lo), len, e));
      ++posted_s;
    }
    // Post receives ahead (reduce-scatter units reduce straight into the block).
    while (posted_r < units && recvs.size() < window) {
      size_t lo, len;
      int blk = block_at(posted_r, 2);
      piece(blk, posted_r, &lo, &len);
      void* dst = at(base(blk), lo, e);
      bool reduce = g0 + static_cast<int>(posted_r / S) < n - 1;
      if (reduce && !m.buf) copy_elems(dst, at(m.in, b.begin(blk) + lo, e), len, e);  // stage
      recvs.push_back(reduce ? post_recv_reduce(ctx, prev, dst, len, e, op)
                             : post_recv(ctx, prev, dst, len, e));
      ++posted_r;
    }
    // Complete the oldest receive (or, at the end, the oldest send).
    done_r += complete_oldest(ctx, recvs, sends);
  }
}

}  // namespace

void forward_segments(const CollContext& ctx, void* buf, size_t count, ElemType e, int from,
                      const std::vector<int>& to) {
  const size_t seg = segment_elems(ctx, e);
  const size_t S = std::max<size_t>(1, (count + seg - 1) / seg);
  const size_t window = static_cast<size_t>(std::max(1, ctx.in_flight));
  const size_t fanout = std::max<size_t>(1, to.size());
  auto len_of = [&](size_t k) { return std::min(seg, count - std::min(count, k * seg)); };
  std::deque<RequestPtr> sends, recvs;
  // The root (from < 0) has every segment already; a leaf (to empty) sends nothing.
  size_t posted_r = from < 0 ? S : 0, done_r = posted_r, posted_s = to.empty() ? S : 0;
  while (done_r < S || posted_s < S || !sends.empty()) {
    while (posted_r < S && recvs.size() < window) {
      recvs.push_back(post_recv(ctx, from, at(buf, posted_r * seg, e), len_of(posted_r), e));
      ++posted_r;
    }
    // Forward every segment received so far to every destination.
    while (posted_s < S && sends.size() < window * fanout && posted_s < done_r) {
      for (int peer : to)
        sends.push_back(post_send(ctx, peer, at(buf, posted_s * seg, e), len_of(posted_s), e));
      ++posted_s;
    }
    done_r += complete_oldest(ctx, recvs, sends);
  }
}

void allreduce_ring(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op) {
  const int n = ctx.transport->size();
  RingStorage m;
  m.buf = buf;
  ring_pass(ctx, m, Blocks(even_counts(count, n)), 0, 2 * (n - 1), e, op);
}

void reduce_scatter_ring(const CollContext& ctx, const void* in, void* out,
                         const std::vector<size_t>& counts, ElemType e, ReduceOp op) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Blocks b(counts);
  if (n == 1) return copy_elems(out, in, b.count(r), e);
  RingStorage m;
  if (out == at(in, b.begin(r), e)) {
    // In place: the ring's first n - 1 steps of an all-reduce leave block r reduced in place,
    // using the rest of the input as its working space (no staging copies).
    m.buf = const_cast<void*>(in);
  } else {
    m.in = in;
    m.work = ctx.scratch->get(0, b.total() * elem_size(e));
    m.out = out;
  }
  ring_pass(ctx, m, b, 0, n - 1, e, op);
}

void allgather_ring(const CollContext& ctx, const void* in, void* out,
                    const std::vector<size_t>& counts, ElemType e) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Blocks b(counts);
  copy_elems(at(out, b.begin(r), e), in, b.count(r), e);
  RingStorage m;
  m.buf = out;
  ring_pass(ctx, m, b, n - 1, 2 * (n - 1), e, ReduceOp::kSum);
}

void reduce_ring(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op,
                 int root) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Blocks b(even_counts(count, n));
  if (n == 1) return;
  // Phase 1: ring reduce-scatter that leaves buf untouched; the root accumulates its own block
  // in place (that block is neither sent at step 0 nor read after it is staged).
  RingStorage m;
  m.in = buf;
  m.work = ctx.scratch->get(0, count * elem_size(e));
  m.out = r == root ? at(buf, b.begin(r), e) : ctx.scratch->get(1, b.count(r) * elem_size(e));
  ring_pass(ctx, m, b, 0, n - 1, e, op);
  // Phase 2: every rank sends its reduced block to the root.
  Pending pending;
  if (r == root) {
    for (int i = 0; i < n; ++i)
      if (i != r) pending.add(post_recv(ctx, i, at(buf, b.begin(i), e), b.count(i), e));
  } else {
    pending.add(post_send(ctx, root, m.out, b.count(r), e));
  }
  pending.wait_all(ctx.deadline);
}

void broadcast_ring(const CollContext& ctx, void* buf, size_t count, ElemType e, int root) {
  // A chain root -> root+1 -> ... -> root-1; each rank forwards a segment as soon as it has it.
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  if (n == 1) return;
  const int vr = (r - root + n) % n;
  std::vector<int> next;
  if (vr != n - 1) next.push_back((r + 1) % n);
  forward_segments(ctx, buf, count, e, vr == 0 ? -1 : (r + n - 1) % n, next);
}

}  // namespace tessel::comm
