#include "tessel/comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "algorithm_choice.h"
#include "comm_state.h"
#include "reduce.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/trace.h"

namespace tessel::comm {
namespace {

using detail::CommState;

// Transport tags: collectives share one (per-pair FIFO order keeps their messages apart),
// point-to-point tag t travels as t + 1.
constexpr uint64_t kCollectiveTag = 0;

// One call's description: what the stamp and the algorithm choice are made from.
struct Call {
  OpKind op;
  ElemType elem = ElemType::kU8;
  ReduceOp reduce = ReduceOp::kSum;
  int root = -1;
  size_t count = 0;  // elements (total for variable-size calls)
  size_t bytes = 0;  // what the thresholds compare
  CallOptions options;
};

using Body = std::function<void(const CollContext&, Algorithm)>;

// Builds the call's stamp and context; consumes a sequence number (in call order).
CollContext prepare(CommState& s, const Call& c, Algorithm* algorithm) {
  *algorithm = detail::resolve(s, c.op, c.bytes, c.options.algorithm);
  CollContext ctx;
  ctx.transport = s.transport.get();
  ctx.stamp = Stamp{c.op, c.elem, c.reduce, *algorithm, c.root, s.seq++, c.count, c.options.label};
  ctx.tag = kCollectiveTag;
  size_t segment =
      s.options.segment_bytes ? s.options.segment_bytes : s.transport->default_segment_bytes();
  ctx.segment_bytes = std::max<size_t>(segment, 64);
  ctx.in_flight = std::max(1, s.options.in_flight);
  ctx.scratch = &s.scratch;
  return ctx;
}

double timeout_of(const CommState& s, const CallOptions& o) {
  return o.timeout_s > 0 ? o.timeout_s : s.options.timeout_s;
}

void set_job_ranks(CommState& s, std::vector<int> ranks) {
  std::string text(1, '[');
  for (size_t i = 0; i < ranks.size(); ++i) text += str(i ? "," : "", ranks[i]);
  text += ']';
  s.job_ranks = std::move(ranks);
  s.job_ranks_json = std::move(text);
}

// A collective's span in the trace: what, how many bytes, the algorithm, the ranks of the job
// taking part, and the (group, seq) that pairs the span with the other ranks' spans of it.
void trace_call(Tracer& tracer, const CommState& s, const Stamp& st, double start) {
  const double end = now_seconds();
  TraceArgs args;
  args.num("bytes", static_cast<double>(st.count * elem_size(st.elem)))
      .num("count", static_cast<double>(st.count))
      .text("dtype", elem_name(st.elem))
      .text("algorithm", algorithm_name(st.algorithm))
      .json("peers", s.job_ranks_json)
      .text("group", s.group)
      .num("seq", static_cast<double>(st.seq));
  if (st.label) args.num("label", st.label);
  if (st.root >= 0) args.num("root", st.root);
  tracer.span(op_kind_name(st.op), "comm", start, end, std::move(args));
}

// Runs a prepared call, traced into `tracer` unless null. Any failure aborts the whole family of
// groups: a rank that leaves a collective early would otherwise leave its peers waiting for the
// deadline.
void execute(CommState& s, CollContext ctx, Algorithm a, double timeout_s, const Body& body,
             Tracer* tracer) {
  ctx.deadline = Deadline::after(timeout_s);
  const double start = tracer ? now_seconds() : 0;
  try {
    body(ctx, a);
  } catch (const CommError& e) {
    s.transport->abort(e.what());
    throw;
  } catch (const std::exception& e) {
    s.transport->abort(str("comm: ", describe(ctx.stamp), " failed on rank ", s.transport->rank(),
                           ": ", e.what()));
    throw;
  }
  if (tracer) trace_call(*tracer, s, ctx.stamp, start);
}

void run_blocking(CommState& s, const Call& c, const Body& body) {
  s.drain();
  s.transport->check_alive();
  Algorithm a;
  CollContext ctx = prepare(s, c, &a);
  execute(s, ctx, a, timeout_of(s, c.options), body, active_tracer());
}

Work run_async(CommState& s, const Call& c, Body body) {
  s.transport->check_alive();
  Algorithm a;
  CollContext ctx = prepare(s, c, &a);
  if (!s.progress) s.progress = std::make_unique<detail::Progress>(s.policy);
  auto w = std::make_shared<detail::WorkState>();
  w->policy = s.policy;
  w->transport = s.transport.get();
  w->what = str(describe(ctx.stamp), " on rank ", s.transport->rank());
  double timeout = timeout_of(s, c.options);
  // The progress thread records into the caller's tracer, on its own row, if the caller was
  // recording when it made the call (in call order: the same decision on every rank).
  w->task = [&s, ctx, a, timeout, body = std::move(body), tracer = active_tracer()] {
    execute(s, ctx, a, timeout, body, tracer);
  };
  s.progress->submit(w);
  return Work(w);
}

void check_buffer(const void* p, size_t count, const char* what) {
  if (!p && count > 0)
    throw InvalidArgument(str("comm: ", what, " is null with ", count, " elements; pass a buffer"));
}

void check_root(const CommState& s, int root) {
  if (root < 0 || root >= s.transport->size())
    throw InvalidArgument(str("comm: root rank out of range, got ", root, " in a group of ",
                              s.transport->size(), "; use 0..", s.transport->size() - 1));
}

void check_counts(const CommState& s, const std::vector<size_t>& counts) {
  if (counts.size() != static_cast<size_t>(s.transport->size()))
    throw InvalidArgument(str("comm: counts must have one entry per rank, got ", counts.size(),
                              " for a group of ", s.transport->size()));
}

NativeCollectives& native_of(const CollContext& ctx) { return *ctx.transport->native(); }

}  // namespace

Communicator::Communicator() = default;
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

Communicator::Communicator(std::unique_ptr<Transport> transport, CommOptions options)
    : s_(std::make_unique<CommState>()) {
  TESSEL_CHECK(transport != nullptr, "communicator without a transport");
  if (!(options.timeout_s > 0))
    throw InvalidArgument(str("comm: timeout_s must be > 0, got ", options.timeout_s,
                              "; set comm.timeout_s to a positive number of seconds"));
  s_->transport = std::move(transport);
  s_->options = options;
  s_->policy.spin_us = options.spin_us;
  s_->policy.yield_us = options.yield_us;
  s_->policy.oversubscribed = s_->transport->oversubscribed();
  std::vector<int> ranks(static_cast<size_t>(s_->transport->size()));
  for (size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  set_job_ranks(*s_, std::move(ranks));
}

int Communicator::rank() const { return s_->transport->rank(); }
int Communicator::size() const { return s_->transport->size(); }
Backend Communicator::backend() const { return s_->transport->backend(); }
const CommOptions& Communicator::options() const { return s_->options; }
Transport& Communicator::transport() { return *s_->transport; }

void Communicator::abort(const std::string& reason) noexcept {
  if (s_) s_->transport->abort(reason);
}

bool Communicator::aborted() const { return s_ && s_->transport->aborted(); }

Algorithm Communicator::choose(OpKind op, size_t bytes, Algorithm requested) const {
  return detail::resolve(*s_, op, bytes, requested);
}

// ---- allreduce ----

namespace {
Body allreduce_body(void* buf, size_t count, ElemType elem, ReduceOp op) {
  return [=](const CollContext& ctx, Algorithm a) {
    switch (a) {
      case Algorithm::kRing:
        allreduce_ring(ctx, buf, count, elem, op);
        break;
      case Algorithm::kHalvingDoubling:
        allreduce_halving_doubling(ctx, buf, count, elem, op);
        break;
      case Algorithm::kTree:
        allreduce_tree(ctx, buf, count, elem, op);
        break;
      case Algorithm::kDirect:
        allreduce_direct(ctx, buf, count, elem, op);
        break;
      case Algorithm::kNative:
        native_of(ctx).allreduce(buf, count, elem, op, ctx.stamp, ctx.deadline);
        break;
      case Algorithm::kAuto:
        TESSEL_CHECK(false, "unresolved algorithm");
    }
    if (op == ReduceOp::kAvg) divide_by(buf, count, elem, ctx.transport->size());
  };
}

Call allreduce_call(void* buf, size_t count, ElemType elem, ReduceOp op, const CallOptions& o) {
  check_buffer(buf, count, "allreduce buffer");
  check_reducible(elem, op);
  return Call{OpKind::kAllreduce, elem, op, -1, count, count * elem_size(elem), o};
}
}  // namespace

void Communicator::allreduce(void* buf, size_t count, ElemType elem, ReduceOp op,
                             const CallOptions& call) {
  run_blocking(*s_, allreduce_call(buf, count, elem, op, call),
               allreduce_body(buf, count, elem, op));
}

Work Communicator::allreduce_async(void* buf, size_t count, ElemType elem, ReduceOp op,
                                   const CallOptions& call) {
  return run_async(*s_, allreduce_call(buf, count, elem, op, call),
                   allreduce_body(buf, count, elem, op));
}

// ---- reduce_scatter ----

namespace {
Body reduce_scatter_body(const void* in, void* out, std::vector<size_t> counts, ElemType elem,
                         ReduceOp op) {
  return [=](const CollContext& ctx, Algorithm a) {
    switch (a) {
      case Algorithm::kRing:
        reduce_scatter_ring(ctx, in, out, counts, elem, op);
        break;
      case Algorithm::kHalvingDoubling:
        reduce_scatter_halving_doubling(ctx, in, out, counts, elem, op);
        break;
      case Algorithm::kDirect:
        reduce_scatter_direct(ctx, in, out, counts, elem, op);
        break;
      case Algorithm::kNative:
        native_of(ctx).reduce_scatter(in, out, counts, elem, op, ctx.stamp, ctx.deadline);
        break;
      default:
        TESSEL_CHECK(false, "unsupported algorithm");
    }
    if (op == ReduceOp::kAvg)
      divide_by(out, counts[ctx.transport->rank()], elem, ctx.transport->size());
  };
}

Call reduce_scatter_call(const CommState& s, const void* in, void* out,
                         const std::vector<size_t>& counts, ElemType elem, ReduceOp op,
                         const CallOptions& o) {
  check_counts(s, counts);
  size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  check_buffer(in, total, "reduce_scatter input");
  check_buffer(out, counts[s.transport->rank()], "reduce_scatter output");
  check_reducible(elem, op);
  return Call{OpKind::kReduceScatter, elem, op, -1, total, total * elem_size(elem), o};
}
}  // namespace

void Communicator::reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts,
                                  ElemType elem, ReduceOp op, const CallOptions& call) {
  run_blocking(*s_, reduce_scatter_call(*s_, in, out, counts, elem, op, call),
               reduce_scatter_body(in, out, counts, elem, op));
}

void Communicator::reduce_scatter(const void* in, void* out, size_t count, ElemType elem,
                                  ReduceOp op, const CallOptions& call) {
  reduce_scatter(in, out, std::vector<size_t>(size(), count), elem, op, call);
}

Work Communicator::reduce_scatter_async(const void* in, void* out,
                                        const std::vector<size_t>& counts, ElemType elem,
                                        ReduceOp op, const CallOptions& call) {
  return run_async(*s_, reduce_scatter_call(*s_, in, out, counts, elem, op, call),
                   reduce_scatter_body(in, out, counts, elem, op));
}

// ---- allgather ----

namespace {
Body allgather_body(const void* in, void* out, std::vector<size_t> counts, ElemType elem) {
  return [=](const CollContext& ctx, Algorithm a) {
    switch (a) {
      case Algorithm::kRing:
        return allgather_ring(ctx, in, out, counts, elem);
      case Algorithm::kHalvingDoubling:
        return allgather_halving_doubling(ctx, in, out, counts, elem);
      case Algorithm::kDirect:
        return allgather_direct(ctx, in, out, counts, elem);
      case Algorithm::kNative:
        return native_of(ctx).allgather(in, out, counts, elem, ctx.stamp, ctx.deadline);
      default:
        TESSEL_CHECK(false, "unsupported algorithm");
    }
  };
}

Call allgather_call(const CommState& s, const void* in, void* out,
                    const std::vector<size_t>& counts, ElemType elem, const CallOptions& o) {
  check_counts(s, counts);
  size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  check_buffer(in, counts[s.transport->rank()], "allgather input");
  check_buffer(out, total, "allgather output");
  return Call{OpKind::kAllgather, elem, ReduceOp::kSum, -1, total, total * elem_size(elem), o};
}
}  // namespace

void Communicator::allgather(const void* in, void* out, const std::vector<size_t>& counts,
                             ElemType elem, const CallOptions& call) {
  run_blocking(*s_, allgather_call(*s_, in, out, counts, elem, call),
               allgather_body(in, out, counts, elem));
}

void Communicator::allgather(const void* in, void* out, size_t count, ElemType elem,
                             const CallOptions& call) {
  allgather(in, out, std::vector<size_t>(size(), count), elem, call);
}

Work Communicator::allgather_async(const void* in, void* out, const std::vector<size_t>& counts,
                                   ElemType elem, const CallOptions& call) {
  return run_async(*s_, allgather_call(*s_, in, out, counts, elem, call),
                   allgather_body(in, out, counts, elem));
}

// ---- broadcast / reduce ----

namespace {
Body broadcast_body(void* buf, size_t count, ElemType elem, int root) {
  return [=](const CollContext& ctx, Algorithm a) {
    switch (a) {
      case Algorithm::kTree:
        return broadcast_tree(ctx, buf, count, elem, root);
      case Algorithm::kRing:
        return broadcast_ring(ctx, buf, count, elem, root);
      case Algorithm::kDirect:
        return broadcast_direct(ctx, buf, count, elem, root);
      case Algorithm::kNative:
        return native_of(ctx).broadcast(buf, count, elem, root, ctx.stamp, ctx.deadline);
      default:
        TESSEL_CHECK(false, "unsupported algorithm");
    }
  };
}

Body reduce_body(void* buf, size_t count, ElemType elem, ReduceOp op, int root) {
  return [=](const CollContext& ctx, Algorithm a) {
    switch (a) {
      case Algorithm::kTree:
        reduce_tree(ctx, buf, count, elem, op, root);
        break;
      case Algorithm::kRing:
        reduce_ring(ctx, buf, count, elem, op, root);
        break;
      case Algorithm::kDirect:
        reduce_direct(ctx, buf, count, elem, op, root);
        break;
      case Algorithm::kNative:
        native_of(ctx).reduce(buf, count, elem, op, root, ctx.stamp, ctx.deadline);
        break;
      default:
        TESSEL_CHECK(false, "unsupported algorithm");
    }
    if (op == ReduceOp::kAvg && ctx.transport->rank() == root)
      divide_by(buf, count, elem, ctx.transport->size());
  };
}
}  // namespace

void Communicator::broadcast(void* buf, size_t count, ElemType elem, int root,
                             const CallOptions& call) {
  check_buffer(buf, count, "broadcast buffer");
  check_root(*s_, root);
  run_blocking(
      *s_,
      Call{OpKind::kBroadcast, elem, ReduceOp::kSum, root, count, count * elem_size(elem), call},
      broadcast_body(buf, count, elem, root));
}

void Communicator::reduce(void* buf, size_t count, ElemType elem, ReduceOp op, int root,
                          const CallOptions& call) {
  check_buffer(buf, count, "reduce buffer");
  check_root(*s_, root);
  check_reducible(elem, op);
  run_blocking(*s_, Call{OpKind::kReduce, elem, op, root, count, count * elem_size(elem), call},
               reduce_body(buf, count, elem, op, root));
}

// ---- gather / all_to_all / barrier ----

void Communicator::gather(const void* in, void* out, size_t count, ElemType elem, int root,
                          const CallOptions& call) {
  check_root(*s_, root);
  check_buffer(in, count, "gather input");
  if (rank() == root) check_buffer(out, count * size(), "gather output");
  run_blocking(*s_,
               Call{OpKind::kGather, elem, ReduceOp::kSum, root, count,
                    count * elem_size(elem) * size(), call},
               [=](const CollContext& ctx, Algorithm a) {
                 if (a == Algorithm::kNative)
                   native_of(ctx).gather(in, out, count, elem, root, ctx.stamp, ctx.deadline);
                 else
                   gather_direct(ctx, in, out, count, elem, root);
               });
}

void Communicator::all_to_all(const void* in, void* out, size_t count, ElemType elem,
                              const CallOptions& call) {
  check_buffer(in, count * size(), "all_to_all input");
  check_buffer(out, count * size(), "all_to_all output");
  if (in == out && count > 0 && size() > 1)
    throw InvalidArgument("comm: all_to_all input and output are the same buffer; pass two");
  run_blocking(*s_,
               Call{OpKind::kAllToAll, elem, ReduceOp::kSum, -1, count,
                    count * elem_size(elem) * size(), call},
               [=](const CollContext& ctx, Algorithm a) {
                 if (a == Algorithm::kNative)
                   native_of(ctx).all_to_all(in, out, count, elem, ctx.stamp, ctx.deadline);
                 else
                   all_to_all_direct(ctx, in, out, count, elem);
               });
}

void Communicator::barrier(const CallOptions& call) {
  run_blocking(*s_, Call{OpKind::kBarrier, ElemType::kU8, ReduceOp::kSum, -1, 0, 0, call},
               [](const CollContext& ctx, Algorithm a) {
                 if (a == Algorithm::kNative)
                   native_of(ctx).barrier(ctx.stamp, ctx.deadline);
                 else
                   barrier_dissemination(ctx);
               });
}

// ---- split ----

Communicator Communicator::split(int color, int key) {
  const int n = size(), r = rank();
  // Everyone learns everyone's (color, key), then each group orders itself by (key, old rank).
  std::vector<int64_t> mine{color, key}, all(2 * static_cast<size_t>(n));
  run_blocking(*s_, Call{OpKind::kSplit, ElemType::kI64, ReduceOp::kSum, -1, 2, 16, {}},
               [&](const CollContext& ctx, Algorithm) {
                 allgather_direct(ctx, mine.data(), all.data(), std::vector<size_t>(n, 2),
                                  ElemType::kI64);
               });
  std::vector<int> members;
  if (color >= 0) {
    for (int i = 0; i < n; ++i)
      if (all[2 * i] == color) members.push_back(i);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  }
  std::unique_ptr<Transport> sub;
  try {
    sub = s_->transport->split(color, key, members, s_->splits++);
  } catch (const std::exception& e) {
    s_->transport->abort(str("comm: split on rank ", r, " failed: ", e.what()));
    throw;
  }
  if (!sub) return Communicator();
  const uint64_t split_id = s_->splits - 1;
  Communicator out(std::move(sub), s_->options);
  std::vector<int> ranks;
  for (int m : members) ranks.push_back(s_->job_ranks[static_cast<size_t>(m)]);
  set_job_ranks(*out.s_, std::move(ranks));
  out.s_->group = str(s_->group, "/", split_id, ".", color);
  return out;
}

int Communicator::ranks_on_host() const {
  if (backend() != Backend::kMpi) return size();
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  return v ? std::max(1, std::atoi(v)) : 1;
}

std::shared_ptr<void> Communicator::shared_memory(size_t bytes) {
  const int n = size();
  std::vector<int64_t> mine{static_cast<int64_t>(bytes)}, all(static_cast<size_t>(n));
  run_blocking(*s_, Call{OpKind::kSharedMemory, ElemType::kI64, ReduceOp::kSum, -1, 1, 8, {}},
               [&](const CollContext& ctx, Algorithm) {
                 allgather_direct(ctx, mine.data(), all.data(), std::vector<size_t>(n, 1),
                                  ElemType::kI64);
               });
  for (int i = 0; i < n; ++i)
    if (all[i] != all[0])
      throw InvalidArgument(str("comm: shared_memory of ", all[0], " bytes on rank 0 but ", all[i],
                                " on rank ", i, "; every rank must ask for the same size"));
  try {
    return s_->transport->shared_memory(bytes, s_->shared++);
  } catch (const std::exception& e) {
    s_->transport->abort(str("comm: shared_memory on rank ", rank(), " failed: ", e.what()));
    throw;
  }
}

}  // namespace tessel::comm
