// MPI start-up and shut-down, the call lock, the watchdog, datatypes and the public entry
// points of mpi.h.
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include "../reduce.h"
#include "mpi_family.h"
#include "mpi_internal.h"
#include "tessel/comm/mpi.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel::comm {
namespace mpi_detail {
namespace {

std::once_flag g_init_once;
bool g_we_initialized = false;
int g_provided = -1;
int g_tag_ub = 32767;
std::mutex g_call_mutex;

// ---- watchdog ----
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

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A peer that died or hangs would make MPI_Finalize wait forever.
  WatchdogArm arm(Deadline::after(30), "comm: MPI_Finalize");  // after success only
  MPI_Finalize();
}

MPI_Op g_half_ops[2][4];  // [bf16?][ReduceOp]
std::once_flag g_ops_once;

template <ElemType E, ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<size_t>(*len), E, Op);
}

void create_half_ops() {
  using R = ReduceOp;
  MPI_Op_create(&half_op<ElemType::kF16, R::kSum>, 1, &g_half_ops[0][0]);
  MPI_Op_create(&half_op<ElemType::kF16, R::kMax>, 1, &g_half_ops[0][2]);
  MPI_Op_create(&half_op<ElemType::kF16, R::kMin>, 1, &g_half_ops[0][3]);
  MPI_Op_create(&half_op<ElemType::kBF16, R::kSum>, 1, &g_half_ops[1][0]);
  MPI_Op_create(&half_op<ElemType::kBF16, R::kMax>, 1, &g_half_ops[1][2]);
  MPI_Op_create(&half_op<ElemType::kBF16, R::kMin>, 1, &g_half_ops[1][3]);
  g_half_ops[0][1] = g_half_ops[0][0];
  g_half_ops[1][1] = g_half_ops[1][0];
}

}  // namespace

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(str("comm: ", call, " failed: ", std::string(text, len),
                      "; check the MPI launcher and that every rank is alive"));
}

void ensure_initialized(double timeout_s) {
  std::call_once(g_init_once, [timeout_s] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      WatchdogArm arm(Deadline::after(timeout_s), "comm: MPI_Init (every rank joins the job)");
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &g_provided), "MPI_Init_thread");
      g_we_initialized = true;
      std::atexit(finalize_at_exit);
    } else {
      MPI_Query_thread(&g_provided);
    }
    if (g_provided < MPI_THREAD_SERIALIZED)
      throw CommError(str("comm: MPI grants thread level ", g_provided,
                          ", but tessel needs at "
                          "least MPI_THREAD_SERIALIZED; initialise MPI with "
                          "MPI_Init_thread(MPI_THREAD_MULTIPLE) or let tessel do it"));
    void* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (flag && ub) g_tag_ub = *static_cast<int*>(ub);
  });
}

bool thread_multiple() { return g_provided >= MPI_THREAD_MULTIPLE; }
int tag_upper_bound() { return g_tag_ub; }

Guard::Guard() {
  if (!thread_multiple()) lock_ = std::unique_lock<std::mutex>(g_call_mutex);
}

WatchdogArm::WatchdogArm(Deadline deadline, std::string what)
    : id_(deadline.is_never() ? 0 : Watchdog::get().arm(deadline, std::move(what))) {}

WatchdogArm::~WatchdogArm() {
  if (id_) Watchdog::get().disarm(id_);
}

MPI_Datatype datatype(ElemType e) {
  switch (e) {
    case ElemType::kF32:
      return MPI_FLOAT;
    case ElemType::kF64:
      return MPI_DOUBLE;
    case ElemType::kI32:
      return MPI_INT32_T;
    case ElemType::kI64:
      return MPI_INT64_T;
    case ElemType::kF16:
    case ElemType::kBF16:
      return MPI_UINT16_T;
    case ElemType::kU8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op reduce_op(ElemType e, ReduceOp op) {
  if (e == ElemType::kF16 || e == ElemType::kBF16) {
    std::call_once(g_ops_once, create_half_ops);
    return g_half_ops[e == ElemType::kBF16][static_cast<int>(op)];
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace mpi_detail

bool mpi_built() { return true; }

const char* mpi_thread_level() {
  using namespace mpi_detail;
  switch (g_provided) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "";
  }
}

void mpi_end_failed_job(const std::string& reason, int exit_code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return;
  const bool consequence = mpi_detail::failure_came_from_peer(0);
  mpi_detail::abort_all_families(reason, 0.5);
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
