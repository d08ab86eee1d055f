// Recursive halving-doubling (Rabenseifner). Terms: p is the largest power of two <= n and
// rem = n - p. Fold: each of the first 2 * rem ranks pairs up (2i, 2i+1); the even one hands its
// data to the odd one and sits out. The p remaining ranks get virtual ranks v (odd 2i+1 -> i,
// rank j >= 2 rem -> j - rem), and virtual rank v stands for the contiguous real ranks
// group(v) = {2v, 2v+1} or {v + rem}, hence for a contiguous element range of the rank blocks.
// Halving: in round `mask` (p/2, p/4, .., 1) partners v and v ^ mask split their current range
// of virtual ranks in two, each sends the half it gives up and reduces in the half it keeps.
// Doubling: the reverse, each sends its range and receives the partner's. Unfold: the odd
// rank of a pair hands the result to its even partner.
#include <algorithm>

#include "algo_common.h"

namespace tessel::comm {
namespace {

struct Fold {
  int n, p, rem;
  explicit Fold(int size) : n(size), p(1) {
    while (p * 2 <= n) p *= 2;
    rem = n - p;
  }
  int vrank(int r) const { return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem; }
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  int first_real(int v) const { return v < rem ? 2 * v : v + rem; }
  int last_real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
};

// Element range of virtual ranks [vlo, vhi).
struct Range {
  size_t begin, count;
};
Range range_of(const Fold& f, const Blocks& b, int vlo, int vhi) {
  size_t lo = b.begin(f.first_real(vlo)), hi = b.end(f.last_real(vhi - 1));
  return {lo, hi - lo};
}

// Halving rounds: on return the active rank v holds the reduction of range_of(v, v + 1).
// With src set, buf starts empty: the first round sends straight from src and copies only the
// half it keeps (a reduce-scatter leaves its input untouched without copying all of it).
void halving(const CollContext& ctx, void* buf, const Fold& f, const Blocks& b, int v, ElemType e,
             ReduceOp op, const void* src = nullptr) {
  int vlo = 0, vhi = f.p;
  for (int mask = f.p / 2; mask >= 1; mask /= 2) {
    int mid = vlo + mask, partner = f.real(v ^ mask);
    Range keep = v < mid ? range_of(f, b, vlo, mid) : range_of(f, b, mid, vhi);
    Range give = v < mid ? range_of(f, b, mid, vhi) : range_of(f, b, vlo, mid);
    const void* from = at(buf, give.begin, e);
    if (src) {
      copy_elems(at(buf, keep.begin, e), at(src, keep.begin, e), keep.count, e);
      from = at(src, give.begin, e);
      src = nullptr;
    }
    exchange(ctx, partner, from, give.count, partner, at(buf, keep.begin, e), keep.count, e, true,
             op);
    if (v < mid)
      vhi = mid;
    else
      vlo = mid;
  }
}

// Doubling rounds: from range_of(v, v + 1) on every active rank to the whole buffer.
void doubling(const CollContext& ctx, void* buf, const Fold& f, const Blocks& b, int v,
              ElemType e) {
  for (int mask = 1; mask < f.p; mask *= 2) {
    int mine = v & ~(mask - 1), theirs = mine ^ mask, partner = f.real(v ^ mask);
    Range give = range_of(f, b, mine, mine + mask);
    Range take = range_of(f, b, theirs, theirs + mask);
    exchange(ctx, partner, at(buf, give.begin, e), give.count, partner, at(buf, take.begin, e),
             take.count, e, false, ReduceOp::kSum);
  }
}

// Short messages: plain recursive doubling, log2 p rounds in which partners swap the whole
// buffer and both reduce. Half the rounds of halving + doubling, at p/2 times the volume, which
// is the better trade while latency dominates. a op b equals b op a bit for bit, so every rank
// still ends with the same bits.
void whole_doubling(const CollContext& ctx, void* buf, size_t count, const Fold& f, int v,
                    ElemType e, ReduceOp op) {
  void* mine = ctx.scratch->get(2, count * elem_size(e));
  for (int mask = 1; mask < f.p; mask <<= 1) {
    int partner = f.real(v ^ mask);
    copy_elems(mine, buf, count, e);  // the partner reads this copy while buf takes its data
    exchange(ctx, partner, mine, count, partner, buf, count, e, true, op);
  }
}

}  // namespace

void allreduce_halving_doubling(const CollContext& ctx, void* buf, size_t count, ElemType e,
                                ReduceOp op) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  if (n == 1) return;
  Fold f(n);
  Blocks b(even_counts(count, n));
  const int v = f.vrank(r);
  // Fold: the even rank of a pair hands everything to its odd partner.
  if (r < 2 * f.rem) {
    if (v < 0)
      exchange(ctx, r + 1, buf, count, -1, nullptr, 0, e, false, op);
    else
      exchange(ctx, -1, nullptr, 0, r - 1, buf, count, e, true, op);
  }
  if (v >= 0 && count * elem_size(e) <= kWholeDoublingMaxBytes) {
    whole_doubling(ctx, buf, count, f, v, e, op);
  } else if (v >= 0) {
    halving(ctx, buf, f, b, v, e, op);
    doubling(ctx, buf, f, b, v, e);
  }
  // Unfold: the odd rank hands the result back.
  if (r < 2 * f.rem) {
    if (v < 0)
      exchange(ctx, -1, nullptr, 0, r + 1, buf, count, e, false, op);
    else
      exchange(ctx, r - 1, buf, count, -1, nullptr, 0, e, false, op);
  }
}

