#include "mpi_control.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <set>

#include "mpi_base.h"
#include "tessel/comm/mpi.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel::comm {
namespace mpi_detail {

constexpr int kCtrlTag = 1;
constexpr size_t kTextMax = 1024;
constexpr double kAnswerS = 1.0;  // how long a progress query waits for answers

enum class CtrlType : int32_t {
  kAbort = 1,
  kQuery = 2,
  kReply = 3,
  kProgressQuery = 4,  // target: the world rank whose slot is asked for
  kProgressReply = 5,
};

struct CtrlMsg {
  CtrlType type;
  int32_t from;         // world rank of the sender
  uint64_t control_id;  // equal on every rank: world controls are created collectively, in order
  uint64_t comm_id;
  Stamp stamp;
  int32_t valid;
  // Progress replies: the target's slot as its host reads it (RankState's fields).
  int32_t target, seen, waiting_for;
  double silent_s, entered_s;
  uint64_t calls;
  char text[kTextMax];
};

namespace {

std::atomic<uint64_t> g_controls{0};
std::atomic<bool> g_peer_failure{false};
std::mutex g_registry_mu;
std::set<WorldControl*> g_registry;

}  // namespace

void abort_all_worlds(const std::string& why, double flush_s) noexcept {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (WorldControl* f : g_registry) f->abort(why);
  for (WorldControl* f : g_registry) f->flush(flush_s);
}

bool failure_came_from_peer(double settle_s) {
  // Serve the control channels a little longer: ranks that failed at the same moment (the
  // same deadline) hear of each other, and the lowest of them reports.
  for (const double until = now_seconds() + settle_s; now_seconds() < until;) {
    {
      std::lock_guard<std::mutex> lock(g_registry_mu);
      for (WorldControl* f : g_registry) f->poll();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return g_peer_failure.load(std::memory_order_acquire);
}

std::string stuck_rank_anywhere() {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  return g_registry.empty() ? std::string() : (*g_registry.begin())->stuck_rank();
}

WorldControl::WorldControl(MPI_Comm world, double timeout_s)
    : id_(++g_controls), timeout_s_(timeout_s), in_(std::make_unique<CtrlMsg>()) {
  {
    WatchdogArm arm(Deadline::after(timeout_s), "comm: opening the MPI control channel");
    Guard guard;
    check(MPI_Comm_dup(world, &ctrl_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(ctrl_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(ctrl_, &world_rank_);
    MPI_Comm_size(ctrl_, &world_size_);
    open_board();
    check(
        MPI_Irecv(in_.get(), sizeof(CtrlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtrlTag, ctrl_, &in_req_),
        "MPI_Irecv");
  }
  my_slot().beat();
  monitor_ = std::thread([this] { monitor(); });
  std::lock_guard<std::mutex> lock(g_registry_mu);
  g_registry.insert(this);
}

WorldControl::~WorldControl() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    g_registry.erase(this);
  }
  {
    std::lock_guard<std::mutex> lock(monitor_mu_);
    stop_ = true;
  }
  monitor_cv_.notify_all();
  monitor_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A peer's abort that is still in the control queue (a rank that never called, destroying its
  // communicator after its peers failed): without it this rank would wait in the board's
  // collective free below for peers that skip it.
  poll();
  Guard guard;
  if (in_req_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&in_req_);
    MPI_Wait(&in_req_, MPI_STATUS_IGNORE);
  }
  for (auto& [msg, req] : outgoing_)
    if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
  // After a failure, messages may still be in flight to this communicator; freeing it would let
  // MPI hand its context id, and those messages, to a new one. Leak the handles instead (the
  // board's free is collective over the host, which a failed rank would never join).
  if (aborted()) return;
  close_board();
  MPI_Comm_free(&ctrl_);
}

// The host's slots in one shared-memory window, allocated by the host's first rank; every
// rank learns where every world rank's slot is (its host, by lowest world rank, and index).
void WorldControl::open_board() {
  check(MPI_Comm_split_type(ctrl_, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &host_),
        "MPI_Comm_split_type");
  int local = 0, local_size = 1;
  MPI_Comm_rank(host_, &local);
  MPI_Comm_size(host_, &local_size);
  const MPI_Aint bytes = local == 0 ? local_size * static_cast<MPI_Aint>(sizeof(HeartbeatSlot)) : 0;
  void* mine = nullptr;
  check(MPI_Win_allocate_shared(bytes, 1, MPI_INFO_NULL, host_, &mine, &win_),
        "MPI_Win_allocate_shared");
  MPI_Aint size = 0;
  int unit = 0;
  void* base = nullptr;
  check(MPI_Win_shared_query(win_, 0, &size, &unit, &base), "MPI_Win_shared_query");
  if (reinterpret_cast<uintptr_t>(base) % alignof(HeartbeatSlot) != 0)
    throw CommError(str("comm: MPI shared-memory window at ", base, " is not ",
                        alignof(HeartbeatSlot), "-byte aligned; heartbeats need it"));
  slots_ = static_cast<HeartbeatSlot*>(base);
  if (local == 0)
    for (int i = 0; i < local_size; ++i) new (&slots_[i]) HeartbeatSlot();
  int where[2] = {world_rank_, local};
  check(MPI_Bcast(&where[0], 1, MPI_INT, 0, host_), "MPI_Bcast");  // the host's lowest rank
  std::vector<int> all(2 * static_cast<size_t>(world_size_));
  check(MPI_Allgather(where, 2, MPI_INT, all.data(), 2, MPI_INT, ctrl_), "MPI_Allgather");
  for (int r = 0; r < world_size_; ++r) {
    host_of_.push_back(all[2 * r]);
    slot_of_.push_back(all[2 * r + 1]);
  }
}

void WorldControl::close_board() noexcept {
  WatchdogArm arm(Deadline::after(30), "comm: freeing the heartbeat window");
  MPI_Win_free(&win_);
  MPI_Comm_free(&host_);
}

void WorldControl::monitor() {
  std::unique_lock<std::mutex> lock(monitor_mu_);
  while (!stop_) {
    my_slot().beat();
    lock.unlock();
    poll();
    lock.lock();
    monitor_cv_.wait_for(lock, std::chrono::duration<double>(kBeatS), [&] { return stop_; });
  }
}

std::string WorldControl::why() {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

void WorldControl::enroll(uint64_t id, ControlledGroup* t) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_[id] = t;
}

void WorldControl::leave(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.erase(id);
}

void WorldControl::send(int world_peer, const CtrlMsg& m) {
  auto msg = std::make_unique<CtrlMsg>(m);
  msg->control_id = id_;
  MPI_Request req;
  Guard guard;
  if (MPI_Isend(msg.get(), sizeof(CtrlMsg), MPI_BYTE, world_peer, kCtrlTag, ctrl_, &req) !=
      MPI_SUCCESS)
    return;  // best effort: the peer's own deadline still applies
  std::lock_guard<std::mutex> lock(mu_);
  // Reap finished control sends so the list stays short.
  std::erase_if(outgoing_, [](auto& o) {
    int flag = 0;
    MPI_Test(&o.second, &flag, MPI_STATUS_IGNORE);
    return flag != 0;
  });
  outgoing_.emplace_back(std::move(msg), req);
}

void WorldControl::flush(double seconds) noexcept {
  const double until = now_seconds() + seconds;
  for (;;) {
    {
      Guard guard;
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(outgoing_, [](auto& o) {
        int flag = 0;
        MPI_Test(&o.second, &flag, MPI_STATUS_IGNORE);
        return flag != 0;
      });
      if (outgoing_.empty() || now_seconds() > until) return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void WorldControl::abort(const std::string& why) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.load()) return;
    reason_ = why;
    aborted_.store(true, std::memory_order_release);
  }
  try {
    CtrlMsg m{};
    m.type = CtrlType::kAbort;
    m.from = world_rank_;
    std::strncpy(m.text, why.c_str(), kTextMax - 1);
    for (int r = 0; r < world_size_; ++r)
      if (r != world_rank_) send(r, m);
  } catch (...) {
  }
}

void WorldControl::query(int world_peer, uint64_t comm_id, const Stamp& mine) {
  CtrlMsg m{};
  m.type = CtrlType::kQuery;
  m.from = world_rank_;
  m.comm_id = comm_id;
  m.stamp = mine;
  send(world_peer, m);
}

void WorldControl::poll() noexcept {
  std::unique_lock<std::mutex> busy(poll_mu_, std::try_to_lock);
  if (!busy.owns_lock()) return;  // another thread of this process is polling
  for (;;) {
    int flag = 0;
    {
      Guard guard;
      if (in_req_ == MPI_REQUEST_NULL ||
          MPI_Test(&in_req_, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)
        return;
    }
    const CtrlMsg m = *in_;
    {
      Guard guard;
      if (MPI_Irecv(in_.get(), sizeof(CtrlMsg), MPI_BYTE, MPI_ANY_SOURCE, kCtrlTag, ctrl_,
                    &in_req_) != MPI_SUCCESS)
        in_req_ = MPI_REQUEST_NULL;
    }
    try {
      handle(m);
    } catch (...) {  // a reply that could not be sent: the asking rank's wait still ends
    }
  }
}

void WorldControl::handle(const CtrlMsg& m) {
  // A freed communicator's context id may be reused by MPI for a newer world; a late message
  // to the old one then arrives here and must be ignored.
  if (m.control_id != id_) return;
  if (m.type == CtrlType::kAbort) {
    std::string text(m.text, strnlen(m.text, kTextMax));
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.load()) {
      reason_ = text;
      aborted_.store(true, std::memory_order_release);
      g_peer_failure.store(true, std::memory_order_release);
    } else if (m.from < world_rank_) {
      // Both failed at once (e.g. at the same deadline): the lower rank reports.
      g_peer_failure.store(true, std::memory_order_release);
    }
    return;
  }
  if (m.type == CtrlType::kProgressQuery) {
    CtrlMsg reply{};
    reply.type = CtrlType::kProgressReply;
    reply.from = world_rank_;
    reply.target = m.target;
    if (m.target >= 0 && m.target < world_size_ && on_my_host(m.target)) {
      const RankState s = slots_[slot_of_[m.target]].read(m.target);
      reply.seen = 1;
      reply.silent_s = s.silent_s;
      reply.entered_s = s.entered_s;
      reply.stamp = s.stamp;
      reply.waiting_for = s.waiting_for;
      reply.calls = s.calls;
    }
    send(m.from, reply);
    return;
  }
  if (m.type == CtrlType::kProgressReply) {
    if (!m.seen) return;
    RankState s;
    s.rank = m.target;
    s.seen = true;
    s.silent_s = m.silent_s;
    s.entered_s = m.entered_s;
    s.stamp = m.stamp;
    s.waiting_for = m.waiting_for;
    s.calls = m.calls;
    std::lock_guard<std::mutex> lock(mu_);
    progress_[m.target] = {s, now_seconds()};
    return;
  }
  ControlledGroup* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(m.comm_id);
    if (it != groups_.end()) t = it->second;
  }
  if (!t) return;
  if (m.type == CtrlType::kQuery) {
    CtrlMsg reply{};
    reply.type = CtrlType::kReply;
    reply.from = world_rank_;
    reply.comm_id = m.comm_id;
    bool valid = false;
    reply.stamp = t->published(&valid);
    reply.valid = valid;
    send(m.from, reply);
  } else if (m.type == CtrlType::kReply) {
    t->record_reply(m.from, m.stamp, m.valid != 0);
  }
}

void WorldControl::ask_progress(const std::vector<int>& ranks, bool via_host, double seconds,
                                std::vector<RankState>& states) {
  const double asked = now_seconds();
  std::vector<int> asked_ranks;
  for (int r : ranks) {
    int to = r;
    if (via_host)  // another rank of r's host reads r's slot from their shared window
      for (int o = 0; o < world_size_; ++o)
        if (o != r && host_of_[o] == host_of_[r]) to = o;
    if (to == r && via_host) continue;  // r is alone on its host
    CtrlMsg m{};
    m.type = CtrlType::kProgressQuery;
    m.from = world_rank_;
    m.target = r;
    send(to, m);
    asked_ranks.push_back(r);
  }
  for (;;) {
    poll();
    std::lock_guard<std::mutex> lock(mu_);
    bool all = true;
    for (int r : asked_ranks) {
      auto it = progress_.find(r);
      if (it != progress_.end() && it->second.second >= asked)
        states[r] = it->second.first;
      else
        all = false;
    }
    if (all || now_seconds() - asked > seconds) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string WorldControl::stuck_rank() {
  std::vector<RankState> states(world_size_);
  std::vector<int> remote;
  for (int r = 0; r < world_size_; ++r) {
    states[r].rank = r;
    if (on_my_host(r))
      states[r] = slots_[slot_of_[r]].read(r);
    else
      remote.push_back(r);
  }
  if (!remote.empty()) {
    ask_progress(remote, false, kAnswerS, states);
    std::vector<int> silent;
    for (int r : remote)
      if (!states[r].seen) silent.push_back(r);
    if (!silent.empty()) ask_progress(silent, true, kAnswerS, states);
  }
  return name_stuck_rank(states, world_rank_);
}

// ---- watchdog ----

namespace {

class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: may be needed during exit
    return *w;
  }
  uint64_t arm(Deadline d, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_++;
    armed_[id] = {d.when(), std::move(what)};
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_one();
    return id;
  }
  void disarm(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    armed_.erase(id);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      double earliest = 1e300;
      const std::string* what = nullptr;
      for (auto& [id, e] : armed_)
        if (e.first < earliest) {
          earliest = e.first;
          what = &e.second;
        }
      double wait_s = earliest - Deadline::after(0).when();
      if (what && wait_s <= 0) {
        const std::string head = *what;
        lock.unlock();
        expire(head);
      }
      // Sleep at most a second: arm() only notifies, it does not track the earliest deadline.
      cv_.wait_for(lock, std::chrono::duration<double>(std::min(wait_s, 1.0)));
    }
  }
  // Ends the job like any failure (mpi_end_failed_job), naming the rank that stopped.
  [[noreturn]] static void expire(const std::string& what) {
    const std::string stuck = stuck_rank_anywhere();
    const std::string msg =
        str(what,
            ": the deadline (comm.timeout_s) passed inside an MPI call that cannot be "
            "interrupted; ",
            stuck.empty() ? "a rank is stuck, died or never made this call" : stuck,
            "; ending the job");
    if (!mpi_failed_elsewhere()) log_line(LogLevel::kError, msg);
    mpi_end_failed_job(msg, 1);
    std::_Exit(1);  // MPI_Abort returned (a one-rank job)
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::pair<double, std::string>> armed_;
  uint64_t next_ = 1;
  std::thread thread_;
};

}  // namespace

WatchdogArm::WatchdogArm(Deadline deadline, std::string what)
    : id_(deadline.is_never() ? 0 : Watchdog::get().arm(deadline, std::move(what))) {}

WatchdogArm::~WatchdogArm() {
  if (id_) Watchdog::get().disarm(id_);
}

}  // namespace mpi_detail

void mpi_end_failed_job(const std::string& reason, int exit_code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return;
  const bool consequence = mpi_detail::failure_came_from_peer(0);
  mpi_detail::abort_all_worlds(reason, 0.5);
  std::fflush(nullptr);
  if (consequence) std::_Exit(exit_code);
  // mpirun ends an aborted job with SIGTERM, then SIGKILL a second later: a graceful-stop
  // handler must not delay that.
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) std::signal(sig, SIG_DFL);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

bool mpi_failed_elsewhere() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized && mpi_detail::failure_came_from_peer(0.2);
}

}  // namespace tessel::comm
