// NcclCommunicator's control logic on the mock NCCL (nccl_mock.h): bootstrap over a threads
// control plane, every collective and send/recv against a plain local computation, and the
// failure paths: a stalled peer (Timeout naming it within the deadline), a device hang, a
// dead peer reported by the control plane or by NCCL (CommError naming it), destroy after
// abort. Every test also checks that the communicator kept NCCL's rules (no mock misuse) and
// left nothing behind.
#include "tessel/comm/nccl.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <thread>

#include "nccl_mock.h"
#include "tessel/comm/threads.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

using testing::mock_nccl;
using testing::mock_nccl_fault;
using testing::mock_nccl_reset;
using testing::mock_nccl_state;
using testing::MockFault;

using Body = std::function<void(Communicator&, NcclCommunicator&)>;

struct RankResult {
  std::string type;  // "", "Timeout" or "CommError"
  std::string error;
  double seconds = 0;  // from entering the body
};

// Runs body on `world` ranks (threads), each with its NcclCommunicator on the mock, then
// closes it; records what each rank threw.
std::vector<RankResult> run_ranks(int world, double timeout_s, const Body& body) {
  std::vector<RankResult> out(world);
  CommOptions options;
  options.timeout_s = timeout_s;
  NcclOptions nccl_options;
  nccl_options.poll_us = 200;
  try {
    run_threads(
        world,
        [&](Communicator& c) {
          RankResult& me = out[c.rank()];
          double t0 = now_seconds();
          try {
            NcclCommunicator nccl(c, mock_nccl(), nccl_options);
            t0 = now_seconds();
            body(c, nccl);
            nccl.close();
          } catch (const Timeout& e) {
            me.type = "Timeout";
            me.error = e.what();
          } catch (const CommError& e) {
            me.type = "CommError";
            me.error = e.what();
          }
          me.seconds = now_seconds() - t0;
        },
        options);
  } catch (const Error&) {
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override { mock_nccl_reset(); }
  // Whatever happened, the communicators kept NCCL's rules and freed everything.
  void TearDown() override {
    const auto st = mock_nccl_state();
    EXPECT_EQ(st.misuses, expected_misuses_) << st.first_misuse;
    EXPECT_EQ(st.live_comms, 0);
    EXPECT_EQ(st.live_streams, 0);
    mock_nccl_reset();
  }
  int expected_misuses_ = 0;
};

// ---- bootstrap ----

class NcclWorld : public Nccl, public ::testing::WithParamInterface<int> {};

TEST_P(NcclWorld, BootstrapJoinsEveryRankInOneCommunicator) {
  const int world = GetParam();
  auto out = run_ranks(world, 5, [&](Communicator& c, NcclCommunicator& nccl) {
    EXPECT_EQ(nccl.rank(), c.rank());
    EXPECT_EQ(nccl.size(), world);
    EXPECT_NE(nccl.stream(), nullptr);
    float one = 1;
    nccl.allreduce(&one, 1, ElemType::kF32).wait();  // one group: every rank counted once
    EXPECT_EQ(one, static_cast<float>(world));
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

INSTANTIATE_TEST_SUITE_P(World, NcclWorld, ::testing::Values(1, 2, 3, 4));

// ---- collectives against a plain local computation ----

// A host buffer of f32 or bf16 elements, read and written as floats.
struct Buffer {
  ElemType elem;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  Buffer(ElemType e, size_t n) : elem(e) { (e == ElemType::kF32 ? f32.resize(n) : bf16.resize(n)); }
  void* data() { return elem == ElemType::kF32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  float get(size_t i) const { return elem == ElemType::kF32 ? f32[i] : bf16_to_f32(bf16[i]); }
  void set(size_t i, float v) {
    elem == ElemType::kF32 ? void(f32[i] = v) : void(bf16[i] = f32_to_bf16(v));
  }
};

// Multiples of 1/4 below 32: sums of four are exact in bf16 as in f32.
float value(int rank, size_t i) { return 0.5f * static_cast<float>(rank + 1) + 0.25f * (i % 13); }

Buffer filled(ElemType e, int rank, size_t n, size_t first = 0) {
  Buffer b(e, n);
  for (size_t i = 0; i < n; ++i) b.set(i, value(rank, first + i));
  return b;
}

float reduced(int world, size_t i, ReduceOp op) {
  float acc = value(0, i);
  for (int r = 1; r < world; ++r) {
    const float v = value(r, i);
    acc = op == ReduceOp::kMax   ? std::max(acc, v)
          : op == ReduceOp::kMin ? std::min(acc, v)
                                 : acc + v;
  }
  return op == ReduceOp::kAvg ? acc / static_cast<float>(world) : acc;
}

void expect_close(float got, float want, ElemType e, const std::string& what) {
  const float tol = e == ElemType::kF32 ? 1e-6f * std::abs(want) : 8e-3f * std::abs(want);
  EXPECT_NEAR(got, want, tol) << what;
}

struct Case {
  int world;
  size_t count;
};

class NcclCollectives : public Nccl, public ::testing::WithParamInterface<Case> {};

TEST_P(NcclCollectives, AllreduceMatchesLocalReduction) {
  const auto [world, n] = GetParam();
  auto out = run_ranks(world, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    for (ElemType e : {ElemType::kF32, ElemType::kBF16})
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        Buffer b = filled(e, c.rank(), n);
        nccl.allreduce(b.data(), n, e, op).wait();
        for (size_t i = 0; i < n; ++i)
          expect_close(b.get(i), reduced(world, i, op), e,
                       str(elem_name(e), " ", reduce_op_name(op), " [", i, "]"));
      }
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

// counts: n on every rank (NCCL's own collective), or n + rank (a group of one per rank).
std::vector<size_t> blocks(int world, size_t n, bool equal) {
  std::vector<size_t> counts(world, n);
  for (int r = 0; r < world && !equal; ++r) counts[r] = n + r;
  return counts;
}

size_t first_of(const std::vector<size_t>& counts, int rank) {
  size_t off = 0;
  for (int r = 0; r < rank; ++r) off += counts[r];
  return off;
}

TEST_P(NcclCollectives, ReduceScatterMatchesLocalReduction) {
  const auto [world, n] = GetParam();
  auto out = run_ranks(world, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    for (bool equal : {true, false})
      for (ElemType e : {ElemType::kF32, ElemType::kBF16}) {
        const auto counts = blocks(world, n, equal);
        const size_t total = first_of(counts, world), mine = counts[c.rank()];
        const size_t first = first_of(counts, c.rank());
        Buffer in = filled(e, c.rank(), total);
        Buffer result(e, mine);
        nccl.reduce_scatter(in.data(), result.data(), counts, e).wait();
        for (size_t i = 0; i < mine; ++i)
          expect_close(result.get(i), reduced(world, first + i, ReduceOp::kSum), e,
                       str(elem_name(e), equal ? " equal" : " unequal", " [", i, "]"));
        // In place: the output is this rank's own block of the input.
        Buffer inplace = filled(e, c.rank(), total);
        void* own = static_cast<char*>(inplace.data()) + first * elem_size(e);
        nccl.reduce_scatter(inplace.data(), own, counts, e, ReduceOp::kMax).wait();
        for (size_t i = 0; i < mine; ++i)
          expect_close(inplace.get(first + i), reduced(world, first + i, ReduceOp::kMax), e,
                       "in place");
      }
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

TEST_P(NcclCollectives, AllgatherPutsEveryBlockInPlace) {
  const auto [world, n] = GetParam();
  auto out = run_ranks(world, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    for (bool equal : {true, false})
      for (ElemType e : {ElemType::kF32, ElemType::kBF16}) {
        const auto counts = blocks(world, n, equal);
        Buffer in = filled(e, c.rank(), counts[c.rank()]);
        Buffer result(e, first_of(counts, world));
        nccl.allgather(in.data(), result.data(), counts, e).wait();
        for (int r = 0; r < world; ++r) {
          const Buffer want = filled(e, r, counts[r]);
          for (size_t i = 0; i < counts[r]; ++i)
            EXPECT_EQ(result.get(first_of(counts, r) + i), want.get(i))
                << elem_name(e) << (equal ? " equal" : " unequal") << " block " << r;
        }
      }
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

TEST_P(NcclCollectives, BroadcastCopiesTheRootsBuffer) {
  const auto [world, n] = GetParam();
  auto out = run_ranks(world, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    for (int root = 0; root < world; ++root) {
      Buffer b = filled(ElemType::kF32, c.rank(), n);
      nccl.broadcast(b.data(), n, ElemType::kF32, root).wait();
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(b.get(i), value(root, i)) << "root " << root;
    }
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

TEST_P(NcclCollectives, SendRecvAlongAPipelineAndARing) {
  const auto [world, n] = GetParam();
  auto out = run_ranks(world, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    const int me = c.rank(), next = (me + 1) % world, prev = (me + world - 1) % world;
    // A pipeline: stage r hands its buffer to stage r + 1.
    Buffer got(ElemType::kF32, n);
    Buffer mine = filled(ElemType::kF32, me, n);
    if (me + 1 < world) nccl.send(mine.data(), n, ElemType::kF32, me + 1).wait();
    if (me > 0) {
      nccl.recv(got.data(), n, ElemType::kF32, me - 1).wait();
      for (size_t i = 0; i < n; ++i) EXPECT_EQ(got.get(i), value(me - 1, i));
    }
    // A ring shift: everyone sends and receives at once (one group each).
    Buffer ring(ElemType::kF32, n + 1);
    Buffer out_buf = filled(ElemType::kF32, me, n + 1);
    nccl.send_recv(out_buf.data(), n + 1, next, ring.data(), n + 1, prev, ElemType::kF32).wait();
    for (size_t i = 0; i < n + 1; ++i) EXPECT_EQ(ring.get(i), value(prev, i));
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

// Several calls in flight before the first wait: they complete in order on the one stream.
TEST_P(NcclCollectives, WorkInFlightCompletesInOrder) {
  const auto [world, n] = GetParam();
  auto out = run_ranks(world, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    Buffer a = filled(ElemType::kF32, c.rank(), n), b = filled(ElemType::kF32, c.rank(), n);
    NcclWork wa = nccl.allreduce(a.data(), n, ElemType::kF32);
    NcclWork wb = nccl.allreduce(b.data(), n, ElemType::kF32, ReduceOp::kMax);
    wb.wait();
    EXPECT_TRUE(wa.done());
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(a.get(i), reduced(world, i, ReduceOp::kSum));
      EXPECT_EQ(b.get(i), reduced(world, i, ReduceOp::kMax));
    }
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

// A work item completes on the device, not when it is enqueued: rank 0's all-reduce is not
// done while rank 1 has not made its call, and is once both waited.
TEST_F(Nccl, WorkIsDoneOnlyOnceEveryRankTookPart) {
  auto out = run_ranks(2, 10, [&](Communicator& c, NcclCommunicator& nccl) {
    float x = static_cast<float>(c.rank() + 1);
    if (c.rank() == 0) {
      NcclWork w = nccl.allreduce(&x, 1, ElemType::kF32);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_FALSE(w.done());  // rank 1 has not called yet: it waits for the barrier
      c.barrier();
      w.wait();
      EXPECT_TRUE(w.done());
    } else {
      c.barrier();
      nccl.allreduce(&x, 1, ElemType::kF32).wait();
    }
    EXPECT_EQ(x, 3.0f);
  });
  for (const auto& r : out) EXPECT_EQ(r.type, "") << r.error;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int w : {1, 2, 3, 4})
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1001}})
      out.push_back({w, n});
  return out;
}

INSTANTIATE_TEST_SUITE_P(WorldCount, NcclCollectives, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           return str("w", info.param.world, "_n", info.param.count);
                         });

// ---- failures ----

// Rank 2 stops calling (busy or hung in its own work): the others' allreduce times out at
// their deadline, not when rank 2 comes back, and names rank 2.
TEST_F(Nccl, StalledPeerGivesTimeoutNamingItWithinTheDeadline) {
  constexpr double kTimeout = 1.0;
  auto out = run_ranks(3, kTimeout, [&](Communicator& c, NcclCommunicator& nccl) {
    float x = 1;
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
    if (c.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(4000));
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    EXPECT_LT(out[r].seconds, kTimeout + 2);  // not when rank 2 wakes (4 s)
    EXPECT_FALSE(out[r].type.empty());
  }
  // The first rank to time out names rank 2; the other reports that failure through the
  // control plane, so both name it.
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(contains(out[r].error, "rank 2 stopped making progress")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "allreduce #1")) << out[r].error;
  }
  EXPECT_TRUE(out[0].type == "Timeout" || out[1].type == "Timeout");
  // Rank 2, back, finds the job aborted.
  EXPECT_EQ(out[2].type, "CommError");
  EXPECT_TRUE(contains(out[2].error, "control plane")) << out[2].error;
}

// A hung kernel on rank 1: every rank waits inside the call; all end at their deadline.
TEST_F(Nccl, DeviceHangEndsEveryRankAtTheDeadline) {
  constexpr double kTimeout = 0.8;
  mock_nccl_fault(1, MockFault::kStall, 1);
  auto out = run_ranks(3, kTimeout, [&](Communicator&, NcclCommunicator& nccl) {
    std::vector<float> x(10, 1.0f);
    nccl.allreduce(x.data(), x.size(), ElemType::kF32).wait();
    EXPECT_EQ(x[0], 3.0f);
    nccl.allreduce(x.data(), x.size(), ElemType::kF32).wait();
  });
  bool timed_out = false;
  for (const auto& r : out) {
    EXPECT_FALSE(r.type.empty());
    EXPECT_LT(r.seconds, kTimeout + 2);
    EXPECT_TRUE(contains(r.error, "allreduce #1")) << r.error;
    timed_out |= r.type == "Timeout" && contains(r.error, "did not complete within its deadline");
    EXPECT_TRUE(contains(r.error, "every rank is waiting inside allreduce #1")) << r.error;
  }
  EXPECT_TRUE(timed_out);
}

// The control plane learns that rank 1 died (here: it aborts the group itself, as a failing
// rank or the MPI heartbeat monitor does) while NCCL says nothing: the others' waits end at
// once with CommError carrying the control plane's account, long before the deadline.
TEST_F(Nccl, DeadPeerReportedByTheControlPlaneAbortsNccl) {
  auto out = run_ranks(3, 30, [&](Communicator& c, NcclCommunicator& nccl) {
    float x = 1;
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
    if (c.rank() == 1) {
      c.abort("comm: rank 1 failed: simulated crash");
      std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // NCCL stays silent
      return;
    }
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
  });
  for (int r : {0, 2}) {
    SCOPED_TRACE(r);
    EXPECT_EQ(out[r].type, "CommError");
    EXPECT_TRUE(contains(out[r].error, "control plane reports a failure")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "rank 1 failed: simulated crash")) << out[r].error;
    EXPECT_LT(out[r].seconds, 2.5);  // before rank 1 leaves (and long before 30 s)
  }
}

// Rank 2's process dies inside NCCL while the others wait in the call: NCCL reports
// ncclRemoteError; the others, whose NCCL sides poll, see rank 2's silent for a second, abort
// and name it, long before the deadline.
TEST_F(Nccl, DeadPeerReportedByNcclGivesCommErrorNamingIt) {
  mock_nccl_fault(2, MockFault::kDie, 1);
  auto out = run_ranks(3, 30, [&](Communicator& c, NcclCommunicator& nccl) {
    float x = 1;
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
    if (c.rank() == 2) {  // dies in its next call, once the others wait in theirs
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      (void)nccl.allreduce(&x, 1, ElemType::kF32);
      std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // dead: waits for nothing
      return;
    }
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
  });
  for (int r : {0, 1}) {
    SCOPED_TRACE(r);
    EXPECT_EQ(out[r].type, "CommError");
    EXPECT_TRUE(contains(out[r].error, "allreduce #1")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error, "ncclRemoteError")) << out[r].error;
    EXPECT_TRUE(contains(out[r].error,
                         "rank 2 stopped making progress: its NCCL side has shown "
                         "no activity"))
        << out[r].error;
    EXPECT_LT(out[r].seconds, 2.5);  // before rank 2's thread ends (and long before 30 s)
  }
}

// After an abort every call is refused, close() only releases, and NCCL's handle is never
// touched again (the mock counts any use of a freed communicator as a misuse).
TEST_F(Nccl, CallsAfterAbortAreRefusedAndCloseReleases) {
  auto out = run_ranks(2, 5, [&](Communicator& c, NcclCommunicator& nccl) {
    float x = 1;
    nccl.allreduce(&x, 1, ElemType::kF32).wait();
    if (c.rank() == 0) nccl.abort("test: rank 0 gives up");
    c.barrier();  // fails on rank 1 once rank 0 aborted the control group
  });
  EXPECT_EQ(out[0].type, "CommError");  // its barrier, on the aborted control group
  EXPECT_EQ(out[1].type, "CommError");
  EXPECT_TRUE(contains(out[1].error, "test: rank 0 gives up")) << out[1].error;

  mock_nccl_reset();
  run_ranks(1, 5, [&](Communicator&, NcclCommunicator& nccl) {
    nccl.abort("test: abort");
    EXPECT_TRUE(nccl.aborted());
    float x = 1;
    try {
      (void)nccl.allreduce(&x, 1, ElemType::kF32);
      ADD_FAILURE() << "allreduce after abort did not throw";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e.what(), "refused")) << e.what();
      EXPECT_TRUE(contains(e.what(), "test: abort")) << e.what();
    }
  });
}

// Ranks that disagree (different counts): NCCL's error reaches every rank as CommError.
TEST_F(Nccl, RanksThatDisagreeGetCommError) {
  expected_misuses_ = 1;  // the mock's record of the disagreement
  auto out = run_ranks(2, 5, [&](Communicator& c, NcclCommunicator& nccl) {
    std::vector<float> x(4, 1.0f);
    nccl.allreduce(x.data(), c.rank() == 0 ? 4 : 3, ElemType::kF32).wait();
  });
  for (const auto& r : out) {
    EXPECT_EQ(r.type, "CommError");
    EXPECT_TRUE(contains(r.error, "ncclInvalidUsage") || contains(r.error, "control plane"))
        << r.error;
  }
}

}  // namespace
}  // namespace tessel::comm
