// Memory accounting per rank: every tensor Storage charges its bytes to the ledger of the thread
// that allocates it, under the category that thread is in (MemoryScope), and gives them back
// when freed. A rank's engine sets its ledger and the category around each allocation site
// (parameters, gradients, optimizer state, activations, communication buffers), so the figures
// are measured from the allocations themselves, not computed from formulas. An optional limit
// turns an allocation that would pass it into a MemoryLimitError naming the category.
// Counters are atomic: a storage may be freed on another thread than the one that made it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "tessel/core/error.h"

namespace tessel {

enum class MemCategory : uint8_t {
  kParameters,
  kGradients,
  kOptimizer,
  kActivations,
  kComm,  // communication buffers: gathered parameters, gradient buckets, copies in flight
  kOther,
  kOffloaded,           // host copies of a device rank's activations (train.offload = activations)
  kOptimizerOffloaded,  // a device rank's optimizer state in host memory (train.offload =
                        // optimizer)
};
constexpr int kMemCategories = 8;
// Host memory beside a device rank's (the offloaded categories): shown, not in its total.
constexpr bool host_category(MemCategory c) {
  return c == MemCategory::kOffloaded || c == MemCategory::kOptimizerOffloaded;
}
const char* mem_category_name(MemCategory c);  // "parameters", "optimizer_state", ...

// An allocation would pass runtime.memory_limit_mb.
class MemoryLimitError : public Error {
 public:
  using Error::Error;
};

class MemoryLedger {
 public:
  // limit_bytes 0: no limit. `owner` names the rank in messages ("rank 3").
  explicit MemoryLedger(int64_t limit_bytes = 0, std::string owner = "this rank");

  // Throws MemoryLimitError (charging nothing) when the total would pass the limit.
  void charge(MemCategory c, int64_t bytes);
  void release(MemCategory c, int64_t bytes) noexcept;

  int64_t current(MemCategory c) const;
  int64_t peak(MemCategory c) const;  // since construction or reset_peaks()
  int64_t total() const;
  int64_t peak_total() const;
  void reset_peaks();
  int64_t limit() const { return limit_; }
  // What an over-limit error advises instead of its largest category's remedy (ZeRO, smaller
  // batches), for a rank whose role those do not fit: a parameter server.
  void set_advice(std::string advice) { advice_ = std::move(advice); }

 private:
  int64_t limit_;
  std::string owner_, advice_;
  std::array<std::atomic<int64_t>, kMemCategories> current_{};
  std::array<std::atomic<int64_t>, kMemCategories> peak_{};
  std::atomic<int64_t> total_{0}, peak_total_{0};
};

// While alive, allocations on this thread charge `ledger` (may be null: none) under `category`;
// scopes nest and restore the previous ledger and category.
class MemoryScope {
 public:
  MemoryScope(std::shared_ptr<MemoryLedger> ledger, MemCategory category);
  explicit MemoryScope(MemCategory category);  // same ledger, another category
  ~MemoryScope();
  MemoryScope(const MemoryScope&) = delete;
  MemoryScope& operator=(const MemoryScope&) = delete;

 private:
  std::shared_ptr<MemoryLedger> saved_ledger_;
  MemCategory saved_category_;
};

// Keeps the memory tensors free in the process's heap for the next allocation instead of giving
// it back to the system (glibc malloc: no mmap for blocks up to 32 MiB, no trimming). A loop that
// allocates and frees the same large buffers -- forward-only inference, which keeps no Cache --
// otherwise page-faults them afresh every time, and on a VM each fault (and the TLB shootdown of
// unmapping, which stalls the other threads) is an exit to the host. Process wide; call it
// before starting threads.
void retain_freed_memory();

// The ledger and category that an allocation on this thread charges now.
const std::shared_ptr<MemoryLedger>& current_ledger();
MemCategory current_category();

}  // namespace tessel
