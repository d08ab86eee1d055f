// Heartbeat: what every rank publishes about its own progress so that, when a deadline passes,
// the waiting rank can name the rank that stopped instead of the neighbour it waits for (which
// may itself be waiting). Each rank owns one HeartbeatSlot and writes it; any rank reads any
// slot. The slots of a process's ranks live in its memory (threads transport) or, for MPI ranks,
// in a shared-memory window of their host; a rank on another host is asked over the MPI
// control channel. A slot holds: when its process last showed life (an MPI process beats every
// kBeatS from its monitor thread; a stopped process does not), the call the rank last entered
// and when, and the peer it is waiting for right now (or none). Internal to the comm area.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "tessel/comm/transport.h"

namespace tessel::comm {

constexpr double kBeatS = 0.1;    // MPI processes beat this often
constexpr double kSilentS = 1.0;  // a process silent this long is stopped or dead

// One rank as another rank sees it.
struct RankState {
  int rank = -1;          // world rank
  bool seen = false;      // false: nothing could be read (a remote rank that did not answer)
  double silent_s = -1;   // since its process last beat; < 0: not tracked (threads)
  double entered_s = -1;  // since it entered `stamp`; < 0: it has entered no call yet
  Stamp stamp;            // the call it entered last
  int waiting_for = -1;   // the world rank it is waiting for in that call, or -1
  uint64_t calls = 0;     // calls entered so far
};

// Lives in shared memory: standard layout, every field a lock-free atomic; zeroed = empty.
class HeartbeatSlot {
 public:
  void beat() noexcept;
  // Records entering the call `s` (a new call when it differs from the last one entered).
  void enter(const Stamp& s) noexcept;
  void wait_begin(int peer) noexcept { waiting_.store(peer + 1, std::memory_order_relaxed); }
  void wait_end() noexcept { waiting_.store(0, std::memory_order_relaxed); }
  RankState read(int rank) const noexcept;

 private:
  static constexpr int kWords = 4;
  std::atomic<uint64_t> beat_ns_{0}, entered_ns_{0}, calls_{0};
  std::atomic<uint32_t> version_{0};  // odd while stamp_ is being written (a seqlock)
  std::atomic<int32_t> waiting_{0};   // peer + 1, 0 when not waiting
  std::atomic<uint64_t> stamp_[kWords] = {};
};

// Marks the slot as waiting for `peer` while alive (a Request's wait).
class WaitMark {
 public:
  WaitMark(HeartbeatSlot* slot, int peer) : slot_(slot) {
    if (slot_) slot_->wait_begin(peer);
  }
  ~WaitMark() {
    if (slot_) slot_->wait_end();
  }
  WaitMark(const WaitMark&) = delete;
  WaitMark& operator=(const WaitMark&) = delete;

 private:
  HeartbeatSlot* slot_;
};

// The rank that stopped making progress among `ranks` (indexed by world rank, seen from rank
// `me`), as a sentence for a deadline message: `me` itself if its own process was stopped,
// else a silent process, then a rank that did not answer, then the live rank that has been
// outside any communication call the longest, then the one that entered its call first.
// "" when nothing stands out.
std::string name_stuck_rank(const std::vector<RankState>& ranks, int me);

}  // namespace tessel::comm
