// The serve batcher: every request gets its own rows and none is split, a full queue refuses and
// close() answers what was queued, and what waits is shared among the idle workers.
#include "tessel/infer/batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "tessel/core/clock.h"
#include "tessel/infer/metrics.h"

namespace tessel::infer {
namespace {

// A request's answer as a future of its rows' first values (invalid when the batcher refused
// the request).
std::future<std::vector<float>> submit(Batcher& b, Request r) {
  auto reply = std::make_shared<std::promise<std::vector<float>>>();
  auto future = reply->get_future();
  if (!b.submit(std::move(r), [reply](const BatchRows& rows, std::exception_ptr error) {
        if (error) return reply->set_exception(error);
        std::vector<float> got;
        for (int64_t i = 0; i < rows.count; ++i) got.push_back(rows.values(i)[0]);
        reply->set_value(got);
      }))
    return {};
  return future;
}

// A batch's outputs: each row's value, one column.
BatchOutput echo(const std::vector<const Request*>& batch) {
  int64_t rows = 0;
  for (const Request* r : batch) rows += r->rows();
  BatchOutput out{Tensor::empty({rows, 1}), {}};
  int64_t at = 0;
  for (const Request* r : batch)
    for (int64_t i = 0; i < r->rows(); ++i) out.values.data<float>()[at++] = r->x.data<float>()[i];
  return out;
}

TEST(Batcher, EveryRequestGetsItsOwnRowsAndNoneIsSplit) {
  ServeMetrics metrics(8, 2);
  std::atomic<int> batches{0};
  std::atomic<bool> split{false};
  // Each row's record is its value; a batch checks it holds whole requests only.
  Batcher b(
      {8, 0.005, 1000}, 2,
      [&](int, const std::vector<const Request*>& batch) {
        ++batches;
        int64_t rows = 0;
        for (const Request* r : batch) rows += r->rows();
        split = split || rows > 8;
        return echo(batch);
      },
      metrics);
  std::vector<std::future<std::vector<float>>> replies;
  for (int i = 0; i < 60; ++i) {
    Request r;
    const int64_t n = 1 + i % 3;
    r.x = Tensor::empty({n, 1});
    for (int64_t j = 0; j < n; ++j) r.x.data<float>()[j] = static_cast<float>(100 * i + j);
    replies.push_back(submit(b, std::move(r)));
  }
  for (int i = 0; i < 60; ++i) {
    auto out = replies[i].get();
    ASSERT_EQ(out.size(), static_cast<size_t>(1 + i % 3));
    for (size_t j = 0; j < out.size(); ++j) EXPECT_EQ(out[j], 100.0f * i + j);
  }
  EXPECT_FALSE(split);
  EXPECT_LT(batches, 60);  // requests were batched together
  b.close();
  Request late;
  late.x = Tensor::empty({1, 1});
  EXPECT_FALSE(submit(b, std::move(late)).valid());  // closed
  EXPECT_NE(metrics.prometheus().find("tessel_batch_rows_count"), std::string::npos);
}

TEST(Batcher, AFullQueueRefusesAndCloseAnswersWhatWasQueued) {
  ServeMetrics metrics(4, 1);
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  Batcher b(
      {4, 0.0, 4}, 1,
      [go](int, const std::vector<const Request*>& batch) {
        go.wait();
        return echo(batch);
      },
      metrics);
  auto make = [](int64_t n) {
    Request r;
    r.x = Tensor::zeros({n, 1});
    return r;
  };
  auto first = submit(b, make(4));  // taken by the worker, which waits
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto queued = submit(b, make(4));  // fills the queue
  EXPECT_TRUE(queued.valid());
  EXPECT_FALSE(submit(b, make(1)).valid());  // over serve.max_queue
  std::thread closer([&] { b.close(); });
  release.set_value();
  closer.join();
  EXPECT_EQ(first.get().size(), 4u);
  EXPECT_EQ(queued.get().size(), 4u);
}

// 64 one-row requests wait and both workers are idle: each takes half at once, and the two
// batches run side by side (each waits for the other to start), long before max_wait.
TEST(Batcher, IdleWorkersShareWhatWaits) {
  ServeMetrics metrics(64, 2);
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  std::vector<int64_t> sizes;
  bool side_by_side = true;
  Batcher b(
      {64, 2.0, 1000}, 2,
      [&](int, const std::vector<const Request*>& batch) {
        std::unique_lock lock(mu);
        sizes.push_back(static_cast<int64_t>(batch.size()));
        ++running;
        cv.notify_all();
        side_by_side = cv.wait_for(lock, std::chrono::seconds(5), [&] { return running >= 2; }) &&
                       side_by_side;
        return echo(batch);
      },
      metrics);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both workers wait
  const double t0 = now_seconds();
  std::vector<std::future<std::vector<float>>> replies;
  for (int i = 0; i < 64; ++i) {
    Request r;
    r.x = Tensor::zeros({1, 1});
    replies.push_back(submit(b, std::move(r)));
  }
  for (auto& f : replies) EXPECT_EQ(f.get().size(), 1u);
  EXPECT_LT(now_seconds() - t0, 1.0);  // nobody waited out max_wait (2 s)
  EXPECT_EQ(sizes, (std::vector<int64_t>{32, 32}));
  EXPECT_TRUE(side_by_side);
}

}  // namespace
}  // namespace tessel::infer
