#include "tessel/comm/transport.h"

#include <memory>

#include "reduce.h"
#include "tessel/core/error.h"

namespace tessel::comm {

const char* op_kind_name(OpKind k) {
  constexpr const char* kNames[] = {"none",      "allreduce", "reduce_scatter", "allgather",
                                    "broadcast", "reduce",    "gather",         "all_to_all",
                                    "barrier",   "send/recv", "split",          "shared_memory"};
  return kNames[static_cast<size_t>(k)];
}

std::string describe(const Stamp& s) {
  if (s.op == OpKind::kP2p)
    return str("send/recv (tag ", s.seq, ", ", s.count, " x ", elem_name(s.elem), ")");
  std::string out = str(op_kind_name(s.op), " #", s.seq, " (", s.count, " x ", elem_name(s.elem));
  bool reduces =
      s.op == OpKind::kAllreduce || s.op == OpKind::kReduceScatter || s.op == OpKind::kReduce;
  if (reduces) out += str(", ", reduce_op_name(s.reduce));
  if (s.root >= 0) out += str(", root ", s.root);
  if (s.algorithm != Algorithm::kAuto) out += str(", ", algorithm_name(s.algorithm));
  if (s.label != 0) out += str(", label ", s.label);
  return out + ")";
}

namespace {

// irecv into a private buffer, reduce into the accumulator once the bytes are in.
class ReduceOnArrival final : public Request {
 public:
  ReduceOnArrival(void* acc, size_t count, ElemType elem, ReduceOp op)
      : tmp_(std::make_unique_for_overwrite<char[]>(count * elem_size(elem))),
        acc_(acc),
        count_(count),
        elem_(elem),
        op_(op) {}
  void start(RequestPtr inner) { inner_ = std::move(inner); }
  void* buffer() { return tmp_.get(); }

  bool test() override {
    if (reduced_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }
  void wait(Deadline deadline) override {
    if (reduced_) return;
    inner_->wait(deadline);
    finish();
  }

 private:
  void finish() {
    reduce_into(acc_, tmp_.get(), count_, elem_, op_);
    reduced_ = true;
  }
  std::unique_ptr<char[]> tmp_;
  RequestPtr inner_;
  void* acc_;
  size_t count_;
  ElemType elem_;
  ReduceOp op_;
  bool reduced_ = false;
};

}  // namespace

RequestPtr Transport::irecv_reduce(int peer, uint64_t tag, void* acc, size_t count, ElemType elem,
                                   ReduceOp op, const Stamp& stamp) {
  auto req = std::make_unique<ReduceOnArrival>(acc, count, elem, op);
  req->start(irecv(peer, tag, req->buffer(), count * elem_size(elem), stamp));
  return req;
}

}  // namespace tessel::comm
