// Tensor: a value type holding a shape, a dtype, a device and a shared, 64-byte aligned
// storage (on a device: through its runtime, tessel/tensor/device.h, whose pointer contract
// applies). Tensors are always contiguous; copying a Tensor shares its storage (a view), clone()
// copies the bytes. No autograd lives here: modules cache what their backward needs.
// Not thread safe for concurrent writes to the same storage; distinct views may be written
// from distinct threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/core/memory.h"
#include "tessel/tensor/dtype.h"

namespace tessel {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[128, 784]"

// A 64-byte aligned, zero-initialised block of bytes on one device. Its bytes are charged to the
// allocating thread's memory ledger (core/memory.h) until it is freed or rebound: host bytes as
// allocated, device bytes as the device runtime's allocation_size (its size class).
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // From now on the bytes live at `data` (at least bytes() long, 64-byte aligned, kept alive by
  // `keep`), e.g. memory shared with other ranks; the own allocation is freed and every tensor
  // viewing this storage follows. Values are not copied. Host storage only.
  void rebind(void* data, std::shared_ptr<void> keep);
  // Activation offload (device storage only): swap_out queues the copy of the bytes to `host`
  // (pinned, at least bytes() long) on `stream` (DeviceRuntime::copy_async) and hands the
  // device allocation, and its charge, to the storage it returns: keep that alive until an
  // event recorded on `stream` after the copy is reached (the copy reads it), then drop it.
  // Until swap_in() -- which allocates again, charging the thread's current ledger and
  // category, and queues the copy back from `host` on `stream` -- no tensor viewing this
  // storage may be used; after it, only by work ordered after that copy (an event), and `host`
  // is kept until the copy is reached.
  [[nodiscard]] std::unique_ptr<Storage> swap_out(void* host, void* stream);
  void swap_in(const void* host, void* stream);
  bool swapped_out() const { return device_ != Device::kCpu && data_ == nullptr; }

 private:
  struct Unallocated {};
  Storage(size_t bytes, Device device, Unallocated) : bytes_(bytes), device_(device) {}
  void charge_current();  // the current ledger and category, for an allocation of ours
  void free_own() noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  std::shared_ptr<void> keep_;            // set once rebound: data_ is not ours to free
  std::shared_ptr<MemoryLedger> ledger_;  // charged for our own allocation (may be null)
  MemCategory category_ = MemCategory::kOther;
  int64_t charged_ = 0;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kU8;
}

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype = DType::kF32, Device device = Device::kCpu);
  static Tensor zeros(Shape shape, DType dtype = DType::kF32, Device device = Device::kCpu);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() const {
    TESSEL_CHECK(
        storage_ != nullptr,
        "tensor: raw() of an undefined tensor (e.g. a parameter of a released ZeRO-3 unit)");
    return static_cast<char*>(storage_->data()) + offset_;
  }
  // The elements, for host code: throws on a device tensor (copy it to the host first).
  template <typename T>
  T* data() const {
    if (device_ != Device::kCpu) [[unlikely]]
      throw_device_pointer(dtype_of<T>(), "data");
    return typed<T>("data");
  }
  // The elements in device memory, for device kernels only: throws on a host tensor.
  template <typename T>
  T* device_data() const {
    if (device_ == Device::kCpu) [[unlikely]]
      throw_device_pointer(dtype_of<T>(), "device_data");
    return typed<T>("device_data");
  }
  // The elements for a kernel that runs where they are (the typed ops of tessel/ops, which
  // call the device's kernel table inside a DeviceScope, and the optimizers): data<T>() on the
  // host, device_data<T>() on a device. Host loops never take it.
  template <typename T>
  T* kernel_data() const {
    return typed<T>("kernel_data");
  }

  // A view of numel(shape) elements starting at element `offset` of this tensor's storage range.
  Tensor view(int64_t offset, Shape shape) const;
  Tensor reshape(Shape shape) const;  // same numel; one dimension may be -1
  Tensor clone() const;
  // Converting copy on the same device (through f32 for float types on the host; between float
  // types on a device).
  Tensor to(DType dtype) const;
  // A copy on `device` (the explicit host <-> device transfer; a clone when already there).
  Tensor to_device(Device device) const;

  void zero_();
  void fill_(float value);            // f32 only
  void copy_from(const Tensor& src);  // same numel and dtype, from any device
  Storage& storage() const { return *storage_; }

 private:
  template <typename T>
  T* typed(const char* accessor) const {
    TESSEL_CHECK(storage_ != nullptr, "tensor: ", accessor, "<", dtype_name(dtype_of<T>()),
                 "> of an undefined tensor (e.g. a parameter of a released ZeRO-3 unit)");
    TESSEL_CHECK(dtype_of<T>() == dtype_, "tensor: ", accessor, "<", dtype_name(dtype_of<T>()),
                 "> on a ", dtype_name(dtype_), " tensor");
    return static_cast<T*>(raw());
  }
  // Throws the pointer contract's error for data<T>() of a device tensor or device_data<T>()
  // of a host one.
  [[noreturn]] void throw_device_pointer(DType type, const char* accessor) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage_
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

}  // namespace tessel
