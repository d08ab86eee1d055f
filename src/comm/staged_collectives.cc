#include "tessel/comm/staged_collectives.h"

#include <numeric>

namespace tessel::comm {

StagedCollectives::StagedCollectives(Communicator& group, Device device, void* stream)
    : group_(group), runtime_(device_runtime(device)), device_(device), stream_(stream) {}

// Device -> host returns once the host copy may be read (after the kernels that wrote p).
char* StagedCollectives::down(const void* p, size_t at, size_t count, ElemType elem) {
  const size_t size = elem_size(elem);
  if (host_.size() < (at + count) * size) host_.resize((at + count) * size);
  runtime_.copy(host_.data() + at * size, Device::kCpu, p, device_, count * size, stream_);
  return host_.data();
}

void StagedCollectives::up(void* p, const char* host, size_t count, ElemType elem) {
  runtime_.copy(p, device_, host, Device::kCpu, count * elem_size(elem), stream_);
}

NcclWork StagedCollectives::allreduce(void* buf, size_t count, ElemType elem, ReduceOp op,
                                      const CallOptions& call) {
  char* host = down(buf, 0, count, elem);
  group_.allreduce(host, count, elem, op, call);
  up(buf, host, count, elem);
  return NcclWork();  // done already
}

NcclWork StagedCollectives::reduce_scatter(const void* in, void* out,
                                           const std::vector<size_t>& counts, ElemType elem,
                                           ReduceOp op, const CallOptions& call) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t own = std::accumulate(counts.begin(), counts.begin() + rank(), size_t{0});
  char* host = down(in, 0, total, elem);
  char* mine = host + own * elem_size(elem);
  group_.reduce_scatter(host, mine, counts, elem, op, call);  // in place, into this rank's block
  up(out, mine, counts[static_cast<size_t>(rank())], elem);
  return NcclWork();
}

NcclWork StagedCollectives::allgather(const void* in, void* out, const std::vector<size_t>& counts,
                                      ElemType elem, const CallOptions& call) {
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  const size_t mine = counts[static_cast<size_t>(rank())];
  // The gathered blocks first, this rank's block behind them (in may lie inside out).
  char* host = down(in, total, mine, elem);
  group_.allgather(host + total * elem_size(elem), host, counts, elem, call);
  up(out, host, total, elem);
  return NcclWork();
}

NcclWork StagedCollectives::send(const void* buf, size_t count, ElemType elem, int peer,
                                 const CallOptions& call) {
  reap(false);
  auto s = std::make_unique<Sending>();
  s->bytes.resize(count * elem_size(elem));
  runtime_.copy(s->bytes.data(), Device::kCpu, buf, device_, s->bytes.size(), stream_);
  s->work = group_.isend(s->bytes.data(), count, elem, peer, 0, call);
  sending_.push_back(std::move(s));
  return NcclWork();  // buf's bytes are on the host: it may be reused
}

NcclWork StagedCollectives::recv(void* buf, size_t count, ElemType elem, int peer,
                                 const CallOptions& call) {
  const size_t bytes = count * elem_size(elem);
  if (host_.size() < bytes) host_.resize(bytes);
  group_.recv(host_.data(), count, elem, peer, 0, call);
  up(buf, host_.data(), count, elem);
  return NcclWork();
}

void StagedCollectives::reap(bool all) {
  // In order: a peer takes one link's messages in the order they were sent.
  while (!sending_.empty() && (all || sending_.front()->work.done())) {
    const std::unique_ptr<Sending> s = std::move(sending_.front());
    sending_.pop_front();
    s->work.wait();  // rethrows a failed send
  }
}

void StagedCollectives::close() { reap(true); }

}  // namespace tessel::comm
