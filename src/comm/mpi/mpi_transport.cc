// MPI transport: point-to-point over a duplicate of the group's MPI communicator.
// Stamps travel in the MPI tag: a collective's messages use a 30-bit hash of the stamp, so
// messages of disagreeing calls never match (no header bytes, no extra copies). What they do
// instead is wait, and a rank that has waited kProbeAfterS asks the peer, on a separate control
// communicator (mpi_control.h), which call it is in; a different call with the same sequence
// number, or a peer that has moved past this call (still so kMovedOnGraceS later: its last
// message can land after its reply), is reported naming both sides. The control
// communicator also carries aborts: abort() tells every rank of the world, and waits poll for
// such messages. When a deadline passes, the world control's heartbeat board names the rank that
// stopped making progress. Point-to-point messages use tag 2^30 + user tag.
// The top of src/comm/mpi: MPI start-up and mpi_world (mpi.h) build on every other file of the
// folder (mpi_base.h <- mpi_control.h <- mpi_native.cc <- this file).
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "../reduce.h"
#include "../wait.h"
#include "mpi_base.h"
#include "mpi_control.h"
#include "tessel/comm/mpi.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace mpi_detail {
namespace {

constexpr double kProbeAfterS = 0.05;  // first query to a silent peer
constexpr double kProbeEveryS = 0.5;
// A peer past the call a rank waits in has sent its messages of that call, but its reply on the
// control communicator can land first: that mismatch counts once still seen this much later
// (a message of 60 MB still in flight on a 100 Mbit/s link).
constexpr double kMovedOnGraceS = 5.0;

class MpiTransport final : public Transport, public ControlledGroup {
 public:
  MpiTransport(MPI_Comm comm, std::shared_ptr<WorldControl> control, uint64_t id,
               WaitPolicy policy);
  ~MpiTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::kMpi; }
  bool oversubscribed() const override { return policy_.oversubscribed; }
  size_t default_segment_bytes() const override { return 4 << 20; }

  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes,
                   const Stamp& stamp) override;
  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes, const Stamp& stamp) override;
  RequestPtr irecv_reduce(int peer, uint64_t tag, void* acc, size_t count, ElemType elem,
                          ReduceOp op, const Stamp& stamp) override;
  void abort(const std::string& reason) noexcept override { control_->abort(reason); }
  bool aborted() const override { return control_->aborted(); }
  void check_alive() override;
  void fail_if_aborted();
  std::unique_ptr<Transport> split(int color, int key, const std::vector<int>& members,
                                   uint64_t split_id) override;
  std::shared_ptr<void> shared_memory(size_t bytes, uint64_t id) override;
  NativeCollectives* native() override { return native_.get(); }

  // For requests and the world control.
  WorldControl& control() { return *control_; }
  const WaitPolicy& policy() const { return policy_; }
  int world_rank_of(int peer) const { return world_ranks_[peer]; }
  uint64_t id() const { return id_; }
  void publish(const Stamp& s);
  Stamp published(bool* valid) override;
  void record_reply(int world_peer, const Stamp& s, bool valid) override;
  // A mismatch message if the peer's last reply proves `mine` can never match, else ""; sets
  // *moved_on when that peer is past this call (a mismatch only after kMovedOnGraceS).
  std::string check_reply(int peer, const Stamp& mine, double asked_at, bool* moved_on);
  int mpi_tag(uint64_t tag, const Stamp& stamp) const;
  char* borrow(size_t bytes);  // reusable receive buffers for irecv_reduce
  void give_back(char* p, size_t bytes);

 private:
  MPI_Comm comm_;
  std::shared_ptr<WorldControl> control_;
  uint64_t id_;
  WaitPolicy policy_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  std::unique_ptr<NativeCollectives> native_;
  std::mutex mu_;  // published_, replies_, pool_
  Stamp published_;
  bool published_valid_ = false;
  struct Reply {
    Stamp stamp;
    bool valid = false;
    double at = 0;
  };
  std::map<int, Reply> replies_;  // by world rank
  std::multimap<size_t, std::unique_ptr<char[]>> pool_;
};

}  // namespace
std::unique_ptr<NativeCollectives> make_native(MPI_Comm comm, int rank, int size);
namespace {

bool is_collective(const Stamp& s) { return s.op != OpKind::kP2p && s.op != OpKind::kNone; }

class MpiRequest final : public Request {
 public:
  MpiRequest(MpiTransport* t, bool is_send, int peer, uint64_t tag, size_t bytes,
             const Stamp& stamp)
      : t_(t), is_send_(is_send), peer_(peer), tag_(tag), bytes_(bytes), stamp_(stamp) {}
  ~MpiRequest() override;
  void set_reduce(void* acc, char* tmp, size_t count, ElemType e, ReduceOp op) {
    acc_ = acc;
    tmp_ = tmp;
    count_ = count;
    elem_ = e;
    op_ = op;
  }
  MPI_Request* handle() { return &req_; }
  bool test() override;
  void wait(Deadline deadline) override;

