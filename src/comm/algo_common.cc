#include "algo_common.h"

#include <algorithm>
#include <cstdlib>
#include <deque>

#include "tessel/core/error.h"

namespace tessel::comm {

Scratch::~Scratch() {
  for (void* p : data_) std::free(p);
}

void* Scratch::get(int slot, size_t bytes) {
  TESSEL_CHECK(slot >= 0 && slot < kSlots, "scratch slot ", slot);
  if (bytes > bytes_[slot]) {
    std::free(data_[slot]);
    size_t rounded = (std::max<size_t>(bytes, 64) + 63) / 64 * 64;
    data_[slot] = std::aligned_alloc(64, rounded);
    if (!data_[slot]) {
      bytes_[slot] = 0;
      throw std::bad_alloc();
    }
    bytes_[slot] = rounded;
  }
  return data_[slot];
}

std::vector<size_t> even_counts(size_t count, int n) {
  std::vector<size_t> out(n);
  for (int i = 0; i < n; ++i) out[i] = count / n + (static_cast<size_t>(i) < count % n ? 1 : 0);
  return out;
}

Blocks::Blocks(const std::vector<size_t>& counts) : counts_(counts), off_(counts.size() + 1, 0) {
  for (size_t i = 0; i < counts.size(); ++i) {
    off_[i + 1] = off_[i] + counts[i];
    max_ = std::max(max_, counts[i]);
  }
}

void Pending::wait_all(Deadline d) {
  for (auto& r : reqs_) r->wait(d);
  reqs_.clear();
}

RequestPtr post_send(const CollContext& ctx, int peer, const void* data, size_t count, ElemType e) {
  ctx.transport->count_sent(count * elem_size(e));
  return ctx.transport->isend(peer, ctx.tag, data, count * elem_size(e), ctx.stamp);
}

RequestPtr post_recv(const CollContext& ctx, int peer, void* data, size_t count, ElemType e) {
  return ctx.transport->irecv(peer, ctx.tag, data, count * elem_size(e), ctx.stamp);
}

RequestPtr post_recv_reduce(const CollContext& ctx, int peer, void* acc, size_t count, ElemType e,
                            ReduceOp op) {
  return ctx.transport->irecv_reduce(peer, ctx.tag, acc, count, e, op, ctx.stamp);
}

size_t segment_elems(const CollContext& ctx, ElemType e) {
  return std::max<size_t>(1, ctx.segment_bytes / elem_size(e));
}

void exchange(const CollContext& ctx, int send_peer, const void* send, size_t send_count,
              int recv_peer, void* recv, size_t recv_count, ElemType e, bool reduce, ReduceOp op) {
  const size_t seg = segment_elems(ctx, e);
  // An empty message still goes out: it carries the stamp that detects mismatched calls.
  const size_t ns = send_peer < 0 ? 0 : std::max<size_t>(1, (send_count + seg - 1) / seg);
  const size_t nr = recv_peer < 0 ? 0 : std::max<size_t>(1, (recv_count + seg - 1) / seg);
  const size_t window = static_cast<size_t>(std::max(1, ctx.in_flight));
  std::deque<RequestPtr> sends, recvs;
  size_t posted_s = 0, posted_r = 0, done_r = 0;
  auto seg_len = [&](size_t i, size_t total) {
    return std::min(seg, total - std::min(total, i * seg));
  };
  while (done_r < nr || posted_s < ns || !sends.empty()) {
    // Sends first: on mpi, posting a receive may copy a waiting message on the spot, and the
    // peer should not wait for this rank's send meanwhile.
    while (posted_s < ns && sends.size() < window) {
      sends.push_back(
          post_send(ctx, send_peer, at(send, posted_s * seg, e), seg_len(posted_s, send_count), e));
      ++posted_s;
    }
    while (posted_r < nr && recvs.size() < window) {
      void* dst = at(recv, posted_r * seg, e);
      size_t len = seg_len(posted_r, recv_count);
      recvs.push_back(reduce ? post_recv_reduce(ctx, recv_peer, dst, len, e, op)
                             : post_recv(ctx, recv_peer, dst, len, e));
      ++posted_r;
    }
    done_r += complete_oldest(ctx, recvs, sends);
  }
}

size_t complete_oldest(const CollContext& ctx, std::deque<RequestPtr>& recvs,
                       std::deque<RequestPtr>& sends) {
  size_t done = 0;
  if (!recvs.empty()) {
    recvs.front()->wait(ctx.deadline);
    recvs.pop_front();
    done = 1;
  } else if (!sends.empty()) {
    sends.front()->wait(ctx.deadline);
    sends.pop_front();
  }
  while (!sends.empty() && sends.front()->test()) sends.pop_front();
  return done;
}

}  // namespace tessel::comm
