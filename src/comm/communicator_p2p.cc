// Point-to-point calls and the tensor conveniences of Communicator.
#include "comm_state.h"
#include "tessel/comm/communicator.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

using detail::CommState;

constexpr int kMaxUserTag = (1 << 30) - 1;

Stamp p2p_stamp(size_t count, ElemType elem, int tag) {
  Stamp s;
  s.op = OpKind::kP2p;
  s.elem = elem;
  s.seq = static_cast<uint64_t>(tag);
  s.count = count;
  return s;
}

void check_p2p(const CommState& s, const void* buf, size_t count, int peer, int tag) {
  if (peer < 0 || peer >= s.transport->size())
    throw InvalidArgument(str("comm: peer rank out of range, got ", peer, " in a group of ",
                              s.transport->size(), "; use 0..", s.transport->size() - 1));
  if (tag < 0 || tag > kMaxUserTag)
    throw InvalidArgument(str("comm: tag out of range, got ", tag, "; use 0..", kMaxUserTag));
  if (!buf && count > 0)
    throw InvalidArgument(str("comm: send/recv buffer is null with ", count, " elements"));
}

double timeout_of(const CommState& s, const CallOptions& o) {
  return o.timeout_s > 0 ? o.timeout_s : s.options.timeout_s;
}

Work start_p2p(CommState& s, bool is_send, void* buf, size_t count, ElemType elem, int peer,
               int tag) {
  check_p2p(s, buf, count, peer, tag);
  s.transport->check_alive();
  auto w = std::make_shared<detail::WorkState>();
  w->p2p = true;
  w->policy = s.policy;
  w->transport = s.transport.get();
  w->what = str(is_send ? "send to" : "recv from", " rank ", peer, " (tag ", tag, ") on rank ",
                s.transport->rank());
  Stamp stamp = p2p_stamp(count, elem, tag);
  uint64_t ttag = static_cast<uint64_t>(tag) + 1;
  size_t bytes = count * elem_size(elem);
  if (is_send) s.transport->count_sent(bytes);
  w->request = is_send ? s.transport->isend(peer, ttag, buf, bytes, stamp)
                       : s.transport->irecv(peer, ttag, buf, bytes, stamp);
  return Work(w);
}

void check_tensor(const Tensor& t, const char* what) {
  if (!t.defined())
    throw InvalidArgument(str("comm: ", what, " tensor is undefined; allocate it first"));
}

}  // namespace

Work Communicator::isend(const void* buf, size_t count, ElemType elem, int peer, int tag,
                         const CallOptions&) {
  return start_p2p(*s_, true, const_cast<void*>(buf), count, elem, peer, tag);
}

Work Communicator::irecv(void* buf, size_t count, ElemType elem, int peer, int tag,
                         const CallOptions&) {
  return start_p2p(*s_, false, buf, count, elem, peer, tag);
}

void Communicator::send(const void* buf, size_t count, ElemType elem, int peer, int tag,
                        const CallOptions& call) {
  isend(buf, count, elem, peer, tag, call).wait(Deadline::after(timeout_of(*s_, call)));
}

void Communicator::recv(void* buf, size_t count, ElemType elem, int peer, int tag,
                        const CallOptions& call) {
  irecv(buf, count, elem, peer, tag, call).wait(Deadline::after(timeout_of(*s_, call)));
}

void Communicator::broadcast(const Tensor& t, int root, const CallOptions& call) {
  check_tensor(t, "broadcast");
  broadcast(t.raw(), static_cast<size_t>(t.numel()), elem_type(t.dtype()), root, call);
}

void Communicator::allgather(const Tensor& in, const Tensor& out, const CallOptions& call) {
  check_tensor(in, "allgather input");
  check_tensor(out, "allgather output");
  if (in.dtype() != out.dtype() || out.numel() != in.numel() * size())
    throw InvalidArgument(
        str("comm: allgather output must hold size() x input elements of the "
            "same dtype, got ",
            out.numel(), " ", dtype_name(out.dtype()), " for ", in.numel(), " ",
            dtype_name(in.dtype()), " x ", size()));
  allgather(in.raw(), out.raw(), static_cast<size_t>(in.numel()), elem_type(in.dtype()), call);
}

void Communicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                  const CallOptions& call) {
  check_tensor(in, "reduce_scatter input");
  check_tensor(out, "reduce_scatter output");
  if (in.dtype() != out.dtype() || in.numel() != out.numel() * size())
    throw InvalidArgument(
        str("comm: reduce_scatter input must hold size() x output elements of "
            "the same dtype, got ",
            in.numel(), " ", dtype_name(in.dtype()), " for ", out.numel(), " ",
            dtype_name(out.dtype()), " x ", size()));
  reduce_scatter(in.raw(), out.raw(), static_cast<size_t>(out.numel()), elem_type(in.dtype()), op,
                 call);
}

void Communicator::send(const Tensor& t, int peer, int tag, const CallOptions& call) {
  check_tensor(t, "send");
  send(t.raw(), static_cast<size_t>(t.numel()), elem_type(t.dtype()), peer, tag, call);
}

void Communicator::recv(const Tensor& t, int peer, int tag, const CallOptions& call) {
  check_tensor(t, "recv");
  recv(t.raw(), static_cast<size_t>(t.numel()), elem_type(t.dtype()), peer, tag, call);
}

}  // namespace tessel::comm
