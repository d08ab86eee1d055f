#include <gtest/gtest.h>

#include <cstdlib>

#include <cmath>
#include <cstdint>

#include "tessel/tensor/tensor.h"

namespace tessel {
namespace {

TEST(Tensor, ZerosAlignedAndShaped) {
  Tensor t = Tensor::zeros({3, 5});
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_THROW(t.data<int32_t>(), Error);
}

TEST(Tensor, ViewsShareStorageCloneDoesNot) {
  Tensor t = Tensor::zeros({10});
  Tensor v = t.view(4, {2, 3});
  v.fill_(2.0f);
  EXPECT_EQ(t.data<float>()[3], 0.0f);
  EXPECT_EQ(t.data<float>()[4], 2.0f);
  EXPECT_EQ(t.data<float>()[9], 2.0f);
  Tensor c = t.clone();
  c.fill_(1.0f);
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  EXPECT_THROW(t.view(8, {3}), Error);
  EXPECT_EQ(t.reshape({2, -1}).dim(1), 5);
  EXPECT_THROW(t.reshape({3, -1}), Error);
}

TEST(Tensor, HalfConversionsRoundTrip) {
  Tensor t = Tensor::empty({6});
  float vals[6] = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f};
  for (int i = 0; i < 6; ++i) t.data<float>()[i] = vals[i];
  Tensor h = t.to(DType::kF16).to(DType::kF32);
  Tensor b = t.to(DType::kBF16).to(DType::kF32);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(h.data<float>()[i], vals[i], std::fabs(vals[i]) * 1e-3 + 6e-8) << i;
    EXPECT_NEAR(b.data<float>()[i], vals[i], std::fabs(vals[i]) * 8e-3 + 1e-30) << i;
  }
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e6f)), INFINITY);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  // Every finite f16 survives f16 -> f32 -> f16 exactly.
  for (uint32_t h16 = 0; h16 < 0x10000; ++h16) {
    if ((h16 & 0x7c00) == 0x7c00) continue;
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h16))), h16) << h16;
  }
}

TEST(Arena, EntriesAreAlignedViews) {
  Arena a;
  a.add("w", {3, 5});
  a.add("b", {5});
  EXPECT_THROW(a.view(0), Error);
  a.allocate();
  EXPECT_EQ(a.entries()[1].offset, 16);
  EXPECT_EQ(a.numel(), 32);
  Tensor b = a.view(1);
  b.fill_(1.0f);
  EXPECT_EQ(a.flat().data<float>()[16], 1.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) % 64, 0u);
  EXPECT_THROW(a.add("late", {1}), Error);
}

TEST(Arena, RebindMovesEveryViewToOtherMemory) {
  Arena a;
  a.add("w", {4});
  a.allocate();
  Tensor w = a.view(0);  // taken before the move: follows it
  w.fill_(2.0f);
  auto block = std::shared_ptr<void>(std::aligned_alloc(64, 64), std::free);
  a.rebind(block.get(), block, /*copy=*/true);
  EXPECT_EQ(w.raw(), block.get());
  EXPECT_EQ(static_cast<float*>(block.get())[3], 2.0f);
  static_cast<float*>(block.get())[1] = 5.0f;
  EXPECT_EQ(w.data<float>()[1], 5.0f);
  char unaligned[80];
  EXPECT_THROW(a.rebind(unaligned + 1, block, false), Error);
}

}  // namespace
}  // namespace tessel
