// The CUDA runtime's caching pools (src/ops/cuda/device_pools.h) without a GPU: host memory
// stands in for 2 GPUs, each block tagged with the GPU current on the thread that allocated it,
// each GPU with room for a few blocks. A GPU's pool hands out only its own GPU's blocks; a
// block freed by a thread on another GPU goes back to the pool it came from; running out of
// room gives back that GPU's cache only, on that GPU; the counts are the current GPU's.
#include "device_pools.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "tessel/core/error.h"

namespace tessel::ops::cuda {
namespace {

constexpr int kGpus = 2;
constexpr size_t kSmall = 512, kLarge = 4096;  // two size classes

// The stand-in GPUs (the tests run on one thread: no lock).
thread_local int t_gpu = 0;
std::map<void*, std::pair<int, size_t>> g_blocks;  // each block's GPU and size
int64_t g_room[kGpus];                             // bytes each GPU can still hand out
int g_syncs[kGpus], g_released[kGpus];

const RawDevice kHostGpus = {
    .count = [] { return kGpus; },
    .current = [] { return t_gpu; },
    .allocate =
        [](size_t bytes, int64_t in_use, bool last_try) {
          if (g_room[t_gpu] < static_cast<int64_t>(bytes)) {
            if (last_try)
              throw std::runtime_error(
                  str("out of memory on GPU ", t_gpu, " with ", in_use, " bytes in use"));
            return static_cast<void*>(nullptr);
          }
          g_room[t_gpu] -= static_cast<int64_t>(bytes);
          void* p = std::malloc(bytes);
          g_blocks[p] = {t_gpu, bytes};
          return p;
        },
    .release =
        [](void* p) {
          EXPECT_EQ(g_blocks.at(p).first, t_gpu) << "a block freed with another GPU current";
          ++g_released[t_gpu];
          g_room[t_gpu] += static_cast<int64_t>(g_blocks.at(p).second);
          g_blocks.erase(p);
          std::free(p);
        },
    .synchronize = [] { ++g_syncs[t_gpu]; },
    .set_current = [](int device) { t_gpu = device; },
};

class DevicePoolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_gpu = 0;
    for (int d = 0; d < kGpus; ++d) g_room[d] = 3 * kLarge, g_syncs[d] = g_released[d] = 0;
  }

  void* allocate_on(int gpu, size_t bytes) {
    t_gpu = gpu;
    void* p = pools_.current().allocate(bytes);
    EXPECT_EQ(g_blocks.at(p).first, gpu) << "GPU " << gpu << " was handed another GPU's block";
    return p;
  }
  void free_on(int gpu, void* p, size_t bytes) {
    t_gpu = gpu;
    pools_.free(p, bytes);
  }
  PoolStats stats_of(int gpu) {
    t_gpu = gpu;
    return pools_.current().stats();
  }

  DevicePools pools_{kHostGpus};
};

TEST_F(DevicePoolsTest, EachGpuHandsOutOnlyItsOwnBlocks) {
  void* a = allocate_on(0, kSmall);
  free_on(0, a, kSmall);
  void* b = allocate_on(1, kSmall);  // GPU 0's cached block is not GPU 1's to take
  EXPECT_NE(b, a);
  EXPECT_EQ(allocate_on(0, kSmall), a);  // reused on its own GPU
  free_on(0, a, kSmall);
  free_on(1, b, kSmall);
}

TEST_F(DevicePoolsTest, ABlockFreedOnAnotherGpuGoesBackToItsOwnPool) {
  void* a = allocate_on(0, kLarge);
  EXPECT_EQ(stats_of(0).in_use, static_cast<int64_t>(kLarge));
  free_on(1, a, kLarge);  // a thread whose current GPU is 1 drops GPU 0's tensor
  EXPECT_EQ(stats_of(0).in_use, 0);
  EXPECT_EQ(stats_of(1).in_use, 0);
  EXPECT_EQ(stats_of(0).peak_in_use, static_cast<int64_t>(kLarge));
  EXPECT_EQ(stats_of(1).peak_in_use, 0);
  void* b = allocate_on(1, kLarge);
  EXPECT_NE(b, a);
  EXPECT_EQ(allocate_on(0, kLarge), a);
  EXPECT_EQ(stats_of(1).reserved, static_cast<int64_t>(kLarge));
  free_on(0, b, kLarge);
  free_on(1, a, kLarge);
}

// GPU 0 full with its cache: a request of another class gives back GPU 0's cached blocks (GPU 0
// current, its work waited for) and is served; GPU 1's cache stays. Without room even then, the
// error of the last try comes out.
TEST_F(DevicePoolsTest, RunningOutGivesBackThatGpusCacheOnly) {
  void* x0 = allocate_on(0, kLarge);
  void* y0 = allocate_on(0, kLarge);
  void* x1 = allocate_on(1, kLarge);
  free_on(0, x0, kLarge);
  free_on(1, x1, kLarge);
  void* z0 = allocate_on(0, 2 * kLarge);  // room for one kLarge only: x0 goes back first
  EXPECT_EQ(g_syncs[0], 1);
  EXPECT_EQ(g_released[0], 1);
  EXPECT_EQ(g_released[1], 0);
  EXPECT_EQ(stats_of(0).reserved, static_cast<int64_t>(3 * kLarge));
  EXPECT_EQ(allocate_on(1, kLarge), x1);  // GPU 1's cache kept
  t_gpu = 0;
  EXPECT_THROW(pools_.current().allocate(4 * kLarge), std::runtime_error);
  free_on(0, y0, kLarge);
  free_on(0, z0, 2 * kLarge);
  free_on(1, x1, kLarge);
}

// At exit each GPU's cache is freed with that GPU current (the stand-in checks it).
TEST_F(DevicePoolsTest, EveryCachedBlockIsFreedOnItsGpuAtExit) {
  {
    DevicePools pools(kHostGpus);
    t_gpu = 1;
    void* b = pools.current().allocate(kSmall);
    t_gpu = 0;
    void* a = pools.current().allocate(kSmall);
    pools.free(b, kSmall);
    pools.free(a, kSmall);
  }
  EXPECT_TRUE(g_blocks.empty());
  EXPECT_EQ(g_released[0], 1);
  EXPECT_EQ(g_released[1], 1);
}

}  // namespace
}  // namespace tessel::ops::cuda
