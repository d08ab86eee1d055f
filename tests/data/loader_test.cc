// DataLoader: the epoch order, batch coverage, rank slices, prefetch equivalence, resume,
// random access, and errors from the prefetch thread.
#include "tessel/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

namespace tessel::data {
namespace {

constexpr int64_t kFeatures = 3;

// Sample i is x = [i, 2i, 3i], y = i, so every row says which sample it is. Throws IoError for
// index `bad` to test error propagation.
class IndexDataset final : public Dataset {
 public:
  explicit IndexDataset(int64_t size, int64_t bad = -1) : size_(size), bad_(bad) {}
  std::string name() const override { return "index"; }
  int64_t size() const override { return size_; }
  Shape input_shape() const override { return {kFeatures}; }
  DType input_dtype() const override { return DType::kF32; }
  Shape label_shape() const override { return {}; }
  int64_t num_classes() const override { return size_; }
  void get(int64_t index, void* x, int32_t* y) const override {
    if (index == bad_) throw IoError(str("index dataset: sample ", index, " is unreadable"));
    float* f = static_cast<float*>(x);
    for (int k = 0; k < kFeatures; ++k) f[k] = static_cast<float>(index * (k + 1));
    *y = static_cast<int32_t>(index);
  }

 private:
  int64_t size_;
  int64_t bad_;
};

// The sample ids of a batch, checking that x agrees with y row by row.
std::vector<int32_t> ids(const Batch& b) {
  const int64_t n = b.y.numel();
  EXPECT_EQ(b.x.shape(), (Shape{n, kFeatures}));
  std::vector<int32_t> out(b.y.data<int32_t>(), b.y.data<int32_t>() + n);
  const float* x = b.x.data<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int k = 0; k < kFeatures; ++k) EXPECT_EQ(x[r * kFeatures + k], out[r] * (k + 1.0f));
  return out;
}

std::vector<Batch> epoch_batches(DataLoader& loader, int64_t epoch, int64_t first = 0) {
  loader.start_epoch(epoch, first);
  std::vector<Batch> out;
  Batch b;
  while (loader.next(b)) out.push_back(b);
  return out;
}

std::shared_ptr<const Dataset> index_dataset(int64_t size, int64_t bad = -1) {
  return std::make_shared<IndexDataset>(size, bad);
}

TEST(EpochOrder, PermutationPerEpochPureInSeed) {
  auto o0 = epoch_order(1000, 7, 0, true);
  auto o1 = epoch_order(1000, 7, 1, true);
  std::vector<int64_t> iota(1000);
  std::iota(iota.begin(), iota.end(), 0);
  for (const auto* o : {&o0, &o1}) {
    auto sorted = *o;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, iota);
    EXPECT_NE(*o, iota);
  }
  EXPECT_NE(o0, o1);
  EXPECT_EQ(epoch_order(1000, 7, 1, true), o1);
  EXPECT_NE(epoch_order(1000, 8, 1, true), o1);
  EXPECT_EQ(epoch_order(1000, 7, 1, false), iota);
  EXPECT_TRUE(epoch_order(0, 7, 0, true).empty());
  EXPECT_EQ(epoch_order(1, 7, 0, true), std::vector<int64_t>{0});
  // Every position is reachable: element 0 lands in many places across epochs.
  std::set<int64_t> where;
  for (int e = 0; e < 50; ++e) {
    auto o = epoch_order(10, 3, e, true);
    where.insert(std::find(o.begin(), o.end(), 0) - o.begin());
  }
  EXPECT_EQ(where.size(), 10u);
}

TEST(Loader, BatchesCoverEpochOnce) {
  for (bool drop_last : {false, true}) {
    LoaderOptions opt;
    opt.batch = 4;
    opt.seed = 11;
    opt.drop_last = drop_last;
    DataLoader loader(index_dataset(10), opt);
    EXPECT_EQ(loader.batches_per_epoch(), drop_last ? 2 : 3);
    auto batches = epoch_batches(loader, 3);
    ASSERT_EQ(static_cast<int64_t>(batches.size()), loader.batches_per_epoch());
    const auto order = epoch_order(10, 11, 3, true);
    std::vector<int32_t> seen;
    for (size_t b = 0; b < batches.size(); ++b) {
      EXPECT_EQ(batches[b].epoch, 3);
      EXPECT_EQ(batches[b].index, static_cast<int64_t>(b));
      EXPECT_EQ(batches[b].first_sample, static_cast<int64_t>(4 * b));
      EXPECT_EQ(batches[b].global_size, b == 2 ? 2 : 4);
      for (int32_t id : ids(batches[b])) seen.push_back(id);
    }
    ASSERT_EQ(seen.size(), drop_last ? 8u : 10u);
    for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], order[i]);
    std::set<int32_t> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), seen.size());
  }
}

