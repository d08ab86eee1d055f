// Threads transport: per ordered pair of ranks a mailbox holds posted sends and posted receives
// that have not met yet. Whoever posts second finds its partner there and takes it out under the
// mailbox lock. The receiver copies (or reduces) straight from the sender's buffer into its own,
// then completes both requests: a message is copied exactly once and nobody copies into a
// staging buffer. Receivers do the copy so that the work of a collective is spread over its
// ranks (each copies what it receives); when a sender finds the receive already posted it only
// pairs the two and signals the receiver, which copies in its wait or test. A sender that
// waits for a paired send does the copy itself if the receiver has not started it (it would
// idle otherwise), so progress never depends on the receiver calling wait.
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "../heartbeat.h"
#include "../reduce.h"
#include "../spin_lock.h"
#include "../wait.h"
#include "tessel/comm/threads.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

// Copies of calls larger than half the last-level cache (32 MiB on the reference machine) use
// streaming stores: their data cannot stay cached anyway.
constexpr size_t kStreamMinCall = 16 << 20;
constexpr size_t kStreamMinSegment = 64 << 10;

// State shared by every group split from one root group: aborting one aborts all. The
// heartbeat slots are per rank of the root group (the "world").
struct Family {
  explicit Family(int world_size) : slots(new HeartbeatSlot[world_size]), world_size(world_size) {}
  std::unique_ptr<HeartbeatSlot[]> slots;
  int world_size;
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string reason;
  void abort(const std::string& why) noexcept {
    std::lock_guard<std::mutex> lock(mu);
    if (aborted.load()) return;
    reason = why;
    aborted.store(true, std::memory_order_release);
  }
  std::string why() {
    std::lock_guard<std::mutex> lock(mu);
    return reason;
  }
};

class ThreadOp;

struct Mailbox {
  SpinLock mu;
  std::deque<ThreadOp*> sends, recvs;
};

// The collective each rank posted last. A rank stuck waiting for a peer compares it with its
// own: same sequence number but another call, or a peer that moved past this call, is a
// mismatch that no message would ever reveal (e.g. both sides waiting to receive).
struct Published {
  SpinLock mu;
  Stamp stamp;
  bool valid = false;
};

bool is_collective(const Stamp& s) { return s.op != OpKind::kP2p && s.op != OpKind::kNone; }

std::string mismatch_text(int me, const Stamp& mine, int peer, const Stamp& theirs) {
  if (theirs.seq > mine.seq)
    return str("comm: mismatched calls between rank ", me, " and rank ", peer, " (threads): rank ",
               me, " waits in ", describe(mine), " for a message from rank ", peer, ", but rank ",
               peer, " has moved on to ", describe(theirs),
               " without sending it; make every rank call the same collectives in the same "
               "order with the same count, dtype and root");
  return str("comm: mismatched calls between rank ", me, " and rank ", peer, " (threads): rank ",
             me, " runs ", describe(mine), " but rank ", peer, " runs ", describe(theirs),
             "; make every rank call the same collectives in the same order with the same "
             "count, dtype and root");
}

struct Group {
  Group(std::vector<int> world_ranks, std::shared_ptr<Family> fam, const WaitPolicy& pol)
      : n(static_cast<int>(world_ranks.size())),
        world(std::move(world_ranks)),
        family(std::move(fam)),
        policy(pol),
        boxes(new Mailbox[n * n]),
        current(new Published[n]),
        cpus(new std::atomic<int>[n]) {
    for (int i = 0; i < n; ++i) cpus[i].store(-1, std::memory_order_relaxed);
  }
  Mailbox& box(int src, int dst) { return boxes[src * n + dst]; }
  HeartbeatSlot& slot(int rank) { return family->slots[world[rank]]; }

  void publish(int rank, const Stamp& s) {
    slot(rank).enter(s);
    if (!is_collective(s)) return;
    std::lock_guard<SpinLock> lock(current[rank].mu);
    current[rank].stamp = s;
    current[rank].valid = true;
  }
  // A mismatch message if `peer`'s current collective proves that `mine` can never match.
  std::string check_peer(int me, const Stamp& mine, int peer) {
    if (!is_collective(mine)) return "";
    Stamp theirs;
    {
      std::lock_guard<SpinLock> lock(current[peer].mu);
      if (!current[peer].valid) return "";
      theirs = current[peer].stamp;
    }
    if (theirs.seq > mine.seq || (theirs.seq == mine.seq && !(theirs == mine)))
      return mismatch_text(me, mine, peer, theirs);
    return "";
  }

