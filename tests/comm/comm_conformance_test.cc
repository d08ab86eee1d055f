// Conformance of every collective and algorithm on the threads transport: each case runs on
// world sizes 1, 2, 3, 4, 5, 7 and 8 and is checked against a plain local computation
// (conformance.h). This binary holds a representative subset that runs in seconds;
// comm_conformance_full_test (label slow) sweeps every dtype, op and count, (1 << 20) + 3
// included, for every algorithm.
#include <gtest/gtest.h>

#include <mutex>

#include "conformance.h"
#include "tessel/comm/threads.h"

namespace tessel::comm::testing {
namespace {

const int kWorlds[] = {1, 2, 3, 4, 5, 7, 8};
constexpr size_t kHuge = (1 << 20) + 3;

// Per-rank count of the scatter/gather cases: the whole buffer stays near the allreduce sizes.
[[maybe_unused]] size_t per_rank(size_t n) { return n == kHuge ? kHuge / 8 : n; }

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, MatchesLocalReduction) {
  const Case& c = GetParam();
  for (int world : kWorlds) {
    std::mutex mu;
    std::vector<std::string> failures;
    CommOptions options;
    options.timeout_s = 60;
    options.segment_bytes = 4096;  // several segments per block even for modest counts
    run_threads(
        world,
        [&](Communicator& comm) {
          std::string err = run_case(comm, c);
          if (!err.empty()) {
            std::lock_guard<std::mutex> lock(mu);
            failures.push_back(err);
          }
        },
        options);
    for (const auto& f : failures) ADD_FAILURE() << f;
    if (!failures.empty()) return;
  }
}

std::vector<Case> cases() {
  using A = Algorithm;
  using E = ElemType;
  using R = ReduceOp;
  std::vector<Case> out;
  const A allreduce_algos[] = {A::kRing, A::kHalvingDoubling, A::kTree, A::kDirect};
  const A scatter_algos[] = {A::kRing, A::kHalvingDoubling, A::kDirect};
  const A root_algos[] = {A::kTree, A::kRing, A::kDirect};
  const E all_elems[] = {E::kF32, E::kF64, E::kI32, E::kI64, E::kBF16, E::kF16};
#ifdef TESSEL_FULL_SWEEP
  const size_t counts[] = {0, 1, 7, 1000, kHuge};
  const R ops[] = {R::kSum, R::kAvg, R::kMax, R::kMin};
  for (A a : allreduce_algos)
    for (size_t n : counts)
      for (E e : all_elems)
        for (R op : ops)
          if (n != kHuge || op == R::kSum) out.push_back({Coll::kAllreduce, a, n, e, op});
  for (Coll coll : {Coll::kReduceScatter, Coll::kReduceScatterV})
    for (A a : scatter_algos)
      for (size_t n : counts)
        for (E e : all_elems)
          for (R op : ops)
            if (n != kHuge || op == R::kSum) out.push_back({coll, a, per_rank(n), e, op});
  for (Coll coll : {Coll::kAllgather, Coll::kAllgatherV})
    for (A a : scatter_algos)
      for (size_t n : counts)
        for (E e : all_elems) out.push_back({coll, a, per_rank(n), e});
  for (A a : root_algos)
    for (size_t n : counts)
      for (E e : all_elems)
        for (int root : {0, 3}) {
          out.push_back({Coll::kBroadcast, a, n, e, R::kSum, root});
          for (R op : ops)
            if (n != kHuge || op == R::kSum) out.push_back({Coll::kReduce, a, n, e, op, root});
        }
  for (size_t n : counts)
    for (E e : all_elems) {
      out.push_back({Coll::kGather, A::kDirect, per_rank(n), e, R::kSum, 1});
      out.push_back({Coll::kAllToAll, A::kDirect, per_rank(n), e});
    }
#else
  // Every algorithm x {0, 1, 7, 1000} x every dtype; the huge count for f32 and bf16.
  for (A a : allreduce_algos) {
    for (size_t n : {0, 1}) out.push_back({Coll::kAllreduce, a, n, E::kF32});
    for (size_t n : {7, 1000})
      for (E e : all_elems) out.push_back({Coll::kAllreduce, a, n, e});
    for (R op : {R::kAvg, R::kMax, R::kMin})
      for (E e : {E::kF32, E::kI32, E::kBF16}) out.push_back({Coll::kAllreduce, a, 1000, e, op});
    out.push_back({Coll::kAllreduce, a, kHuge, E::kF32});
  }
  out.push_back({Coll::kAllreduce, A::kRing, kHuge, E::kBF16});
  out.push_back({Coll::kAllreduce, A::kHalvingDoubling, kHuge, E::kF16});
  for (Coll coll :
       {Coll::kReduceScatter, Coll::kReduceScatterV, Coll::kAllgather, Coll::kAllgatherV})
    for (A a : scatter_algos) {
      out.push_back({coll, a, 0, E::kF32, R::kSum});
      for (size_t n : {1, 7, 1000})
        for (E e : {E::kF32, E::kBF16}) out.push_back({coll, a, n, e, R::kSum});
    }
  for (A a : scatter_algos) {
    out.push_back({Coll::kReduceScatter, a, 1000, E::kF32, R::kAvg});
    out.push_back({Coll::kReduceScatterV, a, 1000, E::kI32, R::kMax});
    out.push_back({Coll::kReduceScatter, a, kHuge / 8, E::kF32});
    out.push_back({Coll::kAllgatherV, a, kHuge / 8, E::kF32});
  }
  for (A a : root_algos)
    for (size_t n : {0, 7, 1000})
      for (int root : {0, 3}) {
        out.push_back({Coll::kBroadcast, a, n, E::kF32, R::kSum, root});
        out.push_back({Coll::kReduce, a, n, E::kF32, R::kSum, root});
      }
  for (A a : root_algos) {
    out.push_back({Coll::kReduce, a, 1000, E::kBF16, R::kAvg, 2});
    out.push_back({Coll::kReduce, a, 1000, E::kU8, R::kMax, 1});
    out.push_back({Coll::kBroadcast, a, kHuge, E::kF32, R::kSum, 1});
  }
  for (size_t n : {0, 7, 1000})
    for (E e : {E::kF32, E::kU8}) {
      out.push_back({Coll::kGather, A::kDirect, n, e, R::kSum, 1});
      out.push_back({Coll::kAllToAll, A::kDirect, n, e});
    }
  out.push_back({Coll::kAllreduce, A::kAuto, 1000, E::kF32});
  out.push_back({Coll::kAllreduce, A::kAuto, kHuge, E::kF32});
#endif
  out.push_back({Coll::kBarrier, A::kAuto, 0, E::kU8});
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = str(coll_name(c.coll), "_", algorithm_name(c.algorithm), "_", c.count, "_",
                      elem_name(c.elem), "_", reduce_op_name(c.op), "_r", c.root);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

#ifdef TESSEL_FULL_SWEEP
INSTANTIATE_TEST_SUITE_P(ThreadsFull, Conformance, ::testing::ValuesIn(cases()), param_name);
#else
INSTANTIATE_TEST_SUITE_P(Threads, Conformance, ::testing::ValuesIn(cases()), param_name);
#endif

}  // namespace
}  // namespace tessel::comm::testing
