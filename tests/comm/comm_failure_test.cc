// Failure behaviour on the threads transport: deadlines, a rank that throws, mismatched
// collectives and the poisoning that makes every later call fail fast. Every test finishes in
// a few seconds; none of them may hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

// What each rank saw: the CommError message (or "") and how long its call took.
struct Outcome {
  std::string error;
  double seconds = 0;
};

template <typename F>
std::vector<Outcome> run_and_collect(int world, const CommOptions& options, F per_rank) {
  std::vector<Outcome> out(world);
  try {
    run_threads(
        world,
        [&](Communicator& c) {
          double t0 = now_seconds();
          try {
            per_rank(c);
          } catch (const CommError& e) {
            out[c.rank()].error = e.what();
            out[c.rank()].seconds = now_seconds() - t0;
            throw;
          }
          out[c.rank()].seconds = now_seconds() - t0;
        },
        options);
  } catch (const Error&) {
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(Deadline, StuckPeerGivesCommErrorOnEveryOtherRank) {
  CommOptions options;
  options.timeout_s = 0.5;
  std::vector<float> data(4, 1.0f);
  auto out = run_and_collect(4, options, [&](Communicator& c) {
    std::vector<float> buf(1000, 1.0f);
    if (c.rank() == 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // never calls
      return;
    }
    c.allreduce(buf.data(), buf.size(), ElemType::kF32, ReduceOp::kSum);
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    EXPECT_TRUE(contains(out[r].error, "allreduce #0")) << out[r].error;
    EXPECT_LT(out[r].seconds, 1.4);  // within the deadline plus a margin, not after rank 3 wakes
  }
  // The rank that timed out first names the peer, tag and bytes.
  bool named = false;
  for (int r = 0; r < 3; ++r)
    named |= contains(out[r].error, "tag 0") && contains(out[r].error, "bytes") &&
             contains(out[r].error, "deadline") && contains(out[r].error, "rank 3");
  EXPECT_TRUE(named) << out[0].error;
  EXPECT_TRUE(out[3].error.empty());
}

// The ranks that time out name the rank that stopped making progress (from its heartbeat:
// the call it entered last), not the ring neighbour each of them waits for.
TEST(Deadline, NamesTheStalledRankNotTheNeighbour) {
  CommOptions options;
  options.timeout_s = 0.5;
  auto out = run_and_collect(5, options, [&](Communicator& c) {
    std::vector<float> buf(1000, 1.0f);
    c.allreduce(buf.data(), buf.size(), ElemType::kF32, ReduceOp::kSum, {Algorithm::kRing});
    if (c.rank() == 2) {  // stalls outside any call
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return;
    }
    c.allreduce(buf.data(), buf.size(), ElemType::kF32, ReduceOp::kSum, {Algorithm::kRing});
  });
  int timed_out = 0;
  for (int r : {0, 1, 3, 4}) {
    SCOPED_TRACE(r);
    if (!contains(out[r].error, "before the deadline")) continue;
    ++timed_out;
    EXPECT_TRUE(contains(out[r].error, "rank 2 stopped making progress")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "it last entered allreduce #0")) << out[r].error;
  }
  EXPECT_GE(timed_out, 1);
}

TEST(Deadline, PointToPointRecvFromSilentPeer) {
  CommOptions options;
  options.timeout_s = 0.3;
  auto out = run_and_collect(2, options, [&](Communicator& c) {
    int x = 0;
    if (c.rank() == 0) c.recv(&x, 1, ElemType::kI32, 1, 7);
  });
  EXPECT_TRUE(contains(out[0].error, "recv from rank 1")) << out[0].error;
  EXPECT_TRUE(contains(out[0].error, "tag 8")) << out[0].error;  // user tag 7 travels as 8
  EXPECT_LT(out[0].seconds, 1.5);
}

TEST(Deadline, ThrowingRankFailsTheOthersFast) {
  CommOptions options;  // default 300 s deadline: the abort, not the deadline, must end it
  std::vector<Outcome> out(4);
  std::atomic<int> comm_errors{0};
  EXPECT_THROW(run_threads(
                   4,
                   [&](Communicator& c) {
                     std::vector<float> buf(1 << 16, 1.0f);
                     if (c.rank() == 2) throw std::runtime_error("boom in rank 2");
                     double t0 = now_seconds();
                     try {
                       c.allreduce(buf.data(), buf.size(), ElemType::kF32);
                     } catch (const CommError& e) {
                       out[c.rank()] = {e.what(), now_seconds() - t0};
                       comm_errors++;
                       throw;
                     }
                   },
                   options),
               std::runtime_error);  // the root cause, not the consequences
  EXPECT_EQ(comm_errors.load(), 3);
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(contains(out[r].error, "boom in rank 2")) << out[r].error;
    EXPECT_LT(out[r].seconds, 2.0);
  }
}

TEST(Poison, LaterCallsFailFastOnEveryRank) {
  CommOptions options;
  options.timeout_s = 0.3;
  std::vector<double> later(3, -1);
  std::vector<std::string> msgs(3);
  try {
    run_threads(
        3,
        [&](Communicator& c) {
          float x = 1;
          try {
            if (c.rank() != 1) c.allreduce(&x, 1, ElemType::kF32);  // rank 1 skips: deadline
          } catch (const CommError&) {
          }
          if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
          double t0 = now_seconds();
          try {
            c.barrier();
          } catch (const CommError& e) {
            later[c.rank()] = now_seconds() - t0;
            msgs[c.rank()] = e.what();
          }
          EXPECT_TRUE(c.aborted());
        },
        options);
  } catch (const Error&) {
  }
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    EXPECT_GE(later[r], 0);
    EXPECT_LT(later[r], 0.05);
    EXPECT_TRUE(contains(msgs[r], "aborted")) << msgs[r];
  }
}

