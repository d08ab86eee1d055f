// Private to ops, the AVX-512 translation units only: the register-blocked tiles of the direct
// convolution (conv_tiles.cc; conv_direct.cc stages each image and calls them), and the prefetcher
// that streams the next image in between tiles.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "conv_impl.h"
#include "simd_avx512.h"

namespace tessel::ops::avx512 {

using detail::kDirectMaxKW;

constexpr int kLanes = 16;  // floats per zmm

// Pulls the next image's operands toward L2 while this image computes from cache (a batch of
// activations outgrows L2, and often L3), a few cache lines between tiles: hundreds of
// prefetches in one burst would overflow the misses the core keeps in flight, and most would
// be dropped. Lines for writing are fetched the same way (AMD has no L2 prefetch-for-write),
// which spares the stores a read-for-ownership stall.
class Prefetcher {
 public:
  // The next image's ranges; `steps`: how many step() calls the image will make.
  void start(std::initializer_list<std::pair<const float*, int64_t>> ranges, int64_t steps) {
    n_ = 0;
    int64_t lines = 0;
    for (const auto& [p, floats] : ranges) {
      if (p == nullptr || floats <= 0 || n_ == kRanges) continue;
      const char* c = reinterpret_cast<const char*>(p);
      r_[n_++] = {c, c + floats * int64_t{sizeof(float)}};
      lines += (floats * int64_t{sizeof(float)} + 63) / 64;
    }
    cur_ = 0;
    per_step_ = std::max<int64_t>(1, (lines + steps - 1) / std::max<int64_t>(steps, 1));
  }
  void step() {
    for (int64_t i = 0; i < per_step_ && cur_ < n_; ++i) {
      _mm_prefetch(r_[cur_].p, _MM_HINT_T1);
      r_[cur_].p += 64;
      if (r_[cur_].p >= r_[cur_].end) ++cur_;
    }
  }
  // Whatever is left (an image with fewer steps than planned).
  void finish() {
    while (cur_ < n_) step();
  }

 private:
  static constexpr int kRanges = 4;
  struct Range {
    const char *p, *end;
  };
  Range r_[kRanges] = {};
  int n_ = 0, cur_ = 0;
  int64_t per_step_ = 1;
};

// One lane block's forward (or input-gradient) work over one image: the block's output
// channels (or the input channels, for the input gradient) in v zmm per position.
struct RowsJob {
  const float* in;  // padded input: channel c, row r, column q at in[c * plane + r * ld + q]
  int64_t plane, ld, C, KH, KW;
  const float* wp;    // the block's packed weights [C * KH * KW][v * 16]
  const float* bias;  // the block's bias [count], or null
  bool relu;
  float* out;  // block channel l, position (oh, ow) at out[l * out_plane + oh * OW + ow]
  int64_t out_plane, OW;
  int count;
  Prefetcher* prefetch;  // stepped after each tile, or null
};

// Runs every tile of the OH x j.OW output of a lane block of v zmm (v = 1: up to 16 channels,
// 2: up to 32), stepping j.prefetch after each tile.
void conv_rows(const RowsJob& j, int v, int64_t OH);
// How many tiles conv_rows runs for that output.
int64_t conv_rows_tiles(int v, int64_t OW, int64_t OH);

// One lane block of output channels over one image.
struct DwJob {
  const float* in;  // padded input, as RowsJob::in
  int64_t plane, ld, KH, OH, OW;
  const float* dyt;  // dyT at the block's first channel: position p's channels at dyt + p * ldd
  int64_t ldd;
  float* dwt;  // dwT at the block's first channel: tap t's channels at dwt + t * ldd
};

// Adds one image's weight gradient for tap rows [0, tap_rows) (a tap row is (c, kh)) of a lane
// block of v zmm into j.dwt, stepping pf (if not null) after each tile.
void conv_dw(const DwJob& j, int v, int64_t KW, int64_t tap_rows, Prefetcher* pf);
// How many tiles conv_dw runs.
int64_t conv_dw_tiles(int v, int64_t KW, int64_t tap_rows);

}  // namespace tessel::ops::avx512