 private:
  std::string where() const {
    return str("comm: ", describe(stamp_), " on rank ", t_->rank(), " of ", t_->size(), " (mpi, ",
               is_send_ ? "send to" : "recv from", " rank ", peer_, ", tag ", tag_, ", ", bytes_,
               " bytes)");
  }
  MpiTransport* t_;
  bool is_send_;
  int peer_;
  uint64_t tag_;
  size_t bytes_;
  Stamp stamp_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool done_ = false;
  void* acc_ = nullptr;
  char* tmp_ = nullptr;
  size_t count_ = 0;
  ElemType elem_ = ElemType::kU8;
  ReduceOp op_ = ReduceOp::kSum;
};

MpiRequest::~MpiRequest() {
  if (tmp_) t_->give_back(tmp_, bytes_);
  if (done_ || req_ == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  Guard guard;
  // A receive is cancelled so that MPI never writes into a buffer its owner may free; a send
  // cannot be cancelled reliably and is left to complete on its own.
  if (!is_send_) {
    MPI_Cancel(&req_);
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
  } else {
    MPI_Request_free(&req_);
  }
}

bool MpiRequest::test() {
  if (done_) return true;
  int flag = 0;
  MPI_Status status;
  {
    Guard guard;
    int rc = MPI_Test(&req_, &flag, &status);
    if (rc != MPI_SUCCESS) {
      done_ = true;
      check(rc, str(where(), ": MPI_Test").c_str());
    }
  }
  if (!flag) return false;
  done_ = true;
  if (!is_send_) {
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (static_cast<size_t>(got) != bytes_)
      throw CommError(str("comm: mismatched calls: ", where(), " received ", got,
                          " bytes; make every rank call the same collectives with the same "
                          "count and dtype"));
    if (acc_) reduce_into(acc_, tmp_, count_, elem_, op_);
  }
  return true;
}

void MpiRequest::wait(Deadline deadline) {
  WorldControl& fam = t_->control();
  WaitMark mark(&fam.my_slot(), t_->world_rank_of(peer_));
  Backoff backoff(effective_policy(t_->policy()));
  double start = now_seconds(), asked_at = 0, mismatch_seen = 0;
  for (uint32_t i = 0;; ++i) {
    if (test()) return;
    if ((i & 63) != 0 && !backoff.should_sleep()) {
      backoff.pause();
      continue;
    }
    fam.poll();
    if (fam.aborted()) throw CommError(str(where(), ": group aborted: ", fam.why()));
    double now = now_seconds();
    if (is_collective(stamp_) && now - start > kProbeAfterS) {
      bool moved_on = false;  // kMovedOnGraceS
      std::string mismatch = t_->check_reply(peer_, stamp_, asked_at, &moved_on);
      if (moved_on && mismatch_seen == 0) mismatch_seen = now;
      if (!mismatch.empty() && (!moved_on || now - mismatch_seen > kMovedOnGraceS)) {
        fam.abort(mismatch);
        throw CommError(mismatch);
      }
      if (now - asked_at > kProbeEveryS) {
        asked_at = now;
        fam.query(t_->world_rank_of(peer_), t_->id(), stamp_);
      }
    }
    if (deadline.expired()) {
      const std::string stuck = fam.stuck_rank();
      std::string msg =
          str(where(), ": no matching ", is_send_ ? "receive" : "send", " from rank ", peer_,
              " before the deadline; ",
              stuck.empty() ? "that rank is stuck, died or never made this call" : stuck,
              " (check that every rank calls the same collectives, or raise comm.timeout_s)");
      fam.abort(msg);
      throw CommError(msg);
    }
    backoff.pause();
  }
}

// ---- MpiTransport ----

MpiTransport::MpiTransport(MPI_Comm comm, std::shared_ptr<WorldControl> control, uint64_t id,
                           WaitPolicy policy)
    : comm_(comm), control_(std::move(control)), id_(id), policy_(policy) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Control messages address world ranks.
  MPI_Group mine, world;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(size_);
  for (int i = 0; i < size_; ++i) ranks[i] = i;
  world_ranks_.resize(size_);
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, world_ranks_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  native_ = make_native(comm_, rank_, size_);
  control_->enroll(id_, this);
}

MpiTransport::~MpiTransport() {
  control_->leave(id_);
  native_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !control_->aborted()) {  // see ~WorldControl: a failed group's comm is leaked
    Guard guard;
    MPI_Comm_free(&comm_);
  }
}