void reduce_scatter_halving_doubling(const CollContext& ctx, const void* in, void* out,
                                     const std::vector<size_t>& counts, ElemType e, ReduceOp op) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Fold f(n);
  Blocks b(counts);
  const int v = f.vrank(r);
  if (n == 1) return copy_elems(out, in, b.count(r), e);
  if (f.rem == 0 && out == at(in, b.begin(r), e)) {
    // In place (out is this rank's own block of in): halve within the input itself, which
    // leaves block r reduced where it is (the first half of an all-reduce, no copies).
    halving(ctx, const_cast<void*>(in), f, b, v, e, op);
    return;
  }
  void* work = ctx.scratch->get(0, b.total() * elem_size(e));
  const void* src = in;  // what the first halving round reads
  if (r < 2 * f.rem) {
    if (v < 0) {
      exchange(ctx, r + 1, in, b.total(), -1, nullptr, 0, e, false, op);
    } else {
      copy_elems(work, in, b.total(), e);
      exchange(ctx, -1, nullptr, 0, r - 1, work, b.total(), e, true, op);
      src = nullptr;
    }
  }
  if (v >= 0) halving(ctx, work, f, b, v, e, op, src);
  // The odd rank of a pair holds both blocks of the pair: hand the even one its block.
  if (r < 2 * f.rem) {
    if (v < 0) {
      exchange(ctx, -1, nullptr, 0, r + 1, out, b.count(r), e, false, op);
      return;
    }
    exchange(ctx, r - 1, at(work, b.begin(r - 1), e), b.count(r - 1), -1, nullptr, 0, e, false, op);
  }
  copy_elems(out, at(work, b.begin(r), e), b.count(r), e);
}

void allgather_halving_doubling(const CollContext& ctx, const void* in, void* out,
                                const std::vector<size_t>& counts, ElemType e) {
  const int n = ctx.transport->size(), r = ctx.transport->rank();
  Fold f(n);
  Blocks b(counts);
  const int v = f.vrank(r);
  copy_elems(at(out, b.begin(r), e), in, b.count(r), e);
  if (n == 1) return;
  // Fold: the even rank of a pair hands its own block to its odd partner.
  if (r < 2 * f.rem) {
    if (v < 0)
      exchange(ctx, r + 1, at(out, b.begin(r), e), b.count(r), -1, nullptr, 0, e, false,
               ReduceOp::kSum);
    else
      exchange(ctx, -1, nullptr, 0, r - 1, at(out, b.begin(r - 1), e), b.count(r - 1), e, false,
               ReduceOp::kSum);
  }
  if (v >= 0) doubling(ctx, out, f, b, v, e);
  if (r < 2 * f.rem) {
    if (v < 0)
      exchange(ctx, -1, nullptr, 0, r + 1, out, b.total(), e, false, ReduceOp::kSum);
    else
      exchange(ctx, r - 1, out, b.total(), -1, nullptr, 0, e, false, ReduceOp::kSum);
  }
}

}  // namespace tessel::comm