TEST(Loader, RankSlicesConcatenateToGlobalBatch) {
  LoaderOptions opt;
  opt.batch = 5;
  opt.seed = 4;
  DataLoader whole(index_dataset(13), opt);  // batches of 5, 5, 3
  auto global = epoch_batches(whole, 2);
  ASSERT_EQ(global.size(), 3u);
  for (int n = 1; n <= 4; ++n) {
    std::vector<std::vector<int32_t>> joined(global.size());
    for (int r = 0; r < n; ++r) {
      LoaderOptions o = opt;
      o.slice_rank = r;
      o.slice_count = n;
      DataLoader loader(index_dataset(13), o);
      auto mine = epoch_batches(loader, 2);
      ASSERT_EQ(mine.size(), global.size());
      for (size_t b = 0; b < mine.size(); ++b) {
        const int64_t len = global[b].global_size;
        EXPECT_EQ(mine[b].global_size, len);
        EXPECT_EQ(mine[b].first_sample, global[b].first_sample + r * len / n);
        EXPECT_EQ(mine[b].y.numel(), (r + 1) * len / n - r * len / n);
        for (int32_t id : ids(mine[b])) joined[b].push_back(id);
      }
    }
    for (size_t b = 0; b < global.size(); ++b)
      EXPECT_EQ(joined[b], ids(global[b])) << n << " " << b;
  }
}

TEST(Loader, PrefetchDoesNotChangeBatches) {
  LoaderOptions sync;
  sync.batch = 7;
  sync.seed = 9;
  sync.prefetch = 0;
  LoaderOptions async = sync;
  async.prefetch = 2;
  DataLoader a(index_dataset(100), sync), b(index_dataset(100), async);
  for (int64_t e = 0; e < 3; ++e) {
    auto x = epoch_batches(a, e), y = epoch_batches(b, e);
    ASSERT_EQ(x.size(), 15u);
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(ids(x[i]), ids(y[i]));
      EXPECT_EQ(x[i].index, y[i].index);
      EXPECT_EQ(x[i].first_sample, y[i].first_sample);
    }
  }
}

TEST(Loader, ResumeMidEpochMatches) {
  for (int prefetch : {0, 1, 3}) {
    LoaderOptions opt;
    opt.batch = 6;
    opt.seed = 5;
    opt.prefetch = prefetch;
    DataLoader full(index_dataset(50), opt), resumed(index_dataset(50), opt);
    auto all = epoch_batches(full, 4);
    // Consume part of another epoch first: start_epoch must discard it.
    resumed.start_epoch(1);
    Batch b;
    ASSERT_TRUE(resumed.next(b));
    auto tail = epoch_batches(resumed, 4, 3);
    ASSERT_EQ(tail.size(), all.size() - 3);
    for (size_t i = 0; i < tail.size(); ++i) {
      EXPECT_EQ(tail[i].index, all[i + 3].index);
      EXPECT_EQ(ids(tail[i]), ids(all[i + 3]));
    }
    EXPECT_TRUE(epoch_batches(resumed, 4, resumed.batches_per_epoch()).empty());
  }
}

TEST(Loader, BatchAtMatchesNextInAnyOrder) {
  LoaderOptions opt;
  opt.batch = 8;
  opt.seed = 3;
  opt.prefetch = 2;
  DataLoader seq(index_dataset(61), opt), random(index_dataset(61), opt);
  for (int64_t e : {2, 0}) {
    auto all = epoch_batches(seq, e);
    ASSERT_EQ(all.size(), 8u);
    for (int64_t i : {7, 0, 3, 3, 6, 1, 2, 4, 5}) {  // out of order, the short last one first
      Batch b = random.batch_at(e, i);
      EXPECT_EQ(b.index, i);
      EXPECT_EQ(b.epoch, e);
      EXPECT_EQ(b.first_sample, all[static_cast<size_t>(i)].first_sample);
      EXPECT_EQ(b.global_size, all[static_cast<size_t>(i)].global_size);
      EXPECT_EQ(ids(b), ids(all[static_cast<size_t>(i)]));
    }
  }
  EXPECT_THROW(random.batch_at(0, 8), InvalidArgument);
  EXPECT_THROW(random.batch_at(-1, 0), InvalidArgument);
}

