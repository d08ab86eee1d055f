// MemoryLedger and MemoryScope: per-category current and peak bytes, the limit and the error
// that names the category, what is held and what to do, nested and per-thread scopes, and
// releases from another thread. (Storage charging is tested in tests/tensor.)
#include "tessel/core/memory.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace tessel {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(MemoryLedger, CurrentAndPeakPerCategoryAndInTotal) {
  MemoryLedger l;
  EXPECT_EQ(l.limit(), 0);
  l.charge(MemCategory::kParameters, 100);
  l.charge(MemCategory::kGradients, 50);
  l.charge(MemCategory::kParameters, 20);
  l.release(MemCategory::kParameters, 70);
  EXPECT_EQ(l.current(MemCategory::kParameters), 50);
  EXPECT_EQ(l.peak(MemCategory::kParameters), 120);
  EXPECT_EQ(l.current(MemCategory::kGradients), 50);
  EXPECT_EQ(l.peak(MemCategory::kGradients), 50);
  EXPECT_EQ(l.current(MemCategory::kOptimizer), 0);
  EXPECT_EQ(l.peak(MemCategory::kOptimizer), 0);
  EXPECT_EQ(l.total(), 100);
  EXPECT_EQ(l.peak_total(), 170);
  // The total's peak is the most held at once, not the sum of the categories' peaks.
  l.release(MemCategory::kGradients, 50);
  l.charge(MemCategory::kActivations, 100);
  EXPECT_EQ(l.peak_total(), 170);
  EXPECT_EQ(l.peak(MemCategory::kActivations), 100);
  l.charge(MemCategory::kActivations, 30);
  EXPECT_EQ(l.peak_total(), 180);
  // reset_peaks: peaks restart from what is held now.
  l.reset_peaks();
  EXPECT_EQ(l.peak(MemCategory::kParameters), 50);
  EXPECT_EQ(l.peak(MemCategory::kGradients), 0);
  EXPECT_EQ(l.peak(MemCategory::kActivations), 130);
  EXPECT_EQ(l.peak_total(), 180);
  l.release(MemCategory::kActivations, 130);
  l.reset_peaks();
  EXPECT_EQ(l.peak_total(), 50);
  EXPECT_EQ(l.peak(MemCategory::kActivations), 0);
}

TEST(MemoryLedger, CategoryNames) {
  EXPECT_STREQ(mem_category_name(MemCategory::kParameters), "parameters");
  EXPECT_STREQ(mem_category_name(MemCategory::kGradients), "gradients");
  EXPECT_STREQ(mem_category_name(MemCategory::kOptimizer), "optimizer_state");
  EXPECT_STREQ(mem_category_name(MemCategory::kActivations), "activations");
  EXPECT_STREQ(mem_category_name(MemCategory::kComm), "comm_buffers");
  EXPECT_STREQ(mem_category_name(MemCategory::kOther), "other");
}

