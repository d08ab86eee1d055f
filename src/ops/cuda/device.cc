// Device probing and DeviceBuffer: plain cudaMalloc/cudaFree, synchronous copies.
#include "tessel/ops/cuda/device.h"

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

}  // namespace tessel::ops::cuda