// Posting must not drive MPI progress: progress would take a peer's rendezvous request off the
// wire first, and the receive posted next would then copy the whole message on the spot, before
// this rank's own send is even posted, serialising the two directions of an exchange (measured:
// a 2-rank 1 MiB ring allreduce took 190 us instead of 110 us).
void MpiTransport::fail_if_aborted() {
  if (control_->aborted())
    throw CommError(str("comm: rank ", rank_, " (mpi): group aborted: ", control_->why()));
}

void MpiTransport::check_alive() {
  control_->poll();
  if (control_->aborted())
    throw CommError(str("comm: rank ", rank_, " (mpi): group aborted: ", control_->why()));
}

int MpiTransport::mpi_tag(uint64_t tag, const Stamp& s) const {
  const uint64_t half = static_cast<uint64_t>(tag_upper_bound()) / 2 + 1;  // 2^30 on OpenMPI
  if (tag != 0) return static_cast<int>(half + (tag - 1) % half);
  // FNV-1a over the stamp's fields: equal calls give equal tags on every rank.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  mix(static_cast<uint64_t>(s.op) | static_cast<uint64_t>(s.elem) << 8 |
      static_cast<uint64_t>(s.reduce) << 16 | static_cast<uint64_t>(s.algorithm) << 24 |
      static_cast<uint64_t>(static_cast<uint32_t>(s.root)) << 32);
  mix(s.seq);
  mix(s.count);
  mix(s.label);
  return static_cast<int>(h % half);
}

void MpiTransport::publish(const Stamp& s) {
  control_->my_slot().enter(s);
  if (!is_collective(s)) return;
  std::lock_guard<std::mutex> lock(mu_);
  published_ = s;
  published_valid_ = true;
}

Stamp MpiTransport::published(bool* valid) {
  std::lock_guard<std::mutex> lock(mu_);
  *valid = published_valid_;
  return published_;
}

void MpiTransport::record_reply(int world_peer, const Stamp& s, bool valid) {
  std::lock_guard<std::mutex> lock(mu_);
  replies_[world_peer] = Reply{s, valid, now_seconds()};
}

std::string MpiTransport::check_reply(int peer, const Stamp& mine, double asked_at,
                                      bool* moved_on) {
  Reply r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = replies_.find(world_ranks_[peer]);
    if (it == replies_.end()) return "";
    r = it->second;
  }
  if (!r.valid || asked_at == 0 || r.at < asked_at) return "";
  const Stamp& theirs = r.stamp;
  *moved_on = theirs.seq > mine.seq;
  if (*moved_on)
    return str("comm: mismatched calls between rank ", rank_, " and rank ", peer, " (mpi): rank ",
               rank_, " waits in ", describe(mine), " for a message from rank ", peer,
               ", but rank ", peer, " has moved on to ", describe(theirs),
               "; make every rank call the same collectives in the same order with the same "
               "count, dtype and root");
  if (theirs.seq == mine.seq && !(theirs == mine))
    return str("comm: mismatched calls between rank ", rank_, " and rank ", peer, " (mpi): rank ",
               rank_, " runs ", describe(mine), " but rank ", peer, " runs ", describe(theirs),
               "; make every rank call the same collectives in the same order with the same "
               "count, dtype and root");
  return "";
}

