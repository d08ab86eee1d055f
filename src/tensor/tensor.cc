#include "tessel/tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "tessel/tensor/device.h"

namespace tessel {
namespace {
constexpr size_t kAlignBytes = 64;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) [[unlikely]]
      throw InvalidArgument(str("tensor: shape ", shape_str(shape),
                                " has more elements than fit in 64 bits; use smaller sizes"));
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// The bytes a storage of `bytes` takes: whole alignment blocks, at least one (what the device
// runtime is asked to allocate and, the same, to free).
size_t rounded_bytes(size_t bytes) {
  const size_t rounded = (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
  return rounded == 0 ? kAlignBytes : rounded;
}

}  // namespace

void Storage::charge_current() {
  const size_t rounded = rounded_bytes(bytes_);
  const size_t charged =
      device_ == Device::kCpu ? rounded : device_runtime(device_).allocation_size(rounded);
  if (const auto& ledger = current_ledger()) {  // throws before allocating when over the limit
    ledger->charge(current_category(), static_cast<int64_t>(charged));
    ledger_ = ledger;
    category_ = current_category();
    charged_ = static_cast<int64_t>(charged);
  }
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  const size_t rounded = rounded_bytes(bytes);
  DeviceRuntime* runtime = device == Device::kCpu ? nullptr : &device_runtime(device);
  charge_current();
  if (runtime != nullptr) {
    try {
      data_ = runtime->allocate(rounded);
      runtime->zero(data_, rounded, current_stream());
    } catch (...) {
      free_own();
      throw;
    }
    return;
  }
  data_ = std::aligned_alloc(kAlignBytes, rounded);
  if (data_ == nullptr) {
    const MemCategory category = current_category();
    free_own();
    throw MemoryLimitError(str("memory: allocating ", bytes, " bytes of ",
                               mem_category_name(category),
                               " failed: this machine is out of memory; make the model or the "
                               "batch smaller, or spread them over more ranks (zero.stage, "
                               "pp.stages)"));
  }
  std::memset(data_, 0, rounded);
}

Storage::~Storage() {
  if (!keep_) free_own();
}

void Storage::free_own() noexcept {
  if (device_ == Device::kCpu)
    std::free(data_);
  else if (data_ != nullptr)
    device_runtime(device_).free(data_, rounded_bytes(bytes_));
  if (ledger_) ledger_->release(category_, charged_);
  ledger_.reset();
}

void Storage::rebind(void* data, std::shared_ptr<void> keep) {
  TESSEL_CHECK(data && keep && reinterpret_cast<uintptr_t>(data) % kAlignBytes == 0,
               "storage: rebind to a null, unowned or unaligned buffer");
  TESSEL_CHECK(device_ == Device::kCpu, "storage: rebind of ", name_of(device_),
               " memory (only host memory is shared between ranks)");
  if (!keep_) free_own();
  data_ = data;
  keep_ = std::move(keep);
}

std::unique_ptr<Storage> Storage::swap_out(void* host, void* stream) {
  TESSEL_CHECK(device_ != Device::kCpu && !keep_ && !swapped_out(),
               "storage: swap_out of host, shared or already swapped-out memory");
  device_runtime(device_).copy_async(host, Device::kCpu, data_, device_, bytes_, stream);
  std::unique_ptr<Storage> block(new Storage(bytes_, device_, Unallocated{}));
  std::swap(block->data_, data_);
  block->ledger_ = std::move(ledger_);
  block->category_ = category_;
  block->charged_ = charged_;
  return block;
}

void Storage::swap_in(const void* host, void* stream) {
  TESSEL_CHECK(swapped_out(), "storage: swap_in of memory that was not swapped out");
  DeviceRuntime& runtime = device_runtime(device_);
  charge_current();
  try {
    data_ = runtime.allocate(rounded_bytes(bytes_));
  } catch (...) {
    free_own();
    throw;
  }
  runtime.copy_async(data_, device_, host, Device::kCpu, bytes_, stream);
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) throw InvalidArgument(str("tensor: negative dimension in shape ", shape_str(shape)));
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(shape_numel(shape)), dtype_size(dtype), &bytes))
    throw InvalidArgument(str("tensor: shape ", shape_str(shape), " of ", dtype_name(dtype),
                              " has more bytes than fit in 64 bits; use smaller sizes"));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  return empty(std::move(shape), dtype, device);  // Storage is zero-filled
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  TESSEL_CHECK(j >= 0 && j < n, "tensor: dim ", i, " of shape ", shape_str(shape_));
  return shape_[j];
}

