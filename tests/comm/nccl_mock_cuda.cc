#include "nccl_mock_cuda.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "fake_device.h"
#include "tessel/core/error.h"

namespace tessel::comm::testing::mock {
namespace {

// A stream: one worker thread running its queue in order. Destroying it drains the queue.
class Stream {
 public:
  Stream() : worker_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }
  void push(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread worker_;
};

struct Event {
  std::atomic<uint64_t> recorded{0}, reached{0};
  bool destroyed = false;
};

struct Runtime {  // the mock CUDA runtime's global state
  std::mutex mu;
  std::vector<std::unique_ptr<Event>> events;  // kept until reset: dead handles stay detectable
  int streams = 0;
};
Runtime& rt() {
  static Runtime r;
  return r;
}

Stream* stream_of(NcclStream s) { return static_cast<Stream*>(s); }
Event* event_of(NcclEvent e) { return static_cast<Event*>(e); }

}  // namespace

void stream_push(NcclStream stream, std::function<void()> task) {
  stream_of(stream)->push(std::move(task));
}

int live_streams() {
  std::lock_guard<std::mutex> lock(rt().mu);
  return rt().streams;
}

void forget_events() {
  std::lock_guard<std::mutex> lock(rt().mu);
  rt().events.clear();
}

void fill_cuda_slots(NcclApi& api) {
  api.device_count = [](int* count) {
    *count = fakes::fake_gpu_count();
    return 0;
  };
  api.set_device = [](int device) {
    if (device < 0 || device >= fakes::fake_gpu_count()) {
      misuse(str("cudaSetDevice(", device, ") of a GPU the mock does not have"));
      return 101;  // cudaErrorInvalidDevice
    }
    fakes::set_fake_gpu(device);
    return 0;
  };
  api.stream_create = [](NcclStream* s) {
    *s = new Stream;
    std::lock_guard<std::mutex> lock(rt().mu);
    ++rt().streams;
    return 0;
  };
  api.stream_wait_event = [](NcclStream s, NcclEvent e) {
    const uint64_t v = event_of(e)->recorded;  // the record before this call
    stream_of(s)->push([ev = event_of(e), v] {
      while (ev->reached < v) std::this_thread::yield();
    });
    return 0;
  };
  api.stream_destroy = [](NcclStream s) {
    delete stream_of(s);
    std::lock_guard<std::mutex> lock(rt().mu);
    --rt().streams;
    return 0;
  };
  api.event_create = [](NcclEvent* e) {
    std::lock_guard<std::mutex> lock(rt().mu);
    rt().events.push_back(std::make_unique<Event>());
    *e = rt().events.back().get();
    return 0;
  };
  api.event_record = [](NcclEvent e, NcclStream s) {
    const uint64_t v = ++event_of(e)->recorded;
    if (s == nullptr) {  // the default stream: the callers' (fake) kernels ran already
      event_of(e)->reached = v;
      return 0;
    }
    stream_of(s)->push([ev = event_of(e), v] { ev->reached = v; });
    return 0;
  };
  api.event_query = [](NcclEvent e) {
    if (event_of(e)->destroyed) misuse("cudaEventQuery on a destroyed event");
    return event_of(e)->reached >= event_of(e)->recorded ? 0 : kCudaNotReady;
  };
  api.event_destroy = [](NcclEvent e) {
    event_of(e)->destroyed = true;
    return 0;
  };
  api.device_error_string = [](int) { return "mock cuda error"; };
}

}  // namespace tessel::comm::testing::mock