  // The sentence naming the rank that stopped, seen from group rank `me` (see heartbeat.h).
  std::string stuck_rank(int me) {
    std::vector<RankState> states;
    for (int r = 0; r < family->world_size; ++r) states.push_back(family->slots[r].read(r));
    return name_stuck_rank(states, world[me]);
  }

  int n;
  std::vector<int> world;  // world rank of each rank of this group
  std::shared_ptr<Family> family;
  WaitPolicy policy;
  std::unique_ptr<Mailbox[]> boxes;
  std::unique_ptr<Published[]> current;
  // The core each rank last posted from. Spinning for a peer that shares this core only delays
  // it (it cannot run until this thread yields), so such waits yield at once. This matters
  // whenever other load squeezes the ranks onto fewer cores than ranks.
  std::unique_ptr<std::atomic<int>[]> cpus;

  struct SplitEntry {
    std::shared_ptr<Group> group;
    size_t remaining = 0;
  };
  std::mutex split_mu;
  std::map<std::pair<uint64_t, int>, SplitEntry> splits;

  struct SharedEntry {
    std::shared_ptr<void> memory;
    size_t remaining = 0;
  };
  std::mutex shared_mu;
  std::map<uint64_t, SharedEntry> shared;
};

class ThreadOp final : public Request {
 public:
  enum class Kind : uint8_t { kSend, kRecv, kRecvReduce };

  ThreadOp(std::shared_ptr<Group> g, int rank, Kind kind, int peer, uint64_t tag, void* buf,
           size_t bytes, const Stamp& stamp)
      : group_(std::move(g)),
        rank_(rank),
        kind_(kind),
        peer_(peer),
        tag_(tag),
        buf_(buf),
        bytes_(bytes),
        stamp_(stamp) {}
  ~ThreadOp() override;

  bool test() override;
  void wait(Deadline deadline) override;

  // Posts this op: a receive completes at once against a waiting send, a send pairs with a
  // waiting receive (the receiver copies); otherwise the op is queued.
  void post();
  void set_reduce(size_t count, ElemType elem, ReduceOp op) {
    count_ = count;
    elem_ = elem;
    op_ = op;
  }

 private:
  Mailbox& box() {
    return kind_ == Kind::kSend ? group_->box(rank_, peer_) : group_->box(peer_, rank_);
  }
  static void transfer(ThreadOp* send, ThreadOp* recv) noexcept;
  // A paired op whose copy nobody has started: claims the copy and does it. False if it is not
  // paired or the partner claimed it first.
  bool run_paired() noexcept;
  std::string where() const;
  [[noreturn]] void fail_aborted() const;

  std::shared_ptr<Group> group_;
  int rank_;
  Kind kind_;
  int peer_;
  uint64_t tag_;
  void* buf_;
  size_t bytes_;
  Stamp stamp_;
  size_t count_ = 0;
  ElemType elem_ = ElemType::kU8;
  ReduceOp op_ = ReduceOp::kSum;
  bool posted_ = false;
  bool queued_ = false;  // guarded by the mailbox lock
  // Set under the mailbox lock when a send pairs with a waiting receive. The claim flag is
  // shared: whichever side sets it runs the copy, and the other op cannot complete (or be
  // destroyed) before that copy ends, while the flag outlives both.
  ThreadOp* partner_ = nullptr;
  std::shared_ptr<std::atomic<bool>> claim_;
  Event done_;
  std::string error_;  // written before done_ is set
};

std::string ThreadOp::where() const {
  return str("comm: ", describe(stamp_), " on rank ", rank_, " of ", group_->n, " (threads, ",
             kind_ == Kind::kSend ? "send to" : "recv from", " rank ", peer_, ", tag ", tag_, ", ",
             bytes_, " bytes)");
}

void ThreadOp::fail_aborted() const {
  throw CommError(str(where(), ": group aborted: ", group_->family->why()));
}

void ThreadOp::post() {
  if (group_->family->aborted.load(std::memory_order_acquire)) fail_aborted();
  posted_ = true;
  group_->cpus[rank_].store(sched_getcpu(), std::memory_order_relaxed);
  group_->publish(rank_, stamp_);
  Mailbox& b = box();
  std::deque<ThreadOp*>& partners = kind_ == Kind::kSend ? b.recvs : b.sends;
  ThreadOp* match = nullptr;
  {
    std::lock_guard<SpinLock> lock(b.mu);
    auto it = std::find_if(partners.begin(), partners.end(),
                           [&](ThreadOp* p) { return p->tag_ == tag_; });
    if (it != partners.end()) {
      match = *it;
      match->queued_ = false;
      partners.erase(it);
      if (kind_ == Kind::kSend) {
        partner_ = match;
        match->partner_ = this;
        claim_ = match->claim_ = std::make_shared<std::atomic<bool>>(false);
      }
    } else {
      (kind_ == Kind::kSend ? b.sends : b.recvs).push_back(this);
      queued_ = true;
    }
  }
  if (!match) return;
  if (kind_ != Kind::kSend) return transfer(match, this);
  match->done_.signal();  // the receiver copies; this wakes it if it sleeps
}

