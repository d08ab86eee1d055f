// Building blocks shared by the algorithm schedules. Internal to the comm area.
#pragma once

#include <cstddef>
#include <cstring>
#include <deque>
#include <vector>

#include "tessel/comm/algorithms.h"

namespace tessel::comm {

// Block i of a buffer split into per-rank blocks: elements [begin(i), begin(i) + count(i)).
class Blocks {
 public:
  explicit Blocks(const std::vector<size_t>& counts);
  int n() const { return static_cast<int>(counts_.size()); }
  size_t begin(int i) const { return off_[i]; }
  size_t end(int i) const { return off_[i + 1]; }
  size_t count(int i) const { return counts_[i]; }
  size_t total() const { return off_.back(); }
  size_t max_count() const { return max_; }

 private:
  std::vector<size_t> counts_;
  std::vector<size_t> off_;
  size_t max_ = 0;
};

inline char* at(void* base, size_t elems, ElemType e) {
  return static_cast<char*>(base) + elems * elem_size(e);
}
inline const char* at(const void* base, size_t elems, ElemType e) {
  return static_cast<const char*>(base) + elems * elem_size(e);
}
inline void copy_elems(void* dst, const void* src, size_t count, ElemType e) {
  if (count && dst != src) std::memcpy(dst, src, count * elem_size(e));
}

// Outstanding requests of one schedule; destroying it cancels what is left (on error paths).
class Pending {
 public:
  void add(RequestPtr r) { reqs_.push_back(std::move(r)); }
  void wait_all(Deadline d);

 private:
  std::vector<RequestPtr> reqs_;
};

RequestPtr post_send(const CollContext& ctx, int peer, const void* data, size_t count, ElemType e);
RequestPtr post_recv(const CollContext& ctx, int peer, void* data, size_t count, ElemType e);
RequestPtr post_recv_reduce(const CollContext& ctx, int peer, void* acc, size_t count, ElemType e,
                            ReduceOp op);

// One exchange step: send `send_count` elements to send_peer and receive `recv_count` into
// recv (reduced into it when reduce is set) from recv_peer, both cut into segments of
// ctx.segment_bytes with ctx.in_flight of each direction outstanding, so that on every
// transport the copy or reduction of one segment overlaps the transfer of the next. A peer of
// -1 skips that direction. Both sides derive the same segments from the same counts.
void exchange(const CollContext& ctx, int send_peer, const void* send, size_t send_count,
              int recv_peer, void* recv, size_t recv_count, ElemType e, bool reduce, ReduceOp op);

// Receives buf from `from` (-1: this rank has it) in segments and forwards each segment to
// every rank in `to` as soon as it is in: the pipelined step of chain and tree broadcasts.
void forward_segments(const CollContext& ctx, void* buf, size_t count, ElemType e, int from,
                      const std::vector<int>& to);

size_t segment_elems(const CollContext& ctx, ElemType e);

// One step of a segmented pipeline: waits for the oldest receive (or, once none is left, the
// oldest send), then drops the sends already done. Returns the receives completed (0 or 1).
size_t complete_oldest(const CollContext& ctx, std::deque<RequestPtr>& recvs,
                       std::deque<RequestPtr>& sends);

}  // namespace tessel::comm
