#include "heartbeat.h"

#include <time.h>

#include <cstring>
#include <type_traits>

#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

static_assert(std::is_standard_layout_v<HeartbeatSlot>, "HeartbeatSlot lives in shared memory");
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

uint64_t host_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

double age_s(uint64_t then_ns, uint64_t now_ns) {
  return then_ns == 0 ? -1 : static_cast<double>(now_ns - std::min(then_ns, now_ns)) * 1e-9;
}

std::string seconds(double s) { return str(static_cast<int64_t>(s * 10 + 0.5) / 10.0, " s"); }

std::string last_call(const RankState& r) {
  if (r.entered_s < 0) return "it has entered no communication call yet";
  return str("it last entered ", describe(r.stamp), " ", seconds(r.entered_s), " ago");
}

}  // namespace

void HeartbeatSlot::beat() noexcept { beat_ns_.store(host_ns(), std::memory_order_relaxed); }

void HeartbeatSlot::enter(const Stamp& s) noexcept {
  // Several threads of one rank may enter calls (caller and progress thread): whoever takes the
  // odd version writes; a concurrent one skips its update rather than wait.
  uint32_t v = version_.load(std::memory_order_relaxed);
  if ((v & 1) || !version_.compare_exchange_strong(v, v + 1, std::memory_order_acquire)) return;
  // The odd version must be visible before any word below (a seqlock writer's fence), or a
  // reader could take a half-written stamp under the old even version.
  std::atomic_thread_fence(std::memory_order_release);
  uint64_t words[kWords];
  for (int i = 0; i < kWords; ++i) words[i] = stamp_[i].load(std::memory_order_relaxed);
  Stamp last;
  std::memcpy(&last, words, sizeof(Stamp));
  if (!(last == s) || calls_.load(std::memory_order_relaxed) == 0) {
    Stamp clean{};  // zero padding, so that equal stamps have equal words
    clean = s;
    std::memset(words, 0, sizeof words);
    std::memcpy(words, &clean, sizeof(Stamp));
    for (int i = 0; i < kWords; ++i) stamp_[i].store(words[i], std::memory_order_relaxed);
    entered_ns_.store(host_ns(), std::memory_order_relaxed);
    calls_.fetch_add(1, std::memory_order_relaxed);
  }
  version_.store(v + 2, std::memory_order_release);
}

RankState HeartbeatSlot::read(int rank) const noexcept {
  static_assert(sizeof(Stamp) <= kWords * sizeof(uint64_t));
  RankState out;
  out.rank = rank;
  out.seen = true;
  const uint64_t now = host_ns();
  out.silent_s = age_s(beat_ns_.load(std::memory_order_relaxed), now);
  out.waiting_for = waiting_.load(std::memory_order_relaxed) - 1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint32_t v = version_.load(std::memory_order_acquire);
    if (v & 1) continue;
    uint64_t words[kWords];
    for (int i = 0; i < kWords; ++i) words[i] = stamp_[i].load(std::memory_order_relaxed);
    const uint64_t entered = entered_ns_.load(std::memory_order_relaxed);
    const uint64_t calls = calls_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (version_.load(std::memory_order_relaxed) != v) continue;
    std::memcpy(&out.stamp, words, sizeof(Stamp));
    out.entered_s = calls == 0 ? -1 : age_s(entered, now);
    out.calls = calls;
    break;
  }
  return out;
}

std::string name_stuck_rank(const std::vector<RankState>& ranks, int me) {
  // 0. This very process was stopped (and continued): it, not its peers, missed the deadline.
  if (me >= 0 && me < static_cast<int>(ranks.size()) && ranks[me].silent_s > kSilentS)
    return str("this rank (", me, ") was itself stopped for ", seconds(ranks[me].silent_s),
               " (SIGSTOP or a debugger) and missed the deadline");
  // 1. A process that stopped beating: stopped (SIGSTOP, a debugger, swapping) or dead.
  const RankState* pick = nullptr;
  for (const RankState& r : ranks)
    if (r.rank != me && r.seen && r.silent_s > kSilentS && (!pick || r.silent_s > pick->silent_s))
      pick = &r;
  if (pick)
    return str("rank ", pick->rank,
               " stopped making progress: its process has shown no sign of "
               "life for ",
               seconds(pick->silent_s),
               " (stopped, e.g. by SIGSTOP or a debugger, "
               "or dead); ",
               last_call(*pick));
  // 2. A rank whose record nobody could read.
  for (const RankState& r : ranks)
    if (r.rank != me && !r.seen)
      return str("rank ", r.rank,
                 " stopped making progress: it does not answer on the control "
                 "channel, nor does any rank of its host (host down, unreachable or stopped)");
  // 3. A live rank outside any communication call: busy or hung in its own work. The one that
  //    entered its last call first has been out the longest.
  for (const RankState& r : ranks)
    if (r.rank != me && r.seen && r.waiting_for < 0 &&
        (!pick || (r.entered_s < 0) > (pick->entered_s < 0) ||
         ((r.entered_s < 0) == (pick->entered_s < 0) && r.entered_s > pick->entered_s)))
      pick = &r;
  if (pick)
    return str("rank ", pick->rank,
               " stopped making progress: it is alive but outside any "
               "communication call (busy or hung in its own work); ",
               last_call(*pick));
  // 4. Everyone waits: the rank that entered its call first is where the chain ends.
  for (const RankState& r : ranks)
    if (r.rank != me && r.seen && r.entered_s >= 0 && (!pick || r.entered_s > pick->entered_s))
      pick = &r;
  if (pick)
    return str("every rank is waiting; rank ", pick->rank,
               " has waited longest: ", last_call(*pick), ", waiting for rank ", pick->waiting_for,
               " (ranks that disagree on the calls they make?)");
  return "";
}

}  // namespace tessel::comm
