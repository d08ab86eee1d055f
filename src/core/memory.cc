#include "tessel/core/memory.h"

#include <malloc.h>

namespace tessel {
namespace {

thread_local std::shared_ptr<MemoryLedger> t_ledger;
thread_local MemCategory t_category = MemCategory::kOther;

std::string mib(int64_t bytes) { return str(static_cast<double>(bytes) / (1 << 20), " MiB"); }

void raise_max(std::atomic<int64_t>& peak, int64_t value) {
  int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// What frees memory of the category that holds the most: the ZeRO stage that shards it, or
// another remedy.
const char* remedy(MemCategory largest) {
  switch (largest) {
    case MemCategory::kOptimizer:
      return "zero.stage = 1 shards the optimizer state over the data-parallel ranks (2 also "
             "the gradients, 3 also the parameters)";
    case MemCategory::kGradients:
      return "zero.stage = 2 shards the gradients and optimizer state over the data-parallel "
             "ranks (3 also the parameters)";
    case MemCategory::kParameters:
    case MemCategory::kComm:
      return "zero.stage = 3 shards the parameters, gradients and optimizer state over the "
             "data-parallel ranks (or split the model with pp.stages)";
    case MemCategory::kActivations:
    case MemCategory::kOther:
    case MemCategory::kOffloaded:
    case MemCategory::kOptimizerOffloaded:
      break;
  }
  return "a smaller train.batch, more pp.microbatches or more ranks reduce the activations";
}

}  // namespace

const char* mem_category_name(MemCategory c) {
  constexpr const char* kNames[] = {
      "parameters",   "gradients", "optimizer_state",       "activations",
      "comm_buffers", "other",     "activations_offloaded", "optimizer_offloaded"};
  return kNames[static_cast<size_t>(c)];
}

MemoryLedger::MemoryLedger(int64_t limit_bytes, std::string owner)
    : limit_(limit_bytes), owner_(std::move(owner)) {}

void MemoryLedger::charge(MemCategory c, int64_t bytes) {
  const int k = static_cast<int>(c);
  if (host_category(c)) {  // host memory beside a device rank's: not in its total
    raise_max(peak_[k], current_[k].fetch_add(bytes, std::memory_order_relaxed) + bytes);
    return;
  }
  const int64_t total = total_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  if (limit_ > 0 && total > limit_) {
    total_.fetch_sub(bytes, std::memory_order_relaxed);
    std::string held;
    MemCategory largest = c;
    int64_t most = 0;
    for (int k = 0; k < kMemCategories; ++k) {
      const int64_t b =
          current_[k].load(std::memory_order_relaxed) + (k == static_cast<int>(c) ? bytes : 0);
      if (b > 0)
        held += str(held.empty() ? "" : ", ", mem_category_name(MemCategory(k)), " ", mib(b));
      if (b > most) most = b, largest = MemCategory(k);
    }
    throw MemoryLimitError(str("memory: ", owner_, " would hold ", mib(total),
                               " > runtime.memory_limit_mb = ", limit_ >> 20, " when allocating ",
                               mib(bytes), " of ", mem_category_name(c), " (with it: ", held,
                               "; the most is ", mem_category_name(largest), "); ",
                               advice_.empty() ? remedy(largest) : advice_.c_str(),
                               ", or raise runtime.memory_limit_mb"));
  }
  raise_max(peak_[k], current_[k].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  raise_max(peak_total_, total);
}

void MemoryLedger::release(MemCategory c, int64_t bytes) noexcept {
  current_[static_cast<int>(c)].fetch_sub(bytes, std::memory_order_relaxed);
  if (!host_category(c)) total_.fetch_sub(bytes, std::memory_order_relaxed);
}

int64_t MemoryLedger::current(MemCategory c) const {
  return current_[static_cast<int>(c)].load(std::memory_order_relaxed);
}
int64_t MemoryLedger::peak(MemCategory c) const {
  return peak_[static_cast<int>(c)].load(std::memory_order_relaxed);
}
int64_t MemoryLedger::total() const { return total_.load(std::memory_order_relaxed); }
int64_t MemoryLedger::peak_total() const { return peak_total_.load(std::memory_order_relaxed); }

void MemoryLedger::reset_peaks() {
  for (int k = 0; k < kMemCategories; ++k) peak_[k].store(current_[k].load());
  peak_total_.store(total_.load());
}

MemoryScope::MemoryScope(std::shared_ptr<MemoryLedger> ledger, MemCategory category)
    : saved_ledger_(std::move(t_ledger)), saved_category_(t_category) {
  t_ledger = std::move(ledger);
  t_category = category;
}

MemoryScope::MemoryScope(MemCategory category)
    : saved_ledger_(t_ledger), saved_category_(t_category) {
  t_category = category;
}

MemoryScope::~MemoryScope() {
  t_ledger = std::move(saved_ledger_);
  t_category = saved_category_;
}

void retain_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks up to it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

const std::shared_ptr<MemoryLedger>& current_ledger() { return t_ledger; }
MemCategory current_category() { return t_category; }

}  // namespace tessel