char* MpiTransport::borrow(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pool_.lower_bound(bytes);
  if (it != pool_.end() && it->first <= 2 * bytes + 4096) {
    char* p = it->second.release();
    pool_.erase(it);
    return p;
  }
  return new char[std::max<size_t>(bytes, 1)];
}

void MpiTransport::give_back(char* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool_.size() >= 16) pool_.erase(pool_.begin());  // keep a handful, drop the smallest
  pool_.emplace(std::max<size_t>(bytes, 1), std::unique_ptr<char[]>(p));
}

void check_message(size_t bytes) {
  if (bytes > static_cast<size_t>(INT_MAX))
    throw InvalidArgument(str("comm: a single MPI message of ", bytes,
                              " bytes exceeds INT_MAX; "
                              "use the ring algorithm (segmented) or split the buffer"));
}

RequestPtr MpiTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes,
                               const Stamp& stamp) {
  check_message(bytes);
  fail_if_aborted();
  publish(stamp);
  auto r = std::make_unique<MpiRequest>(this, true, peer, tag, bytes, stamp);
  Guard guard;
  check(MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, peer, mpi_tag(tag, stamp), comm_,
                  r->handle()),
        "MPI_Isend");
  return r;
}

RequestPtr MpiTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes,
                               const Stamp& stamp) {
  check_message(bytes);
  fail_if_aborted();
  publish(stamp);
  auto r = std::make_unique<MpiRequest>(this, false, peer, tag, bytes, stamp);
  Guard guard;
  check(MPI_Irecv(data, static_cast<int>(bytes), MPI_BYTE, peer, mpi_tag(tag, stamp), comm_,
                  r->handle()),
        "MPI_Irecv");
  return r;
}

RequestPtr MpiTransport::irecv_reduce(int peer, uint64_t tag, void* acc, size_t count,
                                      ElemType elem, ReduceOp op, const Stamp& stamp) {
  fail_if_aborted();
  publish(stamp);
  size_t bytes = count * elem_size(elem);
  check_message(bytes);
  auto r = std::make_unique<MpiRequest>(this, false, peer, tag, bytes, stamp);
  char* tmp = borrow(bytes);
  r->set_reduce(acc, tmp, count, elem, op);
  Guard guard;
  check(MPI_Irecv(tmp, static_cast<int>(bytes), MPI_BYTE, peer, mpi_tag(tag, stamp), comm_,
                  r->handle()),
        "MPI_Irecv");
  return r;
}

std::unique_ptr<Transport> MpiTransport::split(int color, int key, const std::vector<int>&,
                                               uint64_t split_id) {
  MPI_Comm sub = MPI_COMM_NULL;
  {
    // Every member arrives here right after the allgather of (color, key), but may stop (or
    // be stopped) right after it.
    WatchdogArm arm(Deadline::after(control_->timeout_s()), "comm: MPI_Comm_split");
    Guard guard;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
  }
  if (sub == MPI_COMM_NULL) return nullptr;
  uint64_t id = (id_ ^ (split_id + 0x9e3779b97f4a7c15ull + (id_ << 6) + (id_ >> 2))) * 31 +
                static_cast<uint64_t>(color) + 1;
  return std::make_unique<MpiTransport>(sub, control_, id, policy_);
}

