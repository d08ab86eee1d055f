// Device probing, DeviceBuffer (plain cudaMalloc/cudaFree, synchronous copies) and the kernels'
// per-stream scratch.
#include "tessel/ops/cuda/device.h"

#include <unordered_map>

#include "tessel/ops/cuda/check.h"

namespace tessel::ops::cuda {

std::string device_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls do not see it
    return str("no CUDA device: ", cudaGetErrorString(e));
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return "";
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&p_, bytes);
  if (e != cudaSuccess) {
    p_ = nullptr;
    check_cuda(e, str("cudaMalloc of ", bytes, " bytes").c_str());
  }
}

DeviceBuffer::~DeviceBuffer() noexcept {
  if (p_ != nullptr) cudaFree(p_);  // an error here has nobody to report to
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) cudaFree(p_);
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  TESSEL_CHECK(bytes <= bytes_, "DeviceBuffer::upload: ", bytes, " bytes into ", bytes_);
  if (bytes > 0) check_cuda(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  TESSEL_CHECK(bytes <= bytes_, "DeviceBuffer::download: ", bytes, " bytes from ", bytes_);
  if (bytes > 0) check_cuda(cudaMemcpy(host, p_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

void DeviceBuffer::fill(int byte) {
  if (bytes_ > 0) check_cuda(cudaMemset(p_, byte, bytes_), "cudaMemset");
}

namespace detail {

// common.cuh's stream_scratch. Growing frees the old buffer: cudaFree waits for the device, so
// no queued kernel still reads it.
float* stream_scratch(size_t floats, cudaStream_t stream) {
  thread_local std::unordered_map<cudaStream_t, DeviceBuffer> buffers;
  DeviceBuffer& b = buffers[stream];
  if (b.bytes() < floats * sizeof(float)) b = DeviceBuffer(floats * sizeof(float));
  return b.as<float>();
}

}  // namespace detail

}  // namespace tessel::ops::cuda
