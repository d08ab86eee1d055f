// The real NCCL (nccl_library()) on a GPU: a communicator of one rank (the lent machines have
// one GPU, and NCCL before 2.30 refuses two ranks on one device): bootstrap over a threads
// control plane, every collective and send/recv to itself on device buffers, abort and close.
// Skips, saying why, without a device; TESSEL_GPU_REQUIRED=1 makes that a failure.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "tessel/comm/nccl.h"
#include "tessel/comm/threads.h"
#include "tessel/core/error.h"

namespace tessel::comm {
namespace {

class NcclGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e == cudaSuccess && devices > 0) return;
    const std::string why =
        str("no CUDA device: ", e == cudaSuccess ? "none found" : cudaGetErrorString(e));
    const char* required = std::getenv("TESSEL_GPU_REQUIRED");
    if (required != nullptr && std::string(required) == "1")
      FAIL() << why << " (TESSEL_GPU_REQUIRED=1 turns the skip into a failure)";
    GTEST_SKIP() << why;
  }
};

// A device copy of host floats, read back on request.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n_, 1) * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p_); }
  float* get() { return static_cast<float*>(p_); }
  std::vector<float> host() const {
    std::vector<float> out(n_);
    EXPECT_EQ(cudaMemcpy(out.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t n_;
  void* p_ = nullptr;
};

std::vector<float> iota(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST_F(NcclGpu, OneRankRunsEveryCollectiveAndCloses) {
  run_threads(1, [](Communicator& c) {
    NcclCommunicator nccl(c, nccl_library());
    EXPECT_EQ(nccl.size(), 1);
    const size_t n = 1001;
    DeviceFloats a(iota(n, 1));
    nccl.allreduce(a.get(), n, ElemType::kF32, ReduceOp::kMax).wait();
    EXPECT_EQ(a.host(), iota(n, 1));
    DeviceFloats out(std::vector<float>(n, 0));
    nccl.reduce_scatter(a.get(), out.get(), {n}, ElemType::kF32).wait();
    EXPECT_EQ(out.host(), iota(n, 1));
    DeviceFloats gathered(std::vector<float>(n, 0));
    nccl.allgather(a.get(), gathered.get(), {n}, ElemType::kF32).wait();
    EXPECT_EQ(gathered.host(), iota(n, 1));
    nccl.broadcast(a.get(), n, ElemType::kF32, 0).wait();
    EXPECT_EQ(a.host(), iota(n, 1));
    DeviceFloats got(std::vector<float>(n, 0));
    nccl.send_recv(a.get(), n, 0, got.get(), n, 0, ElemType::kF32).wait();
    EXPECT_EQ(got.host(), iota(n, 1));
    nccl.close();
  });
}

TEST_F(NcclGpu, AbortFreesTheCommunicatorAndRefusesLaterCalls) {
  run_threads(1, [](Communicator& c) {
    NcclCommunicator nccl(c, nccl_library());
    DeviceFloats a(iota(16, 0));
    nccl.allreduce(a.get(), 16, ElemType::kF32).wait();
    nccl.abort("test: abort on the GPU");
    EXPECT_THROW((void)nccl.allreduce(a.get(), 16, ElemType::kF32), CommError);
    nccl.close();  // releases what is left; NCCL's handle is not touched again
  });
}

}  // namespace
}  // namespace tessel::comm
