// The floor of the MPI files (mpi_base.h) and the public mpi.h entry points that need nothing
// above it.
#include "mpi_base.h"

#include "../reduce.h"
#include "tessel/comm/mpi.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace mpi_detail {
namespace {

std::mutex g_call_mutex;
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

// Both asked once, on first use: every caller holds a communicator, so MPI is initialised.
bool thread_multiple() {
  static const bool multiple = [] {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_MULTIPLE;
  }();
  return multiple;
}

int tag_upper_bound() {
  static const int ub = [] {
    void* value = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag);
    return flag && value ? *static_cast<int*>(value) : 32767;  // 32767: the least MPI allows
  }();
  return ub;
}

Guard::Guard() {
  if (!thread_multiple()) lock_ = std::unique_lock<std::mutex>(g_call_mutex);
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
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "";
  int provided = -1;
  MPI_Query_thread(&provided);
  switch (provided) {
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

}  // namespace tessel::comm
