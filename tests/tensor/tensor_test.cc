// Tensor and Storage: shapes, views, conversions, alignment; every Storage charging the memory
// ledger of the thread that allocates it (core/memory.h) until it is freed or rebound.
#include "tessel/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "tessel/core/memory.h"

namespace tessel {
namespace {

TEST(Tensor, ZerosAlignedAndShaped) {
  Tensor t = Tensor::zeros({3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_THROW(t.data<int32_t>(), Error);
  EXPECT_THROW(Tensor().data<float>(), Error);  // undefined (e.g. an unbound parameter)
  EXPECT_THROW(Tensor::empty({2, -1}), InvalidArgument);
}

TEST(Tensor, ViewsShareStorageCloneDoesNot) {
  Tensor t = Tensor::zeros({10});
  Tensor v = t.view(4, {2, 3});
  v.fill_(2.0f);
  EXPECT_EQ(t.data<float>()[3], 0.0f);
  EXPECT_EQ(t.data<float>()[4], 2.0f);
  EXPECT_EQ(t.data<float>()[9], 2.0f);
  Tensor c = t.clone();
  c.fill_(1.0f);
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  EXPECT_THROW(t.view(8, {3}), Error);
  EXPECT_EQ(t.reshape({2, -1}).dim(1), 5);
  EXPECT_THROW(t.reshape({3, -1}), Error);
}

TEST(Tensor, HalfConversionsRoundTrip) {
  Tensor t = Tensor::empty({6});
  float vals[6] = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f};
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = vals[i];
  Tensor h = t.to(DType::kF16).to(DType::kF32);
  Tensor b = t.to(DType::kBF16).to(DType::kF32);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(h.data<float>()[i], vals[i], std::fabs(vals[i]) * 1e-3 + 6e-8) << i;
    EXPECT_NEAR(b.data<float>()[i], vals[i], std::fabs(vals[i]) * 8e-3 + 1e-30) << i;
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e6f)), INFINITY);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  // Every finite f16 survives f16 -> f32 -> f16 exactly.
  for (uint32_t h16 = 0; h16 < 0x10000; ++h16) {
    if ((h16 & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h16))), h16) << h16;
  }
}

TEST(StorageRebind, MovesEveryViewToOtherMemory) {
  Tensor t = Tensor::zeros({4});
  Tensor w = t.view(0, {4});  // taken before the move: follows it
  w.fill_(2.0f);
  auto block = std::shared_ptr<void>(std::aligned_alloc(64, 64), std::free);
  std::memcpy(block.get(), t.raw(), t.nbytes());
  t.storage().rebind(block.get(), block);
  EXPECT_EQ(w.raw(), block.get());
  EXPECT_EQ(static_cast<float*>(block.get())[3], 2.0f);
  static_cast<float*>(block.get())[1] = 5.0f;
  EXPECT_EQ(w.data<float>()[1], 5.0f);
  char unaligned[80];
  EXPECT_THROW(t.storage().rebind(unaligned + 1, block), Error);
}

// ---- memory accounting ----

constexpr int64_t kMiB = 1 << 20;

TEST(StorageMemory, ChargesTheAllocatingThreadsLedgerUnderItsCategory) {
  auto ledger = std::make_shared<MemoryLedger>();
  {
    Tensor outside = Tensor::zeros({100});  // no scope: nothing to charge
    MemoryScope scope(ledger, MemCategory::kActivations);
    Tensor t = Tensor::zeros({3, 5});  // 60 bytes, a 64-byte aligned block
    EXPECT_EQ(ledger->current(MemCategory::kActivations), 64);
    Tensor view = t.view(2, {4});
    Tensor copy = t;
    Tensor reshaped = t.reshape({15});
    EXPECT_EQ(ledger->total(), 64);  // views share the storage: charged once
    Tensor cloned = t.clone();
    EXPECT_EQ(ledger->total(), 128);
    {
      MemoryScope params(MemCategory::kParameters);
      Tensor big = Tensor::empty({1000});  // 4000 bytes -> 4032
      EXPECT_EQ(ledger->current(MemCategory::kParameters), 4032);
    }
    EXPECT_EQ(ledger->current(MemCategory::kParameters), 0);
    EXPECT_EQ(ledger->peak(MemCategory::kParameters), 4032);
    t = Tensor();
    copy = Tensor();
    reshaped = Tensor();
    EXPECT_EQ(ledger->total(), 128);  // `view` still holds the storage
    view = Tensor();
    EXPECT_EQ(ledger->total(), 64);
    outside = Tensor();  // freed inside the scope, charged to none: releases nothing
    EXPECT_EQ(ledger->total(), 64);
  }
  EXPECT_EQ(ledger->total(), 0);
  EXPECT_EQ(ledger->peak_total(), 64 + 64 + 4032);
}

