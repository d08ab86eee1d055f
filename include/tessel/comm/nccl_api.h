// NcclApi: the NCCL calls a device rank's communicator makes, as a plain table of function
// pointers (the ggml backend-table style), plus the few CUDA stream and event calls a request
// needs. nccl_library() fills it from libnccl and the CUDA runtime (target tessel::comm_nccl,
// built only with CUDA and NCCL); tests fill it with a mock that runs ranks as threads on host
// memory. Every slot is required. Semantics are NCCL's for a non-blocking communicator
// (ncclConfig_t::blocking = 0): any call may return kInProgress, after which the caller polls
// get_async_error until it leaves kInProgress before the next call on that communicator.
// The table is immutable; thread safety is the library's (NCCL's: one thread per communicator,
// abort from any thread).
#pragma once

#include <cstddef>

#include "tessel/comm/types.h"

namespace tessel::comm {

// ncclResult_t, same values.
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,  // a peer's process exited or a connection to it broke
  kInProgress = 7,   // a non-blocking call is still being carried out in the background
};
const char* nccl_result_name(NcclResult r);  // "ncclRemoteError", ...

constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

struct NcclCommOpaque;
using NcclComm = NcclCommOpaque*;  // ncclComm_t
using NcclStream = void*;          // cudaStream_t
using NcclEvent = void*;           // cudaEvent_t

// Results of the stream and event slots (cudaError_t values): 0 success, kCudaNotReady for an
// event not reached yet, anything else an error that device_error_string names.
constexpr int kCudaNotReady = 600;  // cudaErrorNotReady

struct NcclApi {
  const char* name;  // for messages: "libnccl 2.28.3", "mock nccl"

  // ---- NCCL (the names are NCCL's without the ncclComm prefix) ----
  NcclResult (*get_unique_id)(NcclUniqueId* id);
  // ncclCommInitRankConfig on the current device with blocking = 0.
  NcclResult (*init_rank)(NcclComm* comm, int nranks, const NcclUniqueId* id, int rank);
  NcclResult (*all_reduce)(const void* send, void* recv, size_t count, ElemType elem, ReduceOp op,
                           NcclComm comm, NcclStream stream);
  NcclResult (*reduce)(const void* send, void* recv, size_t count, ElemType elem, ReduceOp op,
                       int root, NcclComm comm, NcclStream stream);
  // recv holds recv_count elements; send recv_count * nranks.
  NcclResult (*reduce_scatter)(const void* send, void* recv, size_t recv_count, ElemType elem,
                               ReduceOp op, NcclComm comm, NcclStream stream);
  // send holds send_count elements; recv send_count * nranks.
  NcclResult (*all_gather)(const void* send, void* recv, size_t send_count, ElemType elem,
                           NcclComm comm, NcclStream stream);
  NcclResult (*broadcast)(const void* send, void* recv, size_t count, ElemType elem, int root,
                          NcclComm comm, NcclStream stream);
  NcclResult (*send)(const void* buf, size_t count, ElemType elem, int peer, NcclComm comm,
                     NcclStream stream);
  NcclResult (*recv)(void* buf, size_t count, ElemType elem, int peer, NcclComm comm,
                     NcclStream stream);
  NcclResult (*group_start)();
  NcclResult (*group_end)();
  NcclResult (*get_async_error)(NcclComm comm, NcclResult* async_error);
  // Stops the communicator's work on the device and frees it: the handle is dead afterwards.
  NcclResult (*abort)(NcclComm comm);
  // Flushes issued work; the state is kInProgress until every rank finalized, then destroy.
  NcclResult (*finalize)(NcclComm comm);
  NcclResult (*destroy)(NcclComm comm);
  const char* (*last_error)(NcclComm comm);  // ncclGetLastError: the library's own words
  // Whether one communicator may hold several ranks on one device: NCCL 2.30 or newer with
  // NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment (older NCCL refuses them at init).
  bool (*shares_device)();

  // ---- CUDA runtime ----
  int (*device_count)(int* count);           // cudaGetDeviceCount
  int (*set_device)(int device);             // cudaSetDevice: this thread's device from now on
  int (*stream_create)(NcclStream* stream);  // non-blocking with respect to the null stream
  // Work queued on `stream` from now on waits for `event` (cudaStreamWaitEvent).
  int (*stream_wait_event)(NcclStream stream, NcclEvent event);
  int (*stream_destroy)(NcclStream stream);
  int (*event_create)(NcclEvent* event);                    // without timing
  int (*event_record)(NcclEvent event, NcclStream stream);  // null: the default stream
  int (*event_query)(NcclEvent event);                      // 0: reached; kCudaNotReady: not yet
  int (*event_destroy)(NcclEvent event);
  const char* (*device_error_string)(int error);
};

// libnccl and the CUDA runtime. Defined by target tessel::comm_nccl, which exists only in a
// build with CUDA where CMake found NCCL (docs/nccl.md).
const NcclApi& nccl_library();

// The table device ranks use (process wide, as the device runtime: the tessel binary installs
// nccl_library() where it was built, tests the mock; null uninstalls). Without one, device
// ranks copy their buffers through host memory (staged_collectives.h).
void install_nccl_api(const NcclApi* api);
const NcclApi* installed_nccl_api();  // null when none

}  // namespace tessel::comm
