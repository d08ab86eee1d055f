// WorldControl: what an MPI world and every group split from it share: one abort flag, one
// control communicator and one heartbeat board. Internal to the comm area.
//  - Control channel: small messages on a duplicate of the world, sent to world ranks. An abort
//    reaches every rank; a query asks a peer which call it is in (mismatch detection); a
//    progress query asks a rank for a heartbeat slot of its host (naming a stuck rank).
//  - Heartbeat board (heartbeat.h): the slots of this host's ranks in an MPI shared-memory
//    window, readable even when their owner is stopped. A rank on another host is asked over
//    the control channel, and when it does not answer, a rank of its host is asked for its slot.
//  - Monitor thread: beats this rank's slot every kBeatS and serves the control channel, so
//    that a rank busy computing still answers queries and learns of aborts within kBeatS.
// Also the job's end on failure, which goes through every live world control: the watchdog that
// bounds uninterruptible MPI calls (its own blocking frees among them) and mpi_end_failed_job.
// Builds on mpi_base.h only.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../heartbeat.h"
#include "tessel/comm/transport.h"

namespace tessel::comm::mpi_detail {

// What the world control needs of each group: the call it published last, and where replies to its
// queries go.
class ControlledGroup {
 public:
  virtual Stamp published(bool* valid) = 0;
  virtual void record_reply(int world_peer, const Stamp& s, bool valid) = 0;

 protected:
  ~ControlledGroup() = default;
};

struct CtrlMsg;

class WorldControl {
 public:
  // Collective over world; timeout_s bounds the blocking MPI calls of the world's groups.
  WorldControl(MPI_Comm world, double timeout_s);
  ~WorldControl();
  WorldControl(const WorldControl&) = delete;
  WorldControl& operator=(const WorldControl&) = delete;

  // Poisons every group of the world here and tells every other rank. First reason wins.
  void abort(const std::string& why) noexcept;
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string why();
  void poll() noexcept;  // serves queries, records replies and aborts
  void query(int world_peer, uint64_t comm_id, const Stamp& mine);
  void enroll(uint64_t id, ControlledGroup* t);
  void leave(uint64_t id);
  double timeout_s() const { return timeout_s_; }
  HeartbeatSlot& my_slot() { return slots_[slot_of_[world_rank_]]; }
  // The sentence naming the rank that stopped making progress (heartbeat.h), or "". Asks ranks
  // of other hosts over the control channel: takes up to 2 s when some do not answer.
  std::string stuck_rank();
  // Waits up to `seconds` for the control messages this process sent to leave it.
  void flush(double seconds) noexcept;

 private:
  void open_board();
  void close_board() noexcept;
  void monitor();
  void send(int world_peer, const CtrlMsg& m);
  void handle(const CtrlMsg& m);
  bool on_my_host(int world_rank) const { return host_of_[world_rank] == host_of_[world_rank_]; }
  // Asks every rank in `ranks` (or, with `via_host`, another rank of its host) for its slot and
  // waits up to `seconds` for the answers, which land in states.
  void ask_progress(const std::vector<int>& ranks, bool via_host, double seconds,
                    std::vector<RankState>& states);

  MPI_Comm ctrl_ = MPI_COMM_NULL;
  uint64_t id_;
  double timeout_s_;
  int world_rank_ = 0, world_size_ = 1;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;  // reason_, groups_, outgoing_, progress_
  std::mutex poll_mu_;
  std::string reason_;
  std::map<uint64_t, ControlledGroup*> groups_;
  std::unique_ptr<CtrlMsg> in_;
  MPI_Request in_req_ = MPI_REQUEST_NULL;
  std::vector<std::pair<std::unique_ptr<CtrlMsg>, MPI_Request>> outgoing_;

  // Heartbeat board.
  MPI_Comm host_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  HeartbeatSlot* slots_ = nullptr;  // this host's slots
  std::vector<int> host_of_;        // by world rank: the lowest world rank on its host
  std::vector<int> slot_of_;        // by world rank: its slot on its host
  std::map<int, std::pair<RankState, double>> progress_;  // answers by world rank, and when

  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  bool stop_ = false;
  std::thread monitor_;
};

// Every live world control of this process: aborts them all with `why` and waits up to flush_s for
// the abort messages to leave (mpi_end_failed_job).
void abort_all_worlds(const std::string& why, double flush_s) noexcept;
// The sentence naming the rank that stopped making progress, from the first live world control
// (WorldControl::stuck_rank), or "" when there is none.
std::string stuck_rank_anywhere();
// Bounds a blocking MPI call that cannot be interrupted: if it is still armed at its deadline,
// the job ends (mpi_end_failed_job, exit code 1) after logging `what` and the rank that stopped
// making progress (stuck_rank_anywhere).
class WatchdogArm {
 public:
  WatchdogArm(Deadline deadline, std::string what);
  ~WatchdogArm();
  WatchdogArm(const WatchdogArm&) = delete;
  WatchdogArm& operator=(const WatchdogArm&) = delete;

 private:
  uint64_t id_;
};

// Whether this process learnt of a failure from another rank's abort message before it
// aborted anything itself (or from a lower rank that failed at the same moment): its own error
// is then a consequence of that failure. Serves the control channels for settle_s first.
bool failure_came_from_peer(double settle_s);

}  // namespace tessel::comm::mpi_detail