bool ThreadOp::run_paired() noexcept {
  if (!claim_ || claim_->exchange(true, std::memory_order_acq_rel)) return false;
  kind_ == Kind::kSend ? transfer(this, partner_) : transfer(partner_, this);
  return true;
}

void ThreadOp::transfer(ThreadOp* send, ThreadOp* recv) noexcept {
  std::string error;
  if (send->bytes_ != recv->bytes_ || !(send->stamp_ == recv->stamp_)) {
    error = str("comm: mismatched calls between rank ", recv->rank_, " and rank ", send->rank_,
                " (threads, tag ", recv->tag_, "): rank ", recv->rank_, " runs ",
                describe(recv->stamp_), " and expects ", recv->bytes_, " bytes, but rank ",
                send->rank_, " runs ", describe(send->stamp_), " and sent ", send->bytes_,
                " bytes; make every rank call the same collectives in the same order with the "
                "same count, dtype and root");
  } else {
    try {
      if (recv->kind_ == Kind::kRecvReduce)
        reduce_into(recv->buf_, send->buf_, recv->count_, recv->elem_, recv->op_);
      else if (send->bytes_ >= kStreamMinSegment &&
               recv->stamp_.count * elem_size(recv->stamp_.elem) >= kStreamMinCall)
        copy_streaming(recv->buf_, send->buf_, send->bytes_);
      else if (send->bytes_)
        std::memcpy(recv->buf_, send->buf_, send->bytes_);
    } catch (const std::exception& e) {
      error = str("comm: reduction failed on rank ", recv->rank_, ": ", e.what());
    }
  }
  if (!error.empty()) {
    // The receiver's side names both calls; the group is aborted when a wait reports it.
    send->error_ = error;
    recv->error_ = error;
  }
  recv->done_.set();
  send->done_.set();
}

ThreadOp::~ThreadOp() {
  if (!posted_ || done_.is_set()) return;
  {
    std::lock_guard<SpinLock> lock(box().mu);
    if (queued_) {
      auto& q = kind_ == Kind::kSend ? box().sends : box().recvs;
      q.erase(std::find(q.begin(), q.end(), this));
      queued_ = false;
      return;
    }
  }
  // Paired: run the copy unless the partner is running it, then let it finish.
  if (done_.is_signalled() || kind_ == Kind::kSend) run_paired();
  while (!done_.is_set()) std::this_thread::yield();
}

bool ThreadOp::test() {
  if (kind_ != Kind::kSend && !done_.is_set() && done_.is_signalled()) run_paired();
  if (done_.is_set()) {
    if (!error_.empty()) throw CommError(error_);
    return true;
  }
  if (group_->family->aborted.load(std::memory_order_acquire)) fail_aborted();
  return false;
}

void ThreadOp::wait(Deadline deadline) {
  Family& fam = *group_->family;
  WaitPolicy policy = effective_policy(group_->policy);
  int cpu = sched_getcpu();
  if (cpu >= 0 && cpu == group_->cpus[peer_].load(std::memory_order_relaxed))
    policy.oversubscribed = true;
  // A paired send copies at once rather than idle until its receiver does.
  if (kind_ == Kind::kSend && claim_) run_paired();
  std::string mismatch;
  WaitMark mark(&group_->slot(rank_), group_->world[peer_]);
  bool ok = done_.wait(deadline, policy, [&] {
    if (fam.aborted.load(std::memory_order_relaxed)) return true;
    mismatch = group_->check_peer(rank_, stamp_, peer_);
    return !mismatch.empty();
  });
  if (ok && !done_.is_set()) {
    // Signalled: this receive was paired with its send. Copy, unless the sender already is.
    run_paired();
    while (!done_.is_set()) std::this_thread::yield();
  }
  if (!ok) {
    if (!mismatch.empty() && !done_.is_set()) {
      fam.abort(mismatch);
      throw CommError(mismatch);
    }
    if (fam.aborted.load(std::memory_order_acquire)) fail_aborted();
    const std::string stuck = group_->stuck_rank(rank_);
    std::string msg =
        str(where(), ": no matching ", kind_ == Kind::kSend ? "receive" : "send", " from rank ",
            peer_, " before the deadline; ",
            stuck.empty() ? "that rank is stuck, died or never made this call" : stuck,
            " (check that every rank calls the same collectives, or raise "
            "comm.timeout_s)");
    fam.abort(msg);
    throw CommError(msg);
  }
  if (!error_.empty()) throw CommError(error_);
}