// An MPI-3 shared-memory window on the ranks' host, when all of them are on one host. Rank 0
// allocates it all (the others map it); freed with MPI_Win_free when the last holder on each
// rank drops it (skipped once the world is aborted, as the free is collective, or after
// MPI_Finalize, which has released it).
std::shared_ptr<void> MpiTransport::shared_memory(size_t bytes, uint64_t) {
  WatchdogArm arm(Deadline::after(control_->timeout_s()), "comm: MPI shared-memory window");
  Guard guard;
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "MPI_Comm_split_type");
  int node_size = 0;
  check(MPI_Comm_size(node, &node_size), "MPI_Comm_size");
  if (node_size != size_) {  // several hosts: every rank sees a smaller node group
    MPI_Comm_free(&node);
    return nullptr;
  }
  // 64 bytes of slack: the window need not start on a cache line (OpenMPI's start 8 bytes past
  // one). The segment is mapped page-aligned in every process, so the padding is the same on
  // every rank (checked).
  const MPI_Aint rounded = static_cast<MPI_Aint>((std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  void* mine = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  check(MPI_Win_allocate_shared(rank_ == 0 ? rounded + 64 : 0, 1, MPI_INFO_NULL, node, &mine, &win),
        "MPI_Win_allocate_shared");
  MPI_Aint size = 0;
  int unit = 0;
  void* window = nullptr;
  check(MPI_Win_shared_query(win, 0, &size, &unit, &window), "MPI_Win_shared_query");
  const int pad = static_cast<int>((64 - reinterpret_cast<uintptr_t>(window) % 64) % 64);
  int pads[2] = {pad, -pad};
  check(MPI_Allreduce(MPI_IN_PLACE, pads, 2, MPI_INT, MPI_MAX, node), "MPI_Allreduce");
  if (size < rounded + 64 || pads[0] != -pads[1])
    throw CommError(str("comm: MPI shared-memory window of ", size, " bytes (", rounded + 64,
                        " asked) whose 64-byte alignment differs across ranks"));
  void* base = static_cast<char*>(window) + pad;
  if (rank_ == 0) std::memset(base, 0, static_cast<size_t>(rounded));
  check(MPI_Barrier(node), "MPI_Barrier");
  std::shared_ptr<WorldControl> control = control_;
  return std::shared_ptr<void>(base, [win, node, control](void*) mutable {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || control->aborted()) return;
    WatchdogArm free_arm(Deadline::after(30), "comm: MPI_Win_free");
    Guard g;
    MPI_Win_free(&win);
    MPI_Comm_free(&node);
  });
}

std::once_flag g_init_once;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A peer that died or hangs would make MPI_Finalize wait forever.
  WatchdogArm arm(Deadline::after(30), "comm: MPI_Finalize");  // after success only
  MPI_Finalize();
}

// Initialises MPI once (MPI_THREAD_MULTIPLE requested; a rank that does not join within
// timeout_s ends the job) and registers finalisation at exit.
void ensure_initialized(double timeout_s) {
  std::call_once(g_init_once, [timeout_s] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      WatchdogArm arm(Deadline::after(timeout_s), "comm: MPI_Init (every rank joins the job)");
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      std::atexit(finalize_at_exit);
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
      throw CommError(str("comm: MPI grants thread level ", provided,
                          ", but tessel needs at "
                          "least MPI_THREAD_SERIALIZED; initialise MPI with "
                          "MPI_Init_thread(MPI_THREAD_MULTIPLE) or let tessel do it"));
  });
}

// The world transport over a duplicate of MPI_COMM_WORLD.
// timeout_s bounds the blocking MPI calls of the world and its groups (splits, windows).
std::unique_ptr<Transport> make_world_transport(const WaitPolicy& policy, double timeout_s) {
  MPI_Comm comm;
  {
    WatchdogArm arm(Deadline::after(timeout_s), "comm: MPI_Comm_dup of the world");
    Guard guard;
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  }
  auto control = std::make_shared<WorldControl>(MPI_COMM_WORLD, timeout_s);
  return std::make_unique<MpiTransport>(comm, std::move(control), 0, policy);
}

}  // namespace
}  // namespace mpi_detail

Communicator mpi_world(const CommOptions& options) {
  mpi_detail::ensure_initialized(options.timeout_s);
  WaitPolicy policy;
  policy.spin_us = options.spin_us;
  policy.yield_us = options.yield_us;
  // With more ranks on this host than cores, a spinning rank steals its peer's core.
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  policy.oversubscribed = local && static_cast<unsigned>(std::atoi(local)) > cores;
  return Communicator(mpi_detail::make_world_transport(policy, options.timeout_s), options);
}

}  // namespace tessel::comm
