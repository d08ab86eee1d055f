// The conformance suite on the mpi transport, run by ctest under
// `mpirun -np 4` and `mpirun -np 3` (label mpi). Every rank runs the same cases in the same
// order: every algorithm (native included) x count {0, 1, 7, 1000, (1 << 20) + 3} x dtype, on
// the world and on split sub-groups, then the failure cases (a silent rank, mismatched calls),
// each on its own world communicator because a failure poisons the one it happens on.
// Exit code 0 when every rank passed; failures are printed by the rank that saw them.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "conformance.h"
#include "tessel/comm/mpi.h"
#include "tessel/core/clock.h"

namespace tc = tessel::comm;
namespace tt = tessel::comm::testing;

namespace {

std::vector<tt::Case> cases() {
  using A = tc::Algorithm;
  using E = tc::ElemType;
  using R = tc::ReduceOp;
  using C = tt::Coll;
  const size_t kHuge = (1 << 20) + 3;
  std::vector<tt::Case> out;
  for (A a : {A::kRing, A::kHalvingDoubling, A::kTree, A::kDirect, A::kNative}) {
    for (size_t n : {0, 1, 7, 1000})
      for (E e : {E::kF32, E::kF64, E::kI32, E::kI64, E::kBF16, E::kF16})
        out.push_back({C::kAllreduce, a, n, e});
    for (R op : {R::kAvg, R::kMax, R::kMin}) out.push_back({C::kAllreduce, a, 1000, E::kBF16, op});
    out.push_back({C::kAllreduce, a, kHuge, E::kF32});
  }
  for (C coll : {C::kReduceScatter, C::kReduceScatterV, C::kAllgather, C::kAllgatherV})
    for (A a : {A::kRing, A::kHalvingDoubling, A::kDirect, A::kNative}) {
      for (size_t n : {0, 1, 7, 1000})
        for (E e : {E::kF32, E::kI64, E::kF16}) out.push_back({coll, a, n, e});
      out.push_back({coll, a, kHuge / 8, E::kF32});
    }
  for (A a : {A::kTree, A::kRing, A::kDirect, A::kNative})
    for (size_t n : {size_t{0}, size_t{7}, size_t{1000}, kHuge}) {
      out.push_back({C::kBroadcast, a, n, E::kF32, R::kSum, 1});
      out.push_back({C::kReduce, a, n, n == kHuge ? E::kF32 : E::kI32, R::kSum, 2});
    }
  for (A a : {A::kDirect, A::kNative})
    for (size_t n : {0, 7, 1000}) {
      out.push_back({C::kGather, a, n, E::kF64, R::kSum, 1});
      out.push_back({C::kAllToAll, a, n, E::kI32});
    }
  out.push_back({C::kBarrier, A::kNative, 0, E::kU8});
  out.push_back({C::kBarrier, A::kAuto, 0, E::kU8});
  return out;
}

int failures = 0;

void fail(int rank, const std::string& what) {
  std::printf("FAIL rank %d: %s\n", rank, what.c_str());
  std::fflush(stdout);
  ++failures;
}

void run_suite(tc::Communicator& comm, const std::vector<tt::Case>& list, const char* label) {
  for (const tt::Case& c : list) {
    std::string err;
    try {
      err = tt::run_case(comm, c);
    } catch (const std::exception& e) {
      err = tessel::str(tt::case_name(c, comm.size()), ": threw ", e.what());
    }
    if (!err.empty()) fail(comm.rank(), tessel::str(label, ": ", err));
  }
}

// Several async allreduces in flight while the caller computes, then a blocking call.
void async_case(tc::Communicator& comm) {
  const size_t n = 100000;
  std::vector<std::vector<float>> bufs(4, std::vector<float>(n));
  std::vector<tc::Work> works;
  for (size_t b = 0; b < bufs.size(); ++b) {
    std::fill(bufs[b].begin(), bufs[b].end(), static_cast<float>(comm.rank() + b));
    works.push_back(comm.allreduce_async(bufs[b].data(), n, tc::ElemType::kF32));
  }
  comm.barrier();
  const int s = comm.size();
  for (size_t b = 0; b < bufs.size(); ++b) {
    works[b].wait();
    float want = static_cast<float>(s * (s - 1) / 2 + s * static_cast<int>(b));
    if (bufs[b][n - 1] != want)
      fail(comm.rank(), tessel::str("async: bucket ", b, " = ", bufs[b][n - 1], ", want ", want));
  }
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A rank that never calls: the others get CommError within the deadline. The communicator is
// returned so that it outlives the messages still in flight to the silent rank.
tc::Communicator deadline_case(int world_rank, int world_size) {
  tc::CommOptions options;
  options.timeout_s = 1.0;
  tc::Communicator comm = tc::mpi_world(options);
  std::vector<float> buf(1000, 1.0f);
  const int silent = world_size - 1;
  if (world_rank == silent) return comm;
  double t0 = tessel::now_seconds();
  try {
    comm.allreduce(buf.data(), buf.size(), tc::ElemType::kF32);
    fail(world_rank, "deadline: allreduce with a silent rank returned");
  } catch (const tessel::CommError& e) {
    double dt = tessel::now_seconds() - t0;
    if (dt > 3.0) fail(world_rank, tessel::str("deadline: CommError after ", dt, " s"));
    if (!contains(e.what(), "allreduce #0")) fail(world_rank, tessel::str("deadline: ", e.what()));
  }
  // Poisoned: a later call fails at once.
  t0 = tessel::now_seconds();
  try {
    comm.barrier();
    fail(world_rank, "deadline: barrier on a poisoned communicator returned");
  } catch (const tessel::CommError&) {
    if (tessel::now_seconds() - t0 > 0.1) fail(world_rank, "deadline: poisoned call was slow");
  }
  return comm;
}

// Rank 0 runs an allreduce, the others a broadcast: both kinds of rank name both calls.
void mismatch_case(int world_rank) {
  tc::CommOptions options;
  options.timeout_s = 30;
  tc::Communicator comm = tc::mpi_world(options);
  std::vector<float> buf(64, 1.0f);
  double t0 = tessel::now_seconds();
  try {
    tc::CallOptions tree;
    tree.algorithm = tc::Algorithm::kTree;
    if (world_rank == 0)
      comm.allreduce(buf.data(), buf.size(), tc::ElemType::kF32, tc::ReduceOp::kSum, tree);
    else
      comm.broadcast(buf.data(), buf.size(), tc::ElemType::kF32, 0, tree);
    fail(world_rank, "mismatch: mismatched calls returned");
  } catch (const tessel::CommError& e) {
    double dt = tessel::now_seconds() - t0;
    if (dt > 5.0) fail(world_rank, tessel::str("mismatch: reported after ", dt, " s"));
    if (!contains(e.what(), "allreduce #0") || !contains(e.what(), "broadcast #0"))
      fail(world_rank, tessel::str("mismatch: message does not name both calls: ", e.what()));
  }
}

}  // namespace

int main() {
  tc::CommOptions options;
  options.timeout_s = 120;
  options.segment_bytes = 64 << 10;
  tc::Communicator world = tc::mpi_world(options);
  const int rank = world.rank(), size = world.size();
  double t0 = tessel::now_seconds();
  const std::vector<tt::Case> list = cases();

  run_suite(world, list, "world");
  // Sub-groups of sizes 1..size-1 exercise split and every world size below this one.
  tc::Communicator sub = world.split(rank == 0 ? 0 : 1, size - rank);
  run_suite(sub, list, rank == 0 ? "split(1)" : "split(n-1)");
  async_case(world);
  tc::Communicator none = world.split(rank % 2 == 0 ? 0 : -1, rank);
  if (none.valid() != (rank % 2 == 0)) fail(rank, "split: color < 0 gave a communicator");

  world.barrier();
  tc::Communicator silent = deadline_case(rank, size);
  world.barrier();
  if (size > 1) mismatch_case(rank);
  world.barrier();

  int total = failures;
  world.allreduce(&total, 1, tc::ElemType::kI32);
  if (rank == 0)
    std::printf("mpi conformance: %d ranks (%s), %zu cases x 2 groups, %d failures, %.1f s\n", size,
                tc::mpi_thread_level(), list.size(), total, tessel::now_seconds() - t0);
  return total == 0 ? 0 : 1;
}
