// Unit tests of the comm area: vocabulary, kernels, point to point, async, split, tensors and
// the properties collectives must have beyond conformance (identical bits on every rank).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "../../src/comm/reduce.h"
#include "tessel/comm/algorithms.h"
#include "tessel/comm/mpi.h"
#include "tessel/comm/threads.h"
#include "tessel/core/rng.h"

namespace tessel::comm {
namespace {

TEST(Types, NamesAndSizes) {
  EXPECT_EQ(elem_size(ElemType::kF64), 8u);
  EXPECT_EQ(elem_size(ElemType::kBF16), 2u);
  EXPECT_EQ(elem_type(DType::kBF16), ElemType::kBF16);
  EXPECT_EQ(elem_type_from_name("f16"), ElemType::kF16);
  EXPECT_THROW(elem_type_from_name("f8"), InvalidArgument);
  EXPECT_EQ(algorithm_from_name("hd"), Algorithm::kHalvingDoubling);
  EXPECT_EQ(parse_algorithms("ring, tree,native"),
            (std::vector<Algorithm>{Algorithm::kRing, Algorithm::kTree, Algorithm::kNative}));
  EXPECT_THROW(parse_algorithms("ring,butterfly"), InvalidArgument);
}

TEST(Types, SizesParse) {
  EXPECT_EQ(parse_bytes("4KiB"), 4096u);
  EXPECT_EQ(parse_bytes("64MB"), 64000000u);
  EXPECT_EQ(parse_bytes("100"), 100u);
  EXPECT_THROW(parse_bytes("4XB"), InvalidArgument);
  EXPECT_EQ(parse_size_list("4KiB..64MiB"),
            (std::vector<size_t>{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                                 64 << 20}));
  EXPECT_EQ(parse_size_list("1KiB..8KiB:2,100"),
            (std::vector<size_t>{1024, 2048, 4096, 8192, 100}));
  EXPECT_THROW(parse_size_list("64MiB..4KiB"), InvalidArgument);
}

TEST(Types, Deadline) {
  EXPECT_TRUE(Deadline::never().is_never());
  EXPECT_FALSE(Deadline::never().expired());
  EXPECT_TRUE(Deadline::after(-1).expired());
  EXPECT_GT(Deadline::after(10).remaining_s(), 9.0);
}

TEST(Kernels, HalfPrecisionReducesInF32AndRoundsToNearestEven) {
  // 1 + 2^-8 is not a bf16; summed in f32 and rounded once it becomes 1 (ties to even).
  const float a = 1.0f, b = 1.0f / 256;
  for (ElemType e : {ElemType::kBF16, ElemType::kF16}) {
    std::vector<uint16_t> acc(1000), in(1000);
    for (size_t i = 0; i < acc.size(); ++i) {
      float x = a + static_cast<float>(i % 7), y = b * static_cast<float>(i % 5);
      acc[i] = e == ElemType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
      in[i] = e == ElemType::kBF16 ? f32_to_bf16(y) : f32_to_f16(y);
    }
    std::vector<uint16_t> want(acc.size());
    for (size_t i = 0; i < acc.size(); ++i) {
      float s = e == ElemType::kBF16 ? bf16_to_f32(acc[i]) + bf16_to_f32(in[i])
                                     : f16_to_f32(acc[i]) + f16_to_f32(in[i]);
      want[i] = e == ElemType::kBF16 ? f32_to_bf16(s) : f32_to_f16(s);
    }
    reduce_into(acc.data(), in.data(), acc.size(), e, ReduceOp::kSum);
    EXPECT_EQ(acc, want) << elem_name(e);
  }
}

TEST(Kernels, MaxMinAndAverage) {
  std::vector<int64_t> a{1, 5, -3}, b{4, 2, -9};
  reduce_into(a.data(), b.data(), 3, ElemType::kI64, ReduceOp::kMax);
  EXPECT_EQ(a, (std::vector<int64_t>{4, 5, -3}));
  reduce_into(a.data(), b.data(), 3, ElemType::kI64, ReduceOp::kMin);
  EXPECT_EQ(a, (std::vector<int64_t>{4, 2, -9}));
  std::vector<double> d{3, 9};
  divide_by(d.data(), 2, ElemType::kF64, 3);
  EXPECT_EQ(d, (std::vector<double>{1, 3}));
}

TEST(Algorithms, EvenCounts) {
  EXPECT_EQ(even_counts(10, 4), (std::vector<size_t>{3, 3, 2, 2}));
  EXPECT_EQ(even_counts(2, 3), (std::vector<size_t>{1, 1, 0}));
}

// Random (non-integer) floats: every rank must end with the same bits, close to the f64 sum.
TEST(Collectives, AllreduceGivesIdenticalBitsOnEveryRank) {
  for (Algorithm a :
       {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kTree, Algorithm::kDirect}) {
    for (int world : {3, 4, 6})
      for (size_t n : {size_t{1000}, size_t{10007}}) {  // short and long halving-doubling
        std::vector<std::vector<float>> results(world);
        CommOptions options;
        options.segment_bytes = 8192;
        run_threads(
            world,
            [&](Communicator& c) {
              CounterRng rng(42, static_cast<uint64_t>(c.rank()));
              std::vector<float> buf(n);
              for (size_t i = 0; i < n; ++i) buf[i] = rng.normal(i);
              CallOptions call;
              call.algorithm = a;
              c.allreduce(buf.data(), n, ElemType::kF32, ReduceOp::kSum, call);
              results[c.rank()] = std::move(buf);
            },
            options);
        for (int r = 1; r < world; ++r)
          EXPECT_EQ(0, std::memcmp(results[0].data(), results[r].data(), n * 4))
              << algorithm_name(a) << " world " << world << " rank " << r;
        for (size_t i = 0; i < n; i += 97) {
          double want = 0;
          for (int r = 0; r < world; ++r) want += CounterRng(42, r).normal(i);
          EXPECT_NEAR(results[0][i], want, 1e-4) << i;
        }
      }
  }
}

TEST(PointToPoint, InOrderPerTagAndAnyOrderAcrossTags) {
  run_threads(2, [](Communicator& c) {
    if (c.rank() == 0) {
      // A send completes when matched (no eager buffering), so post them all, then wait.
      int vals[6] = {0, 1, 2, 3, 4, 100};
      std::vector<Work> works;
      for (int i = 0; i < 5; ++i) works.push_back(c.isend(&vals[i], 1, ElemType::kI32, 1, 3));
      works.push_back(c.isend(&vals[5], 1, ElemType::kI32, 1, 9));
      for (Work& w : works) w.wait();
    } else {
      int x = -1;
      c.recv(&x, 1, ElemType::kI32, 0, 9);  // posted first, matches the last send
      EXPECT_EQ(x, 100);
      for (int i = 0; i < 5; ++i) {
        c.recv(&x, 1, ElemType::kI32, 0, 3);
        EXPECT_EQ(x, i);
      }
    }
  });
}

TEST(PointToPoint, AsyncExchangeAndTensors) {
  run_threads(2, [](Communicator& c) {
    int peer = 1 - c.rank();
    Tensor mine = Tensor::zeros({4, 8});
    mine.fill_(static_cast<float>(c.rank() + 1));
    Tensor theirs = Tensor::zeros({4, 8});
    Work r = c.irecv(theirs.raw(), 32, ElemType::kF32, peer, 1);
    Work s = c.isend(mine.raw(), 32, ElemType::kF32, peer, 1);
    s.wait();
    r.wait();
    EXPECT_TRUE(r.done());
    EXPECT_EQ(theirs.data<float>()[31], static_cast<float>(peer + 1));
    if (c.rank() == 0) {
      c.send(mine, peer, 2);
    } else {
      c.recv(theirs, peer, 2);
      EXPECT_EQ(theirs.data<float>()[0], 1.0f);
    }
  });
}

TEST(Async, WorksCompleteInOrderWhileTheCallerComputes) {
  run_threads(3, [](Communicator& c) {
    const size_t n = 1 << 16;
    std::vector<std::vector<float>> bufs(6, std::vector<float>(n));
    std::vector<Work> works;
    for (size_t b = 0; b < bufs.size(); ++b) {
      std::fill(bufs[b].begin(), bufs[b].end(), static_cast<float>(c.rank() + b));
      works.push_back(c.allreduce_async(bufs[b].data(), n, ElemType::kF32, ReduceOp::kAvg));
    }
    volatile double sink = 0;  // "compute" while the buckets move
    for (int i = 0; i < 200000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
    c.barrier();  // a blocking call drains the queue first
    for (size_t b = 0; b < bufs.size(); ++b) {
      EXPECT_TRUE(works[b].done());
      works[b].wait();
      EXPECT_EQ(bufs[b][n - 1], 1.0f + static_cast<float>(b)) << b;  // mean of r + b over 3
    }
  });
}

TEST(Split, GroupsByColorOrderedByKey) {
  std::vector<int> sub_rank(6), sub_size(6), sums(6);
  run_threads(6, [&](Communicator& c) {
    // Colors {0, 1, 2} by rank % 3; key reverses the order inside each group.
    Communicator sub = c.split(c.rank() % 3, -c.rank());
    sub_rank[c.rank()] = sub.rank();
    sub_size[c.rank()] = sub.size();
    int x = c.rank();
    sub.allreduce(&x, 1, ElemType::kI32);
    sums[c.rank()] = x;
    Communicator none = c.split(c.rank() == 0 ? -1 : 0, 0);
    EXPECT_EQ(none.valid(), c.rank() != 0);
    if (none.valid()) {
      EXPECT_EQ(none.size(), 5);
      none.barrier();
    }
  });
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(sub_size[r], 2);
    EXPECT_EQ(sub_rank[r], r < 3 ? 1 : 0);  // higher old rank -> lower key -> rank 0
    EXPECT_EQ(sums[r], (r % 3) * 2 + 3);
  }
}

TEST(SharedMemory, OneBlockEveryRankReadsAndWrites) {
  std::vector<int> seen(3, 0);
  run_threads(3, [&](Communicator& c) {
    std::shared_ptr<void> block = c.shared_memory(3 * 64);
    ASSERT_NE(block, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block.get()) % 64, 0u);
    auto* v = static_cast<int*>(block.get());
    EXPECT_EQ(v[c.rank() * 16], 0);  // zeroed
    v[c.rank() * 16] = 10 + c.rank();
    c.barrier();
    for (int r = 0; r < 3; ++r) seen[c.rank()] += v[r * 16];
    // Sub-groups get blocks of their own; different sizes are an error on every rank.
    Communicator pair = c.split(c.rank() < 2 ? 0 : -1, 0);
    if (pair.valid()) {
      std::shared_ptr<void> other = pair.shared_memory(64);
      EXPECT_NE(other.get(), block.get());
    }
    EXPECT_THROW(c.shared_memory(c.rank() == 0 ? 64 : 128), InvalidArgument);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(seen[r], 10 + 11 + 12);
}

TEST(Tensors, AllgatherAndReduceScatter) {
  run_threads(4, [](Communicator& c) {
    Tensor shard = Tensor::zeros({3});
    shard.fill_(static_cast<float>(c.rank()));
    Tensor full = Tensor::zeros({12});
    c.allgather(shard, full);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(full.data<float>()[i], static_cast<float>(i / 3));
    Tensor out = Tensor::zeros({3});
    c.reduce_scatter(full, out, ReduceOp::kSum);
    EXPECT_EQ(out.data<float>()[0], 4.0f * static_cast<float>(c.rank()));
    EXPECT_THROW(c.allgather(shard, out), InvalidArgument);
  });
}

TEST(Auto, ChoosesBySizeAndWorld) {
  auto four = make_thread_world(4);
  const AutoThresholds t;
  EXPECT_EQ(four[0].choose(OpKind::kAllreduce, 1024), Algorithm::kHalvingDoubling);
  EXPECT_EQ(four[0].choose(OpKind::kAllreduce, t.ring_min_bytes / 2), Algorithm::kHalvingDoubling);
  EXPECT_EQ(four[0].choose(OpKind::kAllreduce, 64 << 20), Algorithm::kRing);
  EXPECT_EQ(four[0].choose(OpKind::kBroadcast, 1024), Algorithm::kTree);
  auto three = make_thread_world(3);  // not a power of two: the ring takes over 4x earlier
  EXPECT_EQ(three[0].choose(OpKind::kAllreduce, t.ring_min_bytes / 2), Algorithm::kRing);
  EXPECT_EQ(four[0].choose(OpKind::kGather, 64 << 20), Algorithm::kDirect);
  EXPECT_EQ(four[0].choose(OpKind::kAllreduce, 64 << 20, Algorithm::kTree), Algorithm::kTree);
  CommOptions o;
  o.algorithm = Algorithm::kRing;
  auto ring = make_thread_world(2, o);
  EXPECT_EQ(ring[0].choose(OpKind::kAllreduce, 8), Algorithm::kRing);
  EXPECT_EQ(ring[0].choose(OpKind::kGather, 8), Algorithm::kDirect);  // ring unsupported there
}

TEST(Mpi, EntryPointsExistInEveryBuild) {
  if (!mpi_built()) {
    EXPECT_THROW(mpi_world(), CommError);
  }
}

}  // namespace
}  // namespace tessel::comm