Tensor Tensor::view(int64_t offset, Shape shape) const {
  int64_t n = shape_numel(shape);
  TESSEL_CHECK(offset >= 0 && offset + n <= numel(), "tensor: view [", offset, ", ", offset + n,
               ") outside ", numel(), " elements");
  Tensor t = *this;
  t.offset_ = offset_ + static_cast<size_t>(offset) * dtype_size(dtype_);
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TESSEL_CHECK(infer < 0, "tensor: reshape with two -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0 && known > 0) shape[infer] = numel() / known;
  TESSEL_CHECK(shape_numel(shape) == numel(), "tensor: reshape ", shape_str(shape_), " to ",
               shape_str(shape));
  return view(0, std::move(shape));
}

void Tensor::throw_device_pointer(DType type, const char* accessor) const {
  if (device_ == Device::kCpu)
    throw Error(str("tensor: device_data<", dtype_name(type), ">() of a host tensor ",
                    shape_str(shape_),
                    ": device kernels read device memory only; copy it there "
                    "with to_device() or copy_from()"));
  throw Error(str("tensor: ", accessor, "<", dtype_name(type), ">() of a ", name_of(device_),
                  " tensor ", shape_str(shape_),
                  ": host code cannot read device memory; copy it to the host first "
                  "(to_device(Device::kCpu) or copy_from()), or pass device_data<T>() to a "
                  "device kernel"));
}

Tensor Tensor::clone() const { return to_device(device_); }

Tensor Tensor::to_device(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor out = empty(shape_, dtype, device_);
  if (device_ != Device::kCpu) {
    device_runtime(device_).convert(out.raw(), dtype, raw(), dtype_, numel(), current_stream());
    return out;
  }
  const int64_t n = numel();
  auto load = [&](int64_t i) -> double {
    const char* p = static_cast<const char*>(raw());
    switch (dtype_) {
      case DType::kF32:
        return reinterpret_cast<const float*>(p)[i];
      case DType::kF16:
        return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
      case DType::kBF16:
        return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
      case DType::kI32:
        return reinterpret_cast<const int32_t*>(p)[i];
      case DType::kI64:
        return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
      case DType::kU8:
        return reinterpret_cast<const uint8_t*>(p)[i];
    }
    return 0;
  };
  char* q = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < n; ++i) {
    double v = load(i);
    switch (dtype) {
      case DType::kF32:
        reinterpret_cast<float*>(q)[i] = static_cast<float>(v);
        break;
      case DType::kF16:
        reinterpret_cast<uint16_t*>(q)[i] = f32_to_f16(static_cast<float>(v));
        break;
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(q)[i] = f32_to_bf16(static_cast<float>(v));
        break;
      case DType::kI32:
        reinterpret_cast<int32_t*>(q)[i] = static_cast<int32_t>(v);
        break;
      case DType::kI64:
        reinterpret_cast<int64_t*>(q)[i] = static_cast<int64_t>(v);
        break;
      case DType::kU8:
        reinterpret_cast<uint8_t*>(q)[i] = static_cast<uint8_t>(v);
        break;
    }
  }
  return out;
}

void Tensor::zero_() {
  if (device_ == Device::kCpu)
    std::memset(raw(), 0, nbytes());
  else
    device_runtime(device_).zero(raw(), nbytes(), current_stream());
}

void Tensor::fill_(float value) {
  if (device_ != Device::kCpu) {  // through a host copy: one upload
    Tensor host = empty(shape_, dtype_);
    host.fill_(value);
    copy_from(host);
    return;
  }
  float* p = data<float>();
  for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
}

void Tensor::copy_from(const Tensor& src) {
  TESSEL_CHECK(src.numel() == numel() && src.dtype() == dtype_, "tensor: copy_from ",
               shape_str(src.shape()), " ", dtype_name(src.dtype()), " into ", shape_str(shape_),
               " ", dtype_name(dtype_));
  if (device_ == Device::kCpu && src.device() == Device::kCpu) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  const Device runtime = device_ == Device::kCpu ? src.device() : device_;
  device_runtime(runtime).copy(raw(), device_, src.raw(), src.device(), nbytes(), current_stream());
}

}  // namespace tessel
