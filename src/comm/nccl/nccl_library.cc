// nccl_library(): the NcclApi table over libnccl and the CUDA runtime. The only file that
// includes nccl.h; type and operator names are converted here, and nowhere else.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>

#include "tessel/comm/nccl_api.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId));
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(kCudaNotReady == cudaErrorNotReady);

ncclDataType_t type_of(ElemType e) {
  switch (e) {
    case ElemType::kF32:
      return ncclFloat32;
    case ElemType::kF64:
      return ncclFloat64;
    case ElemType::kF16:
      return ncclFloat16;
    case ElemType::kBF16:
      return ncclBfloat16;
    case ElemType::kI32:
      return ncclInt32;
    case ElemType::kI64:
      return ncclInt64;
    case ElemType::kU8:
      return ncclUint8;
  }
  throw InvalidArgument(str("nccl: no NCCL type for element type ", static_cast<int>(e)));
}

ncclRedOp_t op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  throw InvalidArgument(str("nccl: no NCCL operator for reduce op ", static_cast<int>(op)));
}

ncclComm_t raw(NcclComm c) { return reinterpret_cast<ncclComm_t>(c); }
cudaStream_t raw(NcclStream s) { return static_cast<cudaStream_t>(s); }
NcclResult out(ncclResult_t r) { return static_cast<NcclResult>(r); }

const NcclApi kLibrary = {
    .name = "libnccl",
    .get_unique_id =
        [](NcclUniqueId* id) { return out(ncclGetUniqueId(reinterpret_cast<ncclUniqueId*>(id))); },
    .init_rank =
        [](NcclComm* comm, int nranks, const NcclUniqueId* id, int rank) {
          ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
          config.blocking = 0;
          ncclComm_t c = nullptr;
          ncclUniqueId uid;
          static_assert(sizeof uid == sizeof *id);
          std::memcpy(&uid, id, sizeof uid);
          const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, uid, rank, &config);
          *comm = reinterpret_cast<NcclComm>(c);
          return out(r);
        },
    .all_reduce =
        [](const void* send, void* recv, size_t count, ElemType elem, ReduceOp op, NcclComm comm,
           NcclStream stream) {
          return out(
              ncclAllReduce(send, recv, count, type_of(elem), op_of(op), raw(comm), raw(stream)));
        },
    .reduce =
        [](const void* send, void* recv, size_t count, ElemType elem, ReduceOp op, int root,
           NcclComm comm, NcclStream stream) {
          return out(ncclReduce(send, recv, count, type_of(elem), op_of(op), root, raw(comm),
                                raw(stream)));
        },
    .reduce_scatter =
        [](const void* send, void* recv, size_t recv_count, ElemType elem, ReduceOp op,
           NcclComm comm, NcclStream stream) {
          return out(ncclReduceScatter(send, recv, recv_count, type_of(elem), op_of(op), raw(comm),
                                       raw(stream)));
        },
    .all_gather =
        [](const void* send, void* recv, size_t send_count, ElemType elem, NcclComm comm,
           NcclStream stream) {
          return out(ncclAllGather(send, recv, send_count, type_of(elem), raw(comm), raw(stream)));
        },
    .broadcast =
        [](const void* send, void* recv, size_t count, ElemType elem, int root, NcclComm comm,
           NcclStream stream) {
          return out(ncclBroadcast(send, recv, count, type_of(elem), root, raw(comm), raw(stream)));
        },
    .send =
        [](const void* buf, size_t count, ElemType elem, int peer, NcclComm comm,
           NcclStream stream) {
          return out(ncclSend(buf, count, type_of(elem), peer, raw(comm), raw(stream)));
        },
    .recv =
        [](void* buf, size_t count, ElemType elem, int peer, NcclComm comm, NcclStream stream) {
          return out(ncclRecv(buf, count, type_of(elem), peer, raw(comm), raw(stream)));
        },
    .group_start = [] { return out(ncclGroupStart()); },
    .group_end = [] { return out(ncclGroupEnd()); },
    .get_async_error =
        [](NcclComm comm, NcclResult* async_error) {
          ncclResult_t a = ncclSuccess;
          const ncclResult_t r = ncclCommGetAsyncError(raw(comm), &a);
          *async_error = out(a);
          return out(r);
        },
    .abort = [](NcclComm comm) { return out(ncclCommAbort(raw(comm))); },
    .finalize = [](NcclComm comm) { return out(ncclCommFinalize(raw(comm))); },
    .destroy = [](NcclComm comm) { return out(ncclCommDestroy(raw(comm))); },
    .last_error = [](NcclComm comm) { return ncclGetLastError(raw(comm)); },
    .shares_device =
        [] {
          int version = 0;
          const char* enable = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
          return ncclGetVersion(&version) == ncclSuccess && version >= 23000 && enable != nullptr &&
                 std::strcmp(enable, "1") == 0;
        },
    .device_count = [](int* count) { return static_cast<int>(cudaGetDeviceCount(count)); },
    .set_device = [](int device) { return static_cast<int>(cudaSetDevice(device)); },
    .stream_create =
        [](NcclStream* stream) {
          cudaStream_t s = nullptr;
          const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
          *stream = s;
          return static_cast<int>(e);
        },
    .stream_wait_event =
        [](NcclStream s, NcclEvent e) {
          return static_cast<int>(cudaStreamWaitEvent(raw(s), static_cast<cudaEvent_t>(e), 0));
        },
    .stream_destroy = [](NcclStream s) { return static_cast<int>(cudaStreamDestroy(raw(s))); },
    .event_create =
        [](NcclEvent* event) {
          cudaEvent_t e = nullptr;
          const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
          *event = e;
          return static_cast<int>(r);
        },
    .event_record =
        [](NcclEvent e, NcclStream s) {
          return static_cast<int>(cudaEventRecord(static_cast<cudaEvent_t>(e), raw(s)));
        },
    .event_query =
        [](NcclEvent e) { return static_cast<int>(cudaEventQuery(static_cast<cudaEvent_t>(e))); },
    .event_destroy =
        [](NcclEvent e) { return static_cast<int>(cudaEventDestroy(static_cast<cudaEvent_t>(e))); },
    .device_error_string = [](int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); },
};

}  // namespace

const NcclApi& nccl_library() { return kLibrary; }

}  // namespace tessel::comm
