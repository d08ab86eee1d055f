// Algorithm::kNative on the mpi transport: the library's own collectives (MPI_Allreduce, ...),
// blocking and therefore uninterruptible; a watchdog bounds each one by the call's deadline.
// bf16/f16 reductions use user-defined MPI ops that reduce in f32.
#include <algorithm>
#include <climits>
#include <numeric>
#include <vector>

#include "mpi_base.h"
#include "mpi_control.h"
#include "tessel/comm/transport.h"
#include "tessel/core/error.h"

namespace tessel::comm::mpi_detail {
namespace {

int as_int(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX))
    throw InvalidArgument(str("comm: native MPI ", what, " of ", n,
                              " elements exceeds INT_MAX; "
                              "use another algorithm or split the buffer"));
  return static_cast<int>(n);
}

class MpiNative final : public NativeCollectives {
 public:
  MpiNative(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}

  void allreduce(void* buf, size_t count, ElemType e, ReduceOp op, const Stamp& s,
                 Deadline d) override {
    WatchdogArm arm(d, describe(s));
    Guard guard;
    check(MPI_Allreduce(MPI_IN_PLACE, buf, as_int(count, "allreduce"), datatype(e),
                        reduce_op(e, op), comm_),
          "MPI_Allreduce");
  }

  void reduce_scatter(const void* in, void* out, const std::vector<size_t>& counts, ElemType e,
                      ReduceOp op, const Stamp& s, Deadline d) override {
    WatchdogArm arm(d, describe(s));
    bool equal =
        std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    // MPI forbids aliased buffers; an in-place call (out inside in) reads a copy of the input.
    std::vector<char> copy;
    const size_t bytes = std::accumulate(counts.begin(), counts.end(), size_t{0}) * elem_size(e);
    const char* lo = static_cast<const char*>(in);
    if (out >= static_cast<const void*>(lo) && out < static_cast<const void*>(lo + bytes)) {
      copy.assign(lo, lo + bytes);
      in = copy.data();
    }
    Guard guard;
    if (equal) {
      check(MPI_Reduce_scatter_block(in, out, as_int(counts[0], "reduce_scatter"), datatype(e),
                                     reduce_op(e, op), comm_),
            "MPI_Reduce_scatter_block");
      return;
    }
    std::vector<int> c(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) c[i] = as_int(counts[i], "reduce_scatter");
    check(MPI_Reduce_scatter(in, out, c.data(), datatype(e), reduce_op(e, op), comm_),
          "MPI_Reduce_scatter");
  }

  void allgather(const void* in, void* out, const std::vector<size_t>& counts, ElemType e,
                 const Stamp& s, Deadline d) override {
    WatchdogArm arm(d, describe(s));
    std::vector<int> c(counts.size()), displs(counts.size());
    size_t off = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      c[i] = as_int(counts[i], "allgather");
      displs[i] = as_int(off, "allgather");
      off += counts[i];
    }
    const char* mine = static_cast<const char*>(out) + displs[rank_] * elem_size(e);
    const void* send = in == mine ? MPI_IN_PLACE : in;
    bool equal = std::all_of(c.begin(), c.end(), [&](int x) { return x == c[0]; });
    Guard guard;
    if (equal)
      check(MPI_Allgather(send, c[0], datatype(e), out, c[0], datatype(e), comm_), "MPI_Allgather");
    else
      check(MPI_Allgatherv(send, c[rank_], datatype(e), out, c.data(), displs.data(), datatype(e),
                           comm_),
            "MPI_Allgatherv");
  }

  void broadcast(void* buf, size_t count, ElemType e, int root, const Stamp& s,
                 Deadline d) override {
    WatchdogArm arm(d, describe(s));
    Guard guard;
    check(MPI_Bcast(buf, as_int(count, "broadcast"), datatype(e), root, comm_), "MPI_Bcast");
  }

  void reduce(void* buf, size_t count, ElemType e, ReduceOp op, int root, const Stamp& s,
              Deadline d) override {
    WatchdogArm arm(d, describe(s));
    Guard guard;
    int n = as_int(count, "reduce");
    if (rank_ == root)
      check(MPI_Reduce(MPI_IN_PLACE, buf, n, datatype(e), reduce_op(e, op), root, comm_),
            "MPI_Reduce");
    else
      check(MPI_Reduce(buf, nullptr, n, datatype(e), reduce_op(e, op), root, comm_), "MPI_Reduce");
  }

  void gather(const void* in, void* out, size_t count, ElemType e, int root, const Stamp& s,
              Deadline d) override {
    WatchdogArm arm(d, describe(s));
    Guard guard;
    int n = as_int(count, "gather");
    check(MPI_Gather(in, n, datatype(e), out, n, datatype(e), root, comm_), "MPI_Gather");
  }

  void all_to_all(const void* in, void* out, size_t count, ElemType e, const Stamp& s,
                  Deadline d) override {
    WatchdogArm arm(d, describe(s));
    Guard guard;
    int n = as_int(count, "all_to_all");
    check(MPI_Alltoall(in, n, datatype(e), out, n, datatype(e), comm_), "MPI_Alltoall");
  }

  void barrier(const Stamp& s, Deadline d) override {
    WatchdogArm arm(d, describe(s));
    Guard guard;
    check(MPI_Barrier(comm_), "MPI_Barrier");
  }

 private:
  MPI_Comm comm_;
  int rank_, size_;
};

}  // namespace

std::unique_ptr<NativeCollectives> make_native(MPI_Comm comm, int rank, int size) {
  return std::make_unique<MpiNative>(comm, rank, size);
}

}  // namespace tessel::comm::mpi_detail