TEST(Loader, NextWithoutStartEpochReadsEpochZero) {
  LoaderOptions opt;
  opt.batch = 4;
  DataLoader a(index_dataset(8), opt), b(index_dataset(8), opt);
  Batch x;
  ASSERT_TRUE(a.next(x));
  auto y = epoch_batches(b, 0);
  EXPECT_EQ(x.epoch, 0);
  EXPECT_EQ(ids(x), ids(y[0]));
}

TEST(Loader, WorkerErrorSurfacesFromNext) {
  for (int prefetch : {0, 2}) {
    LoaderOptions opt;
    opt.batch = 2;
    opt.shuffle = false;
    opt.prefetch = prefetch;
    DataLoader loader(index_dataset(10, /*bad=*/5), opt);
    loader.start_epoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));  // samples 0, 1
    ASSERT_TRUE(loader.next(b));  // samples 2, 3
    try {
      loader.next(b);  // samples 4, 5
      FAIL() << "expected IoError";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("sample 5"), std::string::npos) << e.what();
    }
    // A fresh epoch clears the error and can still read the good batches.
    loader.start_epoch(1);
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(ids(b), (std::vector<int32_t>{0, 1}));
  }
}

TEST(Loader, DestroyWithFullQueueAndRestartQuickly) {
  LoaderOptions opt;
  opt.batch = 1;
  opt.prefetch = 1;
  auto loader = std::make_unique<DataLoader>(index_dataset(1000), opt);
  for (int e = 0; e < 20; ++e) loader->start_epoch(e);  // each stops the previous worker
  Batch b;
  ASSERT_TRUE(loader->next(b));
  EXPECT_EQ(b.epoch, 19);
  loader.reset();  // the worker is blocked on a full queue; must not hang
}

TEST(Loader, TextLikeTokensKeepTheirShapes) {
  // i32 inputs and per-token labels flow through unchanged.
  class Tokens final : public Dataset {
   public:
    std::string name() const override { return "tokens"; }
    int64_t size() const override { return 5; }
    Shape input_shape() const override { return {4}; }
    DType input_dtype() const override { return DType::kI32; }
    Shape label_shape() const override { return {4}; }
    int64_t num_classes() const override { return 100; }
    void get(int64_t i, void* x, int32_t* y) const override {
      for (int t = 0; t < 4; ++t) {
        static_cast<int32_t*>(x)[t] = static_cast<int32_t>(i * 10 + t);
        y[t] = static_cast<int32_t>(i * 10 + t + 1);
      }
    }
  };
  LoaderOptions opt;
  opt.batch = 2;
  opt.shuffle = false;
  DataLoader loader(std::make_shared<Tokens>(), opt);
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_TRUE(loader.next(b));
  EXPECT_EQ(b.x.shape(), (Shape{2, 4}));
  EXPECT_EQ(b.x.dtype(), DType::kI32);
  EXPECT_EQ(b.y.shape(), (Shape{2, 4}));
  EXPECT_EQ(b.x.data<int32_t>()[5], 31);
  EXPECT_EQ(b.y.data<int32_t>()[5], 32);
}

TEST(Loader, RejectsBadOptions) {
  LoaderOptions opt;
  opt.batch = 0;
  EXPECT_THROW(DataLoader(index_dataset(4), opt), InvalidArgument);
  opt = {};
  opt.slice_rank = 2;
  opt.slice_count = 2;
  EXPECT_THROW(DataLoader(index_dataset(4), opt), InvalidArgument);
  opt = {};
  opt.prefetch = -1;
  EXPECT_THROW(DataLoader(index_dataset(4), opt), InvalidArgument);
  EXPECT_THROW(DataLoader(nullptr, LoaderOptions{}), InvalidArgument);
  DataLoader ok(index_dataset(4), LoaderOptions{});
  EXPECT_THROW(ok.start_epoch(0, 2), InvalidArgument);  // one batch per epoch
  EXPECT_THROW(ok.start_epoch(-1), InvalidArgument);
}

}  // namespace
}  // namespace tessel::data