std::string limit_error(MemoryLedger& l, MemCategory c, int64_t bytes) {
  try {
    l.charge(c, bytes);
  } catch (const MemoryLimitError& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& message, const std::string& needle) {
  EXPECT_NE(message.find(needle), std::string::npos) << "'" << needle << "' not in: " << message;
}

// Up to the limit is fine; past it the charge throws, names the rank, the category, what is
// held by category and what to do, and charges nothing.
TEST(MemoryLedger, LimitErrorNamesCategoryHeldAndRemedyAndChargesNothing) {
  MemoryLedger l(2 * kMiB, "rank 3");
  EXPECT_EQ(l.limit(), 2 * kMiB);
  l.charge(MemCategory::kParameters, kMiB);
  l.charge(MemCategory::kOptimizer, kMiB / 2);
  const std::string e = limit_error(l, MemCategory::kOptimizer, kMiB);
  ASSERT_FALSE(e.empty()) << "no MemoryLimitError";
  expect_has(e, "memory: rank 3");
  expect_has(e, "2.5 MiB > runtime.memory_limit_mb = 2");
  expect_has(e, "1 MiB of optimizer_state");
  expect_has(e, "with it: parameters 1 MiB, optimizer_state 1.5 MiB; the most is optimizer_state");
  expect_has(e, "zero.stage = 1");
  EXPECT_EQ(l.total(), kMiB + kMiB / 2);
  EXPECT_EQ(l.current(MemCategory::kOptimizer), kMiB / 2);
  EXPECT_EQ(l.peak(MemCategory::kOptimizer), kMiB / 2);
  EXPECT_EQ(l.peak_total(), kMiB + kMiB / 2);
  l.charge(MemCategory::kOptimizer, kMiB / 2);  // exactly at the limit
  EXPECT_EQ(l.total(), 2 * kMiB);
  EXPECT_THROW(l.charge(MemCategory::kOther, 1), MemoryLimitError);
  l.release(MemCategory::kParameters, kMiB);
  l.charge(MemCategory::kOther, kMiB);  // room again once released
  EXPECT_EQ(l.total(), 2 * kMiB);
}

TEST(MemoryLedger, EachCategorySaysWhatFreesIt) {
  MemoryLedger l(kMiB);
  const std::string grads = limit_error(l, MemCategory::kGradients, 2 * kMiB);
  expect_has(grads, "gradients");
  expect_has(grads, "zero.stage = 2");
  expect_has(grads, "with it: gradients 2 MiB; the most is gradients");
  expect_has(grads, "memory: this rank");
  expect_has(limit_error(l, MemCategory::kParameters, 2 * kMiB), "zero.stage = 3");
  expect_has(limit_error(l, MemCategory::kComm, 2 * kMiB), "comm_buffers");
  expect_has(limit_error(l, MemCategory::kActivations, 2 * kMiB), "train.batch");
  for (int c = 0; c < kMemCategories; ++c)  // and always the limit itself
    if (!host_category(MemCategory(c)))
      expect_has(limit_error(l, MemCategory(c), 2 * kMiB), "raise runtime.memory_limit_mb");
  EXPECT_EQ(l.peak_total(), 0);
  static_assert(std::is_base_of_v<Error, MemoryLimitError>, "a tessel::Error like the others");
}

// A device rank's activations and optimizer state offloaded to host memory are shown, not
// counted in its total or its limit (train.offload = activations | optimizer | all).
TEST(MemoryLedger, OffloadedBytesAreOutsideTheTotalAndTheLimit) {
  for (const MemCategory host : {MemCategory::kOffloaded, MemCategory::kOptimizerOffloaded}) {
    SCOPED_TRACE(mem_category_name(host));
    MemoryLedger l(kMiB);
    l.charge(MemCategory::kActivations, kMiB / 2);
    l.charge(host, 2 * kMiB);
    EXPECT_EQ(l.current(host), 2 * kMiB);
    EXPECT_EQ(l.peak(host), 2 * kMiB);
    EXPECT_EQ(l.total(), kMiB / 2);
    EXPECT_EQ(l.peak_total(), kMiB / 2);
    l.release(host, 2 * kMiB);
    EXPECT_EQ(l.current(host), 0);
    EXPECT_EQ(l.total(), kMiB / 2);
  }
  EXPECT_STREQ(mem_category_name(MemCategory::kOffloaded), "activations_offloaded");
  EXPECT_STREQ(mem_category_name(MemCategory::kOptimizerOffloaded), "optimizer_offloaded");
}

TEST(MemoryLedger, NoLimitNeverThrows) {
  MemoryLedger l;
  l.charge(MemCategory::kParameters, int64_t{1} << 50);
  EXPECT_EQ(l.total(), int64_t{1} << 50);
}

// Counters are atomic: charges and releases from several threads (a storage freed on another
// thread than the one that made it) balance out.
TEST(MemoryLedger, ChargesAndReleasesFromManyThreadsBalance) {
  MemoryLedger l;
  l.charge(MemCategory::kComm, 64);
  std::thread([&] { l.release(MemCategory::kComm, 64); }).join();
  EXPECT_EQ(l.current(MemCategory::kComm), 0);
  EXPECT_EQ(l.total(), 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&l, t] {
      const MemCategory c = MemCategory(t % kMemCategories);
      for (int i = 0; i < 2000; ++i) {
        l.charge(c, 64);
        l.release(c, 64);
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(l.total(), 0);
  for (int c = 0; c < kMemCategories; ++c) EXPECT_EQ(l.current(MemCategory(c)), 0);
  EXPECT_GE(l.peak_total(), 64);
  EXPECT_LE(l.peak_total(), 4 * 64);
}

TEST(MemoryScope, NestsAndRestores) {
  ASSERT_EQ(current_ledger(), nullptr);  // nothing charged outside a scope
  ASSERT_EQ(current_category(), MemCategory::kOther);
  auto a = std::make_shared<MemoryLedger>(), b = std::make_shared<MemoryLedger>();
  {
    MemoryScope outer(a, MemCategory::kParameters);
    EXPECT_EQ(current_ledger(), a);
    EXPECT_EQ(current_category(), MemCategory::kParameters);
    {
      MemoryScope category_only(MemCategory::kGradients);  // same ledger, another category
      EXPECT_EQ(current_ledger(), a);
      EXPECT_EQ(current_category(), MemCategory::kGradients);
      {
        MemoryScope other(b, MemCategory::kComm);
        EXPECT_EQ(current_ledger(), b);
        EXPECT_EQ(current_category(), MemCategory::kComm);
        {
          MemoryScope none(nullptr, MemCategory::kOptimizer);
          EXPECT_EQ(current_ledger(), nullptr);
          EXPECT_EQ(current_category(), MemCategory::kOptimizer);
        }
        EXPECT_EQ(current_ledger(), b);
        EXPECT_EQ(current_category(), MemCategory::kComm);
      }
      EXPECT_EQ(current_ledger(), a);
      EXPECT_EQ(current_category(), MemCategory::kGradients);
    }
    EXPECT_EQ(current_ledger(), a);
    EXPECT_EQ(current_category(), MemCategory::kParameters);
  }
  EXPECT_EQ(current_ledger(), nullptr);
  EXPECT_EQ(current_category(), MemCategory::kOther);
  EXPECT_EQ(a.use_count(), 1);  // the scopes kept no reference
  EXPECT_EQ(b.use_count(), 1);
}

TEST(MemoryScope, IsPerThread) {
  auto a = std::make_shared<MemoryLedger>(), b = std::make_shared<MemoryLedger>();
  MemoryScope scope(a, MemCategory::kActivations);
  std::thread([&] {
    EXPECT_EQ(current_ledger(), nullptr);
    EXPECT_EQ(current_category(), MemCategory::kOther);
    MemoryScope own(b, MemCategory::kComm);
    EXPECT_EQ(current_ledger(), b);
  }).join();
  EXPECT_EQ(current_ledger(), a);
  EXPECT_EQ(current_category(), MemCategory::kActivations);
}

}  // namespace
}  // namespace tessel
