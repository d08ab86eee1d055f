// A stand-in CUDA device for tests on a host without a GPU. FakeRuntime keeps "device" memory
// in its own host blocks (poisoned when handed out, counted, each call's stream recorded), so
// the tensor side of the pointer contract is checked; FakeDevice adds a kernel table
// (tessel/ops/device_kernels.h) whose slots run the CPU kernels on those host blocks, each slot
// counting its calls and checking that every pointer it is given is the fake device's memory (a
// host buffer passed to a device kernel, a missed upload, fails the test). Install one per test
// (it installs itself for Device::kCuda and uninstalls in its destructor) from one thread; its
// runtime calls and slots may come from several (ranks as threads share the one fake device).
// It stands in for one GPU or several: each thread has a current GPU (set_fake_gpu, as
// cudaSetDevice; the mock NCCL's set_device calls it), each block belongs to the GPU current on
// the thread that allocated it, and every runtime call and kernel slot checks that the device
// memory it is given is on the calling thread's GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/ops/device_kernels.h"
#include "tessel/tensor/device.h"

namespace tessel::fakes {

class FakeRuntime : public DeviceRuntime {
 public:
  std::string unavailable_reason() const override { return ""; }
  size_t allocation_size(size_t bytes) const override { return (bytes + 1023) / 1024 * 1024; }
  void* allocate(size_t bytes) override;
  void free(void* p, size_t bytes) noexcept override;
  void zero(void* p, size_t bytes, void* stream) override;
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
            void* stream) override;
  // Any pair of float types (f32, bf16, f16), through ops::convert.
  void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
               void* stream) override;

  // Whether [p, p + bytes) lies in one block of this runtime.
  bool owns(const void* p, size_t bytes) const;
  // The GPU of the block holding p; -1 when p is in none.
  int gpu_of(const void* p) const;
  std::map<void*, int> gpus;  // each block's GPU

  std::map<void*, size_t> blocks;
  int64_t in_use = 0;
  int copies = 0;
  int64_t to_host_bytes = 0;  // copied from the device to the host
  std::vector<void*> streams;

  // Ranks as threads: every call above and below holds it (recursive: copy() asks owns()).
  mutable std::recursive_mutex mu;

  // ---- Overlap: pinned host blocks, lazy streams, events ----
  // Pinned memory is plain host memory, counted. copy_async on a stream this runtime created is
  // only queued: it runs when an event recorded after it is waited for (stream_wait) or
  // synchronised, so a missed wait leaves the destination unwritten (a kernel given such memory
  // fails its check), and freeing a block a queued copy still uses fails here. Work on any
  // other stream (the ranks' compute streams) runs at once.
  void* allocate_pinned(size_t bytes) override;
  void free_pinned(void* p, size_t bytes) noexcept override;
  void* create_stream() override;
  void destroy_stream(void* stream) noexcept override;
  void* create_event() override;
  void destroy_event(void* event) noexcept override;
  void record_event(void* event, void* stream) override;
  void stream_wait(void* stream, void* event) override;
  void event_synchronize(void* event) override;
  void copy_async(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                  void* stream) override;

  // Whether a queued copy that has not run reads or writes [p, p + bytes).
  bool pending(const void* p, size_t bytes) const;
  // A kernel ran (the fake device's slots call it) on the calling thread's stream: what tells a
  // copy that overlapped the kernels of the thread (the rank) that queued it.
  void count_kernel();

  std::map<void*, size_t> pinned;  // pinned blocks: where copy_async's host side must lie
  int64_t pinned_in_use = 0, pinned_peak = 0;
  std::vector<void*> async_streams;  // each copy_async's stream
  struct AsyncCopies {
    int queued = 0;
    int overlapped = 0;  // of them, those with a kernel run between their queueing and their run
    int64_t bytes = 0;   // what they move
  };
  AsyncCopies async_to_host, async_to_device;
  // Host waits (event_synchronize) that left copies queued behind their event on its stream:
  // the host went on while those were in flight.
  int waits_with_copies_behind = 0;

 private:
  struct Queued {
    void* dst;
    const void* src;
    size_t bytes;
    bool to_host;
    std::thread::id thread;                    // the thread that queued it
    int64_t kernels_before;                    // that thread's kernels_ when it was queued
    bool uses(const void* p, size_t n) const;  // whether it reads or writes [p, p + n)
  };
  struct Queue {
    std::vector<Queued> copies;
    size_t ran = 0;  // copies[0, ran) have run
  };
  struct Mark {
    void* stream = nullptr;  // null: reached
    size_t position = 0;     // reached once the stream's ran >= position
  };
  void run_until(const Mark& mark);
  bool cancel_pending(const void* p, size_t bytes);
  bool owns_pinned(const void* p, size_t bytes) const;

  std::map<void*, Queue> queues_;  // the streams this runtime created
  std::map<void*, Mark> events_;
  std::map<std::thread::id, int64_t> kernels_;  // kernels run by each thread
};

class FakeDevice {
 public:
  // Installs the runtime and the kernel table for Device::kCuda, standing in for `gpus` GPUs.
  explicit FakeDevice(int gpus = 1);
  ~FakeDevice();  // uninstalls both; every device block must have been freed by then
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  // How many times the slot of `op` (its field name in DeviceKernels) ran.
  int calls(const std::string& op) const;
  FakeRuntime& runtime() { return runtime_; }
  int gpu_count() const { return gpus_; }

 private:
  int gpus_;
  FakeRuntime runtime_;
  ops::DeviceKernels kernels_;
  std::map<std::string, int> calls_;
  friend struct FakeSlots;
};

// ---- Several GPUs: this thread's current one, as the CUDA runtime keeps it ----
void set_fake_gpu(int gpu);  // cudaSetDevice
int fake_gpu();              // cudaGetDevice: 0 until set on this thread
int fake_gpu_count();        // cudaGetDeviceCount: the installed FakeDevice's, 1 without one
// The GPU of the installed FakeDevice's block holding p; -1 when none holds it (host memory).
int fake_gpu_of(const void* p);

}  // namespace tessel::fakes
