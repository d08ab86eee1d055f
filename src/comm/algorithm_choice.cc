#include "algorithm_choice.h"

#include "tessel/core/error.h"

namespace tessel::comm::detail {
namespace {

bool supports(OpKind op, Algorithm a) {
  using A = Algorithm;
  switch (op) {
    case OpKind::kAllreduce:
      return a != A::kAuto;
    case OpKind::kReduceScatter:
    case OpKind::kAllgather:
      return a == A::kRing || a == A::kHalvingDoubling || a == A::kDirect || a == A::kNative;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return a == A::kTree || a == A::kRing || a == A::kDirect || a == A::kNative;
    case OpKind::kGather:
    case OpKind::kAllToAll:
      return a == A::kDirect || a == A::kNative;
    case OpKind::kBarrier:
      return a == A::kHalvingDoubling || a == A::kNative;
    default:
      return false;
  }
}

std::string supported_list(OpKind op) {
  std::string out;
  for (Algorithm a : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree,
                      Algorithm::kDirect, Algorithm::kNative})
    if (supports(op, a)) out += str(out.empty() ? "" : ", ", algorithm_name(a));
  return out;
}

bool is_pow2(int n) { return (n & (n - 1)) == 0; }

Algorithm auto_pick(const CommState& s, OpKind op, size_t bytes) {
  const AutoThresholds& t = s.options.thresholds;
  const int n = s.transport->size();
  if (s.transport->native() && t.native_max_bytes > 0 && bytes <= t.native_max_bytes &&
      supports(op, Algorithm::kNative))
    return Algorithm::kNative;
  // Halving-doubling pays two extra full-size steps to fold a non-power-of-two world, so the
  // ring takes over 4x earlier there.
  const bool mpi = s.transport->backend() == Backend::kMpi;
  const size_t ring_min = !is_pow2(n) ? t.ring_min_bytes / 4
                          : mpi       ? t.mpi_ring_min_bytes
                                      : t.ring_min_bytes;
  switch (op) {
    case OpKind::kAllreduce:
    case OpKind::kReduceScatter:
    case OpKind::kAllgather:
      return bytes >= ring_min ? Algorithm::kRing : Algorithm::kHalvingDoubling;
    case OpKind::kBroadcast:
    case OpKind::kReduce:
      return bytes >= ring_min ? Algorithm::kRing : Algorithm::kTree;
    case OpKind::kBarrier:
      return Algorithm::kHalvingDoubling;
    default:
      return Algorithm::kDirect;
  }
}

}  // namespace

Algorithm resolve(const CommState& s, OpKind op, size_t bytes, Algorithm requested) {
  if (requested != Algorithm::kAuto) {
    if (!supports(op, requested))
      throw InvalidArgument(str("comm: ", op_kind_name(op), " has no algorithm ",
                                algorithm_name(requested), "; use auto or one of ",
                                supported_list(op)));
    if (requested == Algorithm::kNative && !s.transport->native())
      throw InvalidArgument(str("comm: algorithm native needs the mpi transport, got the ",
                                backend_name(s.transport->backend()),
                                " transport; pick another algorithm"));
    return requested;
  }
  Algorithm def = s.options.algorithm;
  if (def != Algorithm::kAuto && supports(op, def) &&
      (def != Algorithm::kNative || s.transport->native()))
    return def;
  return auto_pick(s, op, bytes);
}

}  // namespace tessel::comm::detail