class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::shared_ptr<Group> g, int rank) : group_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->n; }
  Backend backend() const override { return Backend::kThreads; }
  bool oversubscribed() const override { return group_->policy.oversubscribed; }
  size_t default_segment_bytes() const override { return 1 << 20; }

  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t bytes,
                   const Stamp& stamp) override {
    check_peer(peer);
    auto op = std::make_unique<ThreadOp>(group_, rank_, ThreadOp::Kind::kSend, peer, tag,
                                         const_cast<void*>(data), bytes, stamp);
    op->post();
    return op;
  }
  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t bytes, const Stamp& stamp) override {
    check_peer(peer);
    auto op = std::make_unique<ThreadOp>(group_, rank_, ThreadOp::Kind::kRecv, peer, tag, data,
                                         bytes, stamp);
    op->post();
    return op;
  }
  RequestPtr irecv_reduce(int peer, uint64_t tag, void* acc, size_t count, ElemType elem,
                          ReduceOp op, const Stamp& stamp) override {
    check_peer(peer);
    auto r = std::make_unique<ThreadOp>(group_, rank_, ThreadOp::Kind::kRecvReduce, peer, tag, acc,
                                        count * elem_size(elem), stamp);
    r->set_reduce(count, elem, op);
    r->post();
    return r;
  }

  void abort(const std::string& reason) noexcept override { group_->family->abort(reason); }
  bool aborted() const override { return group_->family->aborted.load(); }
  void check_alive() override {
    if (aborted())
      throw CommError(
          str("comm: rank ", rank_, " (threads): group aborted: ", group_->family->why()));
  }

  std::unique_ptr<Transport> split(int color, int, const std::vector<int>& members,
                                   uint64_t split_id) override {
    if (color < 0) return nullptr;
    std::shared_ptr<Group> sub;
    {
      // The first member to arrive creates the group; the last one clears the entry.
      std::lock_guard<std::mutex> lock(group_->split_mu);
      auto& entry = group_->splits[{split_id, color}];
      if (!entry.group) {
        std::vector<int> world;
        for (int m : members) world.push_back(group_->world[m]);
        entry.group = std::make_shared<Group>(std::move(world), group_->family, group_->policy);
        entry.group->policy.oversubscribed = group_->policy.oversubscribed;
        entry.remaining = members.size();
      }
      sub = entry.group;
      if (--entry.remaining == 0) group_->splits.erase({split_id, color});
    }
    int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    TESSEL_CHECK(new_rank < static_cast<int>(members.size()), "split: rank ", rank_,
                 " missing from its own group");
    return std::make_unique<ThreadTransport>(sub, new_rank);
  }

  // One process: the first rank to arrive allocates, every rank gets the same block.
  std::shared_ptr<void> shared_memory(size_t bytes, uint64_t id) override {
    std::lock_guard<std::mutex> lock(group_->shared_mu);
    auto& entry = group_->shared[id];
    if (!entry.memory) {
      size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, rounded);
      if (!p) throw std::bad_alloc();
      std::memset(p, 0, rounded);
      entry.memory = std::shared_ptr<void>(p, std::free);
      entry.remaining = static_cast<size_t>(group_->n);
    }
    std::shared_ptr<void> out = entry.memory;
    if (--entry.remaining == 0) group_->shared.erase(id);
    return out;
  }

 private:
  void check_peer(int peer) const {
    if (peer < 0 || peer >= group_->n)
      throw InvalidArgument(str("comm: peer rank out of range, got ", peer, " in a group of ",
                                group_->n, "; use 0..", group_->n - 1));
  }
  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Transport>> make_thread_transports(int world_size,
                                                               const CommOptions& options) {
  if (world_size < 1) throw InvalidArgument(str("comm: world size must be >= 1, got ", world_size));
  WaitPolicy policy;
  policy.spin_us = options.spin_us;
  policy.yield_us = options.yield_us;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  policy.oversubscribed = static_cast<unsigned>(world_size) > cores;
  std::vector<int> world(world_size);
  for (int r = 0; r < world_size; ++r) world[r] = r;
  auto group =
      std::make_shared<Group>(std::move(world), std::make_shared<Family>(world_size), policy);
  std::vector<std::unique_ptr<Transport>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<ThreadTransport>(group, r));
  return out;
}

}  // namespace tessel::comm