// A storage remembers where it was charged: freeing it in another category, scope or thread
// releases the bytes from the ledger and category that were charged.
TEST(StorageMemory, ReleasesToTheLedgerAndCategoryItCharged) {
  auto a = std::make_shared<MemoryLedger>(), b = std::make_shared<MemoryLedger>();
  Tensor t;
  {
    MemoryScope scope(a, MemCategory::kComm);
    t = Tensor::empty({16});
  }
  {
    MemoryScope scope(b, MemCategory::kGradients);
    t = Tensor();
  }
  EXPECT_EQ(a->current(MemCategory::kComm), 0);
  EXPECT_EQ(a->peak(MemCategory::kComm), 64);
  EXPECT_EQ(b->peak_total(), 0);
  EXPECT_EQ(b->current(MemCategory::kGradients), 0);
}

TEST(StorageMemory, FreedOnAnotherThreadReleasesItsBytes) {
  auto a = std::make_shared<MemoryLedger>(), b = std::make_shared<MemoryLedger>();
  Tensor t;
  {
    MemoryScope scope(a, MemCategory::kActivations);
    t = Tensor::empty({1024});
  }
  EXPECT_EQ(a->total(), 4096);
  std::thread([&b, moved = std::move(t)]() mutable {
    MemoryScope scope(b, MemCategory::kOther);  // the freeing thread's ledger is not charged
    moved = Tensor();
  }).join();
  EXPECT_EQ(a->current(MemCategory::kActivations), 0);
  EXPECT_EQ(a->total(), 0);
  EXPECT_EQ(b->peak_total(), 0);
  // And the other way round: made on a worker with its own ledger, freed here.
  Tensor from_worker;
  std::thread([&] {
    MemoryScope scope(b, MemCategory::kComm);
    from_worker = Tensor::empty({16});
  }).join();
  EXPECT_EQ(b->current(MemCategory::kComm), 64);
  from_worker = Tensor();
  EXPECT_EQ(b->current(MemCategory::kComm), 0);
}

// A storage keeps its ledger alive: the owner may drop it first.
TEST(StorageMemory, StorageOutlivingItsLedgersOwner) {
  auto ledger = std::make_shared<MemoryLedger>();
  std::weak_ptr<MemoryLedger> weak = ledger;
  Tensor t;
  {
    MemoryScope scope(std::move(ledger), MemCategory::kOther);
    t = Tensor::empty({4});
  }
  ASSERT_FALSE(weak.expired());
  EXPECT_EQ(weak.lock()->total(), 64);
  t = Tensor();
  EXPECT_TRUE(weak.expired());
}

// Rebinding to other memory gives back the own allocation's bytes, once.
TEST(StorageMemory, RebindReleasesTheOwnAllocationOnce) {
  auto ledger = std::make_shared<MemoryLedger>();
  MemoryScope scope(ledger, MemCategory::kParameters);
  {
    Tensor t = Tensor::zeros({32});
    EXPECT_EQ(ledger->current(MemCategory::kParameters), 128);
    auto block = std::shared_ptr<void>(std::aligned_alloc(64, 128), std::free);
    t.storage().rebind(block.get(), block);
    EXPECT_EQ(ledger->current(MemCategory::kParameters), 0);
    auto again = std::shared_ptr<void>(std::aligned_alloc(64, 128), std::free);
    t.storage().rebind(again.get(), again);
    EXPECT_EQ(ledger->current(MemCategory::kParameters), 0);
  }
  EXPECT_EQ(ledger->current(MemCategory::kParameters), 0);  // destroyed: nothing released twice
  EXPECT_EQ(ledger->total(), 0);
  EXPECT_EQ(ledger->peak_total(), 128);
}

// Past the limit the allocation throws MemoryLimitError naming the category, before any memory
// is taken (4 TiB would not be allocatable at all) and with nothing charged.
TEST(StorageMemory, OverTheLimitThrowsBeforeAllocatingAndChargesNothing) {
  auto ledger = std::make_shared<MemoryLedger>(kMiB, "rank 1");
  MemoryScope scope(ledger, MemCategory::kParameters);
  Tensor held = Tensor::empty({kMiB / 8});  // 0.5 MiB of parameters
  MemoryScope acts(MemCategory::kActivations);
  try {
    Tensor::empty({int64_t{1} << 40});
    FAIL() << "no MemoryLimitError";
  } catch (const MemoryLimitError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("of activations"), std::string::npos) << m;
    EXPECT_NE(m.find("with it: parameters 0.5 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("train.batch"), std::string::npos) << m;
  }
  EXPECT_THROW(Tensor::empty({kMiB / 8 + 1}), MemoryLimitError);  // just over
  EXPECT_EQ(ledger->total(), kMiB / 2);
  EXPECT_EQ(ledger->current(MemCategory::kActivations), 0);
  EXPECT_EQ(ledger->peak(MemCategory::kActivations), 0);
  Tensor fits = Tensor::empty({kMiB / 8});  // exactly up to the limit
  EXPECT_EQ(ledger->total(), kMiB);
}

}  // namespace
}  // namespace tessel