TEST(Poison, FailureInASubgroupPoisonsTheParent) {
  CommOptions options;
  options.timeout_s = 20;  // the parent's calls must end by the abort, not by this deadline
  std::vector<std::string> parent_errors(4);
  try {
    run_threads(
        4,
        [&](Communicator& c) {
          Communicator sub = c.split(c.rank() % 2, c.rank());
          float x = 1;
          try {
            // rank 1 (odd group) skips
            if (c.rank() != 1)
              sub.allreduce(&x, 1, ElemType::kF32, ReduceOp::kSum, {.timeout_s = 0.2});
          } catch (const CommError&) {
          }
          if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
          try {
            c.allreduce(&x, 1, ElemType::kF32);
          } catch (const CommError& e) {
            parent_errors[c.rank()] = e.what();
          }
        },
        options);
  } catch (const Error&) {
  }
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(contains(parent_errors[r], "aborted")) << r << ": " << parent_errors[r];
}

TEST(Mismatch, DifferentCountsAreReportedNamingBothSides) {
  CommOptions options;
  options.timeout_s = 60;
  auto out = run_and_collect(3, options, [&](Communicator& c) {
    size_t n = c.rank() == 1 ? 100 : 200;
    std::vector<float> buf(n, 1.0f);
    CallOptions call;
    call.algorithm = Algorithm::kRing;
    c.allreduce(buf.data(), n, ElemType::kF32, ReduceOp::kSum, call);
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    EXPECT_TRUE(contains(out[r].error, "mismatched")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "allreduce #0 (100 x f32")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "allreduce #0 (200 x f32")) << out[r].error;
    EXPECT_LT(out[r].seconds, 5.0);
  }
}

TEST(Mismatch, DifferentCollectivesAreReported) {
  CommOptions options;
  options.timeout_s = 60;
  auto out = run_and_collect(2, options, [&](Communicator& c) {
    std::vector<float> buf(64, 1.0f);
    if (c.rank() == 0)
      c.allreduce(buf.data(), buf.size(), ElemType::kF32);
    else
      c.broadcast(buf.data(), buf.size(), ElemType::kF32, 0);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(out[r].error, "allreduce #0")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "broadcast #0")) << out[r].error;
  }
}

TEST(Mismatch, DifferentDtypesAreReported) {
  CommOptions options;
  options.timeout_s = 60;
  auto out = run_and_collect(2, options, [&](Communicator& c) {
    std::vector<int32_t> buf(64, 1);
    c.allreduce(buf.data(), buf.size(), c.rank() == 0 ? ElemType::kF32 : ElemType::kI32);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(out[r].error, "64 x f32")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "64 x i32")) << out[r].error;
  }
}

TEST(Mismatch, SkippedCollectiveIsReported) {
  CommOptions options;
  options.timeout_s = 60;
  auto out = run_and_collect(3, options, [&](Communicator& c) {
    std::vector<float> buf(32, 1.0f);
    if (c.rank() != 2) c.allreduce(buf.data(), 16, ElemType::kF32);  // rank 2 skips this one
    c.allreduce(buf.data(), 32, ElemType::kF32);
  });
  bool both = false;
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    EXPECT_FALSE(out[r].error.empty());
    EXPECT_LT(out[r].seconds, 5.0);
    both |= contains(out[r].error, "allreduce #0 (16 x f32") &&
            contains(out[r].error, "allreduce #0 (32 x f32");
  }
  EXPECT_TRUE(both) << out[0].error;
}

TEST(Async, StuckPeerFailsTheWork) {
  CommOptions options;
  options.timeout_s = 0.4;
  std::vector<std::string> errors(2);
  std::vector<char> done_after(2, 0);
  try {
    run_threads(
        2,
        [&](Communicator& c) {
          std::vector<float> buf(1024, 1.0f);
          if (c.rank() == 1) return;
          Work w = c.allreduce_async(buf.data(), buf.size(), ElemType::kF32);
          try {
            w.wait();
          } catch (const CommError& e) {
            errors[0] = e.what();
          }
          done_after[0] = w.done();
        },
        options);
  } catch (const Error&) {
  }
  EXPECT_TRUE(contains(errors[0], "allreduce #0")) << errors[0];
  EXPECT_TRUE(done_after[0]);
}

TEST(Arguments, BadCallsThrowInvalidArgument) {
  auto comms = make_thread_world(1);
  Communicator& c = comms[0];
  float x = 0;
  CallOptions native;
  native.algorithm = Algorithm::kNative;
  EXPECT_THROW(c.allreduce(&x, 1, ElemType::kF32, ReduceOp::kSum, native), InvalidArgument);
  CallOptions tree;
  tree.algorithm = Algorithm::kTree;
  EXPECT_THROW(c.gather(&x, &x, 1, ElemType::kF32, 0, tree), InvalidArgument);
  EXPECT_THROW(c.broadcast(&x, 1, ElemType::kF32, 5), InvalidArgument);
  EXPECT_THROW(c.send(&x, 1, ElemType::kF32, 3), InvalidArgument);
  uint8_t b = 0;
  EXPECT_THROW(c.allreduce(&b, 1, ElemType::kU8, ReduceOp::kSum), InvalidArgument);
  EXPECT_THROW(make_thread_world(0), InvalidArgument);
}

}  // namespace
}  // namespace tessel::comm
