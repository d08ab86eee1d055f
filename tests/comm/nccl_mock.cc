#include "nccl_mock.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../../src/comm/reduce.h"
#include "fake_device.h"
#include "nccl_mock_cuda.h"
#include "tessel/core/error.h"

namespace tessel::comm::testing {
namespace mock {
namespace {

enum class Kind { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv };

struct Op {
  Kind kind;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // all-gather: per rank sent; reduce-scatter: per rank received
  ElemType elem = ElemType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = -1;  // or the peer of a send / recv
  NcclStream stream = nullptr;
};

struct Meeting {  // one collective: every rank's op, then the result
  std::vector<const Op*> ops;
  int arrived = 0, left = 0;
  bool done = false;
};

struct Message {  // a send waiting for its receive
  const void* data;
  size_t bytes;
  bool taken = false;
};

struct Group {  // the ranks of one unique id; every field under mu
  int nranks = 0;
  std::vector<int> gpus;  // of the ranks joined so far
  std::mutex mu;
  std::condition_variable cv;
  int joined = 0, finalized = 0;
  std::vector<char> taken_ranks;
  bool broken = false;  // a rank aborted, died or disagreed: nothing completes any more
  int aborts = 0;       // communicators of the group aborted
  NcclResult error = NcclResult::kSuccess;  // what the live ranks' async error turns into
  std::map<uint64_t, Meeting> meetings;     // by collective number
  std::map<std::pair<int, int>, std::deque<Message*>> wires;  // (from, to), in send order
};

struct Comm {
  std::shared_ptr<Group> g;
  int rank = 0;
  int gpu = 0;  // the thread's fake GPU at init, as NCCL binds a communicator to its device
  MockFault fault = MockFault::kNone;
  int fault_after = 0;
  double delay_s = 0;  // mock_nccl_delay
  // Under g->mu:
  bool settling = true;  // answered kInProgress, not yet polled out of it (init included)
  bool finalizing = false, aborted = false, freed = false;
  bool dead = false;         // its kDie fault struck: a dead process's calls neither wait nor fail
  bool held = false;         // its thread was held in the call it died in (die_here)
  int in_flight = 0;         // work items queued or running
  uint64_t items = 0;        // work items enqueued
  uint64_t collectives = 0;  // collectives run (stream side)
};

struct Library {  // the mock library's global state, as libnccl's
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Group>> groups;
  std::vector<std::unique_ptr<Comm>> comms;  // kept until reset: dead handles stay detectable
  std::map<int, std::pair<MockFault, int>> faults;
  double delay_s = 0;
  int misuses = 0;
  std::string first_misuse;
  uint64_t ids = 0;
  bool shares_device = true;  // mock_nccl_shares_device
};
Library& lib() {
  static Library l;
  return l;
}

}  // namespace

NcclResult misuse(const std::string& what) {
  Library& l = lib();
  std::lock_guard<std::mutex> lock(l.mu);
  if (l.misuses++ == 0) l.first_misuse = what;
  return NcclResult::kInvalidUsage;
}

namespace {

Comm* comm_of(NcclComm c) { return reinterpret_cast<Comm*>(c); }

// A call other than get_async_error / abort may be made on this communicator now (g->mu held).
NcclResult usable(const Comm& c, const char* call) {
  if (c.freed) return misuse(str(call, " on rank ", c.rank, "'s communicator after abort/destroy"));
  if (c.settling)
    return misuse(str(call, " on rank ", c.rank, " before the previous call left kInProgress"));
  return NcclResult::kSuccess;
}

// ---- the device side: what a stream runs ----

// Every rank's op of one collective is in `m`: computes and writes the results.
void compute(Group& g, Meeting& m) {
  const Op& a = *m.ops[0];
  for (int r = 1; r < g.nranks; ++r) {
    const Op& b = *m.ops[r];
    if (b.kind != a.kind || b.count != a.count || b.elem != a.elem || b.op != a.op ||
        b.root != a.root) {
      misuse(str("rank ", r, "'s collective differs from rank 0's"));
      g.broken = true;
      g.error = NcclResult::kInvalidUsage;
      return;
    }
  }
  const size_t esz = elem_size(a.elem), n = a.count, bytes = n * esz;
  const int ranks = g.nranks;
  auto copy = [](void* dst, const void* src, size_t len) {
    if (len) std::memmove(dst, src, len);
  };
  std::vector<char> acc;
  if (a.kind == Kind::kAllReduce || a.kind == Kind::kReduce || a.kind == Kind::kReduceScatter) {
    const size_t total = a.kind == Kind::kReduceScatter ? n * ranks : n;
    acc.assign(static_cast<const char*>(a.send), static_cast<const char*>(a.send) + total * esz);
    for (int r = 1; r < ranks; ++r) reduce_into(acc.data(), m.ops[r]->send, total, a.elem, a.op);
    if (a.op == ReduceOp::kAvg) divide_by(acc.data(), total, a.elem, ranks);
  } else if (a.kind == Kind::kAllGather) {
    acc.resize(bytes * ranks);
    for (int r = 0; r < ranks; ++r) copy(acc.data() + r * bytes, m.ops[r]->send, bytes);
  } else {  // broadcast
    const char* src = static_cast<const char*>(m.ops[a.root]->send);
    acc.assign(src, src + bytes);
  }
  for (int r = 0; r < ranks; ++r) {
    void* out = m.ops[r]->recv;
    switch (a.kind) {
      case Kind::kAllReduce:
      case Kind::kBroadcast:
        copy(out, acc.data(), bytes);
        break;
      case Kind::kReduce:
        if (r == a.root) copy(out, acc.data(), bytes);
        break;
      case Kind::kReduceScatter:
        copy(out, acc.data() + r * bytes, bytes);
        break;
      case Kind::kAllGather:
        copy(out, acc.data(), acc.size());
        break;
      default:
        break;
    }
  }
}

// Runs one collective of `c` (lock held); false when the group broke before it completed.
bool meet(Comm& c, const Op& op, std::unique_lock<std::mutex>& lock) {
  Group& g = *c.g;
  const uint64_t k = c.collectives++;
  Meeting& m = g.meetings[k];
  m.ops.resize(g.nranks);
  m.ops[c.rank] = &op;
  if (++m.arrived == g.nranks && !g.broken) {
    compute(g, m);
    m.done = !g.broken;
    g.cv.notify_all();
  }
  g.cv.wait(lock, [&] { return c.aborted || m.done; });
  if (!m.done) return false;
  if (++m.left == g.nranks) g.meetings.erase(k);
  return true;
}

// One work item of `c`: a group's sends are posted first, then its collectives run in order,
// then its receives, then it waits until its sends were taken (NCCL's sends wait for their
// receives too). Nothing completes once the group broke.
void run_item(Comm& c, const std::vector<Op>& ops, MockFault fault) {
  Group& g = *c.g;
  std::unique_lock<std::mutex> lock(g.mu);
  auto gone = [&] { return c.aborted; };
  if (fault == MockFault::kDie) {
    g.broken = true;
    g.error = NcclResult::kRemoteError;
    g.cv.notify_all();
  }
  if (fault != MockFault::kNone) return g.cv.wait(lock, gone);
  std::deque<Message> sent;
  for (const Op& op : ops)
    if (op.kind == Kind::kSend) {
      sent.push_back({op.send, op.count * elem_size(op.elem)});
      g.wires[{c.rank, op.root}].push_back(&sent.back());
    }
  g.cv.notify_all();
  bool ok = true;
  for (const Op& op : ops)
    if (ok && op.kind != Kind::kSend && op.kind != Kind::kRecv) ok = meet(c, op, lock);
  for (const Op& op : ops) {
    if (!ok || op.kind != Kind::kRecv) continue;
    auto& wire = g.wires[{op.root, c.rank}];
    g.cv.wait(lock, [&] { return gone() || (!g.broken && !wire.empty()); });
    if (gone()) break;
    Message* msg = wire.front();
    wire.pop_front();
    const size_t bytes = op.count * elem_size(op.elem);
    if (msg->bytes != bytes)
      misuse(str("rank ", c.rank, " receives ", bytes, " bytes, sent ", msg->bytes));
    if (msg->bytes && bytes) std::memcpy(op.recv, msg->data, std::min(bytes, msg->bytes));
    msg->taken = true;
    g.cv.notify_all();
  }
  auto all_taken = [&] {
    return std::all_of(sent.begin(), sent.end(), [](const Message& m) { return m.taken; });
  };
  g.cv.wait(lock, [&] { return gone() || (!g.broken && all_taken()); });
  for (Message& m : sent)  // aborted: withdraw what nobody took
    for (auto& [key, wire] : g.wires) std::erase(wire, &m);
}

// Queues a work item on its stream (g->mu held by the caller).
NcclResult enqueue(Comm& c, std::vector<Op> ops) {
  const MockFault fault =
      c.items++ >= static_cast<uint64_t>(c.fault_after) ? c.fault : MockFault::kNone;
  c.dead |= fault == MockFault::kDie;
  c.settling = !c.dead;
  ++c.in_flight;
  const NcclStream stream = ops[0].stream;
  stream_push(stream, [&c, ops = std::move(ops), fault] {
    if (c.delay_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(c.delay_s));
    run_item(c, ops, fault);
    std::lock_guard<std::mutex> lock(c.g->mu);
    --c.in_flight;
    c.g->cv.notify_all();
  });
  return c.dead ? NcclResult::kSuccess : NcclResult::kInProgress;
}

// ---- the host side: the table's NCCL calls ----

// A rank whose process died in the call just enqueued (kDie) shows no life any more: its thread
// stays inside that call until a peer aborted the group (so that a test's thread still ends),
// then the call returns as if nothing had happened.
void die_here(Comm& c, std::unique_lock<std::mutex>& lock) {
  if (!c.dead || c.held) return;
  c.held = true;
  c.g->cv.wait(lock, [&] { return c.g->aborts > 0; });
}

thread_local int t_depth = 0;  // ncclGroupStart nesting of this thread
thread_local std::vector<std::pair<Comm*, Op>> t_grouped;

NcclResult submit(NcclComm handle, const Op& op, const char* call) {
  Comm* c = comm_of(handle);
  if (!c) return misuse(str(call, " on a null communicator"));
  for (const void* p : {op.send, static_cast<const void*>(op.recv)})  // host memory: any GPU
    if (const int gpu = fakes::fake_gpu_of(p); gpu >= 0 && gpu != c->gpu)
      return misuse(str(call, " of rank ", c->rank, "'s communicator on GPU ", c->gpu,
                        " was given GPU ", gpu, "'s memory"));
  std::unique_lock<std::mutex> lock(c->g->mu);
  if (NcclResult r = usable(*c, call); r != NcclResult::kSuccess) return r;
  if (t_depth > 0) {
    t_grouped.emplace_back(c, op);
    return NcclResult::kSuccess;
  }
  const NcclResult r = enqueue(*c, {op});
  die_here(*c, lock);
  return r;
}

NcclResult group_end() {
  if (t_depth == 0) return misuse("ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return NcclResult::kSuccess;
  auto grouped = std::move(t_grouped);
  t_grouped.clear();
  NcclResult result = NcclResult::kSuccess;
  while (!grouped.empty()) {  // one work item per communicator, in first-call order
    Comm* c = grouped.front().first;
    std::vector<Op> ops;
    std::erase_if(grouped, [&](const auto& p) {
      if (p.first == c) ops.push_back(p.second);
      return p.first == c;
    });
    std::unique_lock<std::mutex> lock(c->g->mu);
    result = enqueue(*c, std::move(ops));
    die_here(*c, lock);
  }
  return result;
}

NcclResult init_rank(NcclComm* out, int nranks, const NcclUniqueId* id, int rank) {
  Library& l = lib();
  auto comm = std::make_unique<Comm>();
  bool shares = true;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    shares = l.shares_device;
    auto& g = l.groups[std::string(id->internal, kNcclUniqueIdBytes)];
    if (!g) {
      g = std::make_shared<Group>();
      g->nranks = nranks;
      g->taken_ranks.assign(nranks, 0);
    }
    comm->g = g;
    auto f = l.faults.find(rank);
    if (f != l.faults.end()) std::tie(comm->fault, comm->fault_after) = f->second;
    comm->delay_s = l.delay_s;
    if (g->nranks != nranks || rank < 0 || rank >= nranks || g->taken_ranks[rank]++) {
      if (l.misuses++ == 0)
        l.first_misuse =
            str("init_rank of rank ", rank, " of ", nranks, " in a group of ", g->nranks);
      return NcclResult::kInvalidUsage;
    }
  }
  Group& g = *comm->g;
  comm->rank = rank;
  comm->gpu = fakes::fake_gpu();
  {
    std::lock_guard<std::mutex> lock(g.mu);
    const bool taken = std::find(g.gpus.begin(), g.gpus.end(), comm->gpu) != g.gpus.end();
    if (taken && !shares)  // NCCL before 2.30: "Duplicate GPU detected"
      return misuse(str("init_rank of rank ", rank, " on GPU ", comm->gpu,
                        ", which another rank of the group holds"));
    g.gpus.push_back(comm->gpu);
    ++g.joined;
  }
  *out = reinterpret_cast<NcclComm>(comm.get());
  std::lock_guard<std::mutex> lock(l.mu);
  l.comms.push_back(std::move(comm));
  return NcclResult::kInProgress;
}

NcclResult get_async_error(NcclComm handle, NcclResult* async) {
  Comm* c = comm_of(handle);
  if (!c) return misuse("get_async_error on a null communicator");
  Group& g = *c->g;
  std::lock_guard<std::mutex> lock(g.mu);
  if (c->freed) return misuse(str("get_async_error on rank ", c->rank, " after abort/destroy"));
  const bool quiet =
      c->finalizing ? g.finalized == g.nranks && c->in_flight == 0 : g.joined == g.nranks;
  if (g.error != NcclResult::kSuccess && !c->dead) {
    *async = g.error;
  } else if (c->settling && quiet) {
    *async = NcclResult::kSuccess;
    c->settling = false;
  } else {
    *async = c->settling ? NcclResult::kInProgress : NcclResult::kSuccess;
  }
  return NcclResult::kSuccess;
}

NcclResult comm_abort(NcclComm handle) {
  Comm* c = comm_of(handle);
  if (!c) return misuse("abort on a null communicator");
  Group& g = *c->g;
  std::unique_lock<std::mutex> lock(g.mu);
  if (c->freed) return misuse(str("abort on rank ", c->rank, " after abort/destroy"));
  c->aborted = true;
  ++g.aborts;
  g.broken = true;
  if (g.error == NcclResult::kSuccess) g.error = NcclResult::kRemoteError;
  g.cv.notify_all();
  g.cv.wait(lock, [&] { return c->in_flight == 0; });  // NCCL's abort stops the device work
  c->freed = true;
  return NcclResult::kSuccess;
}

NcclResult finalize(NcclComm handle) {
  Comm* c = comm_of(handle);
  if (!c) return misuse("finalize on a null communicator");
  std::lock_guard<std::mutex> lock(c->g->mu);
  if (NcclResult r = usable(*c, "finalize"); r != NcclResult::kSuccess) return r;
  c->finalizing = c->settling = true;
  ++c->g->finalized;
  return NcclResult::kInProgress;
}

NcclResult destroy(NcclComm handle) {
  Comm* c = comm_of(handle);
  if (!c) return misuse("destroy on a null communicator");
  std::lock_guard<std::mutex> lock(c->g->mu);
  if (c->freed) return misuse(str("destroy on rank ", c->rank, " after abort/destroy"));
  if (c->in_flight) return misuse(str("destroy on rank ", c->rank, " with work in flight"));
  c->freed = true;
  return NcclResult::kSuccess;
}

Op make(Kind kind, const void* send, void* recv, size_t count, ElemType elem, ReduceOp op, int root,
        NcclStream stream) {
  return Op{kind, send, recv, count, elem, op, root, stream};
}

NcclApi make_mock() {
  NcclApi api = {
      .name = "mock nccl",
      .get_unique_id =
          [](NcclUniqueId* id) {
            std::memset(id, 0, sizeof *id);
            std::lock_guard<std::mutex> lock(lib().mu);
            const std::string text = str("mock-nccl-id-", ++lib().ids);
            std::memcpy(id->internal, text.data(), text.size());
            return NcclResult::kSuccess;
          },
      .init_rank = init_rank,
      .all_reduce =
          [](const void* s, void* r, size_t n, ElemType e, ReduceOp op, NcclComm c, NcclStream st) {
            return submit(c, make(Kind::kAllReduce, s, r, n, e, op, -1, st), "ncclAllReduce");
          },
      .reduce =
          [](const void* s, void* r, size_t n, ElemType e, ReduceOp op, int root, NcclComm c,
             NcclStream st) {
            return submit(c, make(Kind::kReduce, s, r, n, e, op, root, st), "ncclReduce");
          },
      .reduce_scatter =
          [](const void* s, void* r, size_t n, ElemType e, ReduceOp op, NcclComm c, NcclStream st) {
            return submit(c, make(Kind::kReduceScatter, s, r, n, e, op, -1, st),
                          "ncclReduceScatter");
          },
      .all_gather =
          [](const void* s, void* r, size_t n, ElemType e, NcclComm c, NcclStream st) {
            return submit(c, make(Kind::kAllGather, s, r, n, e, ReduceOp::kSum, -1, st),
                          "ncclAllGather");
          },
      .broadcast =
          [](const void* s, void* r, size_t n, ElemType e, int root, NcclComm c, NcclStream st) {
            return submit(c, make(Kind::kBroadcast, s, r, n, e, ReduceOp::kSum, root, st),
                          "ncclBroadcast");
          },
      .send =
          [](const void* b, size_t n, ElemType e, int peer, NcclComm c, NcclStream st) {
            return submit(c, make(Kind::kSend, b, nullptr, n, e, ReduceOp::kSum, peer, st),
                          "ncclSend");
          },
      .recv =
          [](void* b, size_t n, ElemType e, int peer, NcclComm c, NcclStream st) {
            return submit(c, make(Kind::kRecv, nullptr, b, n, e, ReduceOp::kSum, peer, st),
                          "ncclRecv");
          },
      .group_start =
          [] {
            ++t_depth;
            return NcclResult::kSuccess;
          },
      .group_end = group_end,
      .get_async_error = get_async_error,
      .abort = comm_abort,
      .finalize = finalize,
      .destroy = destroy,
      .last_error = [](NcclComm) -> const char* { return "mock nccl: see the async error"; },
      .shares_device =
          [] {
            std::lock_guard<std::mutex> lock(lib().mu);
            return lib().shares_device;
          },
      // the CUDA runtime's slots: fill_cuda_slots (nccl_mock_cuda.cc)
      .device_count = nullptr,
      .set_device = nullptr,
      .stream_create = nullptr,
      .stream_wait_event = nullptr,
      .stream_destroy = nullptr,
      .event_create = nullptr,
      .event_record = nullptr,
      .event_query = nullptr,
      .event_destroy = nullptr,
      .device_error_string = nullptr,
  };
  fill_cuda_slots(api);
  return api;
}

}  // namespace
}  // namespace mock

const NcclApi& mock_nccl() {
  static const NcclApi api = mock::make_mock();
  return api;
}

void mock_nccl_fault(int rank, MockFault fault, int after) {
  std::lock_guard<std::mutex> lock(mock::lib().mu);
  mock::lib().faults[rank] = {fault, after};
}

void mock_nccl_delay(double seconds) {
  std::lock_guard<std::mutex> lock(mock::lib().mu);
  mock::lib().delay_s = seconds;
}

MockNcclState mock_nccl_state() {
  mock::Library& l = mock::lib();
  MockNcclState s;
  std::vector<mock::Comm*> comms;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    for (const auto& c : l.comms) comms.push_back(c.get());
    s.misuses = l.misuses;
    s.first_misuse = l.first_misuse;
  }
  for (mock::Comm* c :
       comms) {  // group locks after the library's (misuse() nests them the other way)
    std::lock_guard<std::mutex> lock(c->g->mu);
    s.live_comms += !c->freed;
  }
  s.live_streams = mock::live_streams();
  return s;
}

void mock_nccl_shares_device(bool allowed) {
  std::lock_guard<std::mutex> lock(mock::lib().mu);
  mock::lib().shares_device = allowed;
}

void mock_nccl_reset() {
  mock::Library& l = mock::lib();
  std::lock_guard<std::mutex> lock(l.mu);
  l.shares_device = true;
  l.groups.clear();
  l.comms.clear();
  l.faults.clear();
  l.delay_s = 0;
  l.misuses = 0;
  l.first_misuse.clear();
}

}  // namespace tessel::comm::testing
