// Binomial-tree and direct (star / all-pairs) schedules. Tree terms: vr is the rank relative to
// the root, (r - root) mod n; in a binomial tree the parent of vr is vr with its lowest set bit
// cleared and its children are vr + mask for every power of two mask below that bit.
#include <algorithm>

#include "algo_common.h"

namespace tessel::comm {
namespace {

int real_rank(int vr, int root, int n) { return (vr + root) % n; }

// Binomial reduce to root. With keep_input, ranks other than the root leave buf unchanged
// (inner nodes accumulate in scratch).
void tree_reduce(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op, int root,
                 bool keep_input) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  const int vr = (r - root + n) % n;
  void* acc = buf;
  if (keep_input && vr != 0 && (vr & 1) == 0 && vr + 1 < n) {  // has children
    acc = ctx.scratch->get(1, count * elem_size(e));
    copy_elems(acc, buf, count, e);
  }
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {  // hand the partial result to the parent and stop
      exchange(ctx, real_rank(vr - mask, root, n), acc, count, -1, nullptr, 0, e, false, op);
      return;
    }
    if (vr + mask < n)  // reduce in one child's subtree result
      exchange(ctx, -1, nullptr, 0, real_rank(vr + mask, root, n), acc, count, e, true, op);
  }
}

}  // namespace

void reduce_tree(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op,
                 int root) {
  tree_reduce(ctx, buf, count, e, op, root, true);
}

void broadcast_tree(const CollContext& ctx, void* buf, size_t count, ElemType e, int root) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  const int vr = (r - root + n) % n;
  // The parent clears vr's lowest set bit; the children add each lower power of two.
  int mask = 1, parent = -1;
  for (; mask < n; mask <<= 1) {
    if (vr & mask) {
      parent = real_rank(vr - mask, root, n);
      break;
    }
  }
  std::vector<int> children;  // largest subtree first
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (vr + mask < n) children.push_back(real_rank(vr + mask, root, n));
  forward_segments(ctx, buf, count, e, parent, children);
}

void allreduce_tree(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op) {
  tree_reduce(ctx, buf, count, e, op, 0, false);
  broadcast_tree(ctx, buf, count, e, 0);
}

void reduce_direct(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op,
                   int root) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  if (r != root) {
    exchange(ctx, root, buf, count, -1, nullptr, 0, e, false, op);
    return;
  }
  // One peer at a time, in rank order: the sum is the same on every run.
  for (int i = 0; i < n; ++i)
    if (i != root) exchange(ctx, -1, nullptr, 0, i, buf, count, e, true, op);
}

void broadcast_direct(const CollContext& ctx, void* buf, size_t count, ElemType e, int root) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Pending pending;
  if (r == root) {
    for (int i = 0; i < n; ++i)
      if (i != root) pending.add(post_send(ctx, i, buf, count, e));
  } else {
    pending.add(post_recv(ctx, root, buf, count, e));
  }
  pending.wait_all(ctx.deadline);
}

void allreduce_direct(const CollContext& ctx, void* buf, size_t count, ElemType e, ReduceOp op) {
  // To rank 0 and back: the parameter-server pattern.
  reduce_direct(ctx, buf, count, e, op, 0);
  broadcast_direct(ctx, buf, count, e, 0);
}

void reduce_scatter_direct(const CollContext& ctx, const void* in, void* out,
                           const std::vector<size_t>& counts, ElemType e, ReduceOp op) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Blocks b(counts);
  // Everyone sends block j straight to rank j; rank j reduces them in rank order.
  // Sends go out in the segments that the receiving exchange() expects.
  const size_t seg = segment_elems(ctx, e);
  Pending sends;
  for (int k = 1; k < n; ++k) {
    int j = (r + k) % n;
    size_t cnt = b.count(j);
    for (size_t off = 0; off < cnt || off == 0; off += seg)
      sends.add(post_send(ctx, j, at(in, b.begin(j) + off, e), std::min(seg, cnt - off), e));
  }
  copy_elems(out, at(in, b.begin(r), e), b.count(r), e);
  for (int i = 0; i < n; ++i)
    if (i != r) exchange(ctx, -1, nullptr, 0, i, out, b.count(r), e, true, op);
  sends.wait_all(ctx.deadline);
}

void allgather_direct(const CollContext& ctx, const void* in, void* out,
                      const std::vector<size_t>& counts, ElemType e) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Blocks b(counts);
  copy_elems(at(out, b.begin(r), e), in, b.count(r), e);
  Pending pending;
  for (int k = 1; k < n; ++k) {
    int from = (r + n - k) % n, to = (r + k) % n;
    pending.add(post_recv(ctx, from, at(out, b.begin(from), e), b.count(from), e));
    pending.add(post_send(ctx, to, at(out, b.begin(r), e), b.count(r), e));
  }
  pending.wait_all(ctx.deadline);
}

void gather_direct(const CollContext& ctx, const void* in, void* out, size_t count, ElemType e,
                   int root) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Pending pending;
  if (r == root) {
    for (int i = 0; i < n; ++i)
      if (i != root) pending.add(post_recv(ctx, i, at(out, i * count, e), count, e));
    copy_elems(at(out, r * count, e), in, count, e);
  } else {
    pending.add(post_send(ctx, root, in, count, e));
  }
  pending.wait_all(ctx.deadline);
}

void all_to_all_direct(const CollContext& ctx, const void* in, void* out, size_t count,
                       ElemType e) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  copy_elems(at(out, r * count, e), at(in, r * count, e), count, e);
  // Step k pairs r with r + k and r - k, so every rank talks to a different peer at a time.
  Pending pending;
  for (int k = 1; k < n; ++k) {
    int from = (r + n - k) % n, to = (r + k) % n;
    pending.add(post_recv(ctx, from, at(out, from * count, e), count, e));
    pending.add(post_send(ctx, to, at(in, to * count, e), count, e));
  }
  pending.wait_all(ctx.deadline);
}

void barrier_dissemination(const CollContext& ctx) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  for (int k = 1; k < n; k <<= 1) {
    Pending pending;
    pending.add(post_recv(ctx, (r + n - k) % n, nullptr, 0, ElemType::kU8));
    pending.add(post_send(ctx, (r + k) % n, nullptr, 0, ElemType::kU8));
    pending.wait_all(ctx.deadline);
  }
}

}  // namespace tessel::comm
