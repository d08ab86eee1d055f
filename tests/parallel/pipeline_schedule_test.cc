// Pipeline schedules before they run: gpipe and 1f1b have the textbook shape, interleaved 1F1B
// is Megatron's order and zb-h1 PyTorch's ZB1P, check_schedule catches bad orders (deadlocks,
// lost or doubled tasks, W before B, too many activation sets held), and the measured bubble
// follows bubble_model with fixed-compute blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "pipeline_testing.h"
#include "tessel/comm/threads.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/engine.h"
#include "tessel/parallel/schedule.h"

namespace tessel {
namespace {

TEST(Pipeline, SchedulesHaveTheTextbookShape) {
  parallel::Partition part{{0, 1, 2, 3, 4}, {0, 1, 2, 3}};
  auto f = parallel::make_schedule(part, 4, 8, parallel::PpSchedule::k1f1b);
  // Stage 0: 4 forwards of warm-up, then one backward, one forward, ...
  std::string s0;
  for (const auto& t : f[0]) s0 += t.op == parallel::TaskOp::kForward ? 'F' : 'B';
  EXPECT_EQ(s0, "FFFFBFBFBFBFBBBB");
  std::string s3;
  for (const auto& t : f[3]) s3 += t.op == parallel::TaskOp::kForward ? 'F' : 'B';
  EXPECT_EQ(s3, "FBFBFBFBFBFBFBFB");
  auto g = parallel::make_schedule(part, 4, 8, parallel::PpSchedule::kGpipe);
  for (const auto& order : g) {
    std::string s;
    for (const auto& t : order) s += t.op == parallel::TaskOp::kForward ? 'F' : 'B';
    EXPECT_EQ(s, "FFFFFFFFBBBBBBBB");
  }
  EXPECT_NO_THROW(parallel::check_schedule(part, f, 8, -1, -1));
  EXPECT_NO_THROW(parallel::check_schedule(part, g, 8, 3, 0));
}

TEST(Pipeline, InterleavedScheduleIsMegatrons) {
  // P = 2, v = 2, m = 4: stage 0 holds chunks 0 and 2, stage 1 chunks 1 and 3. Forwards in
  // groups of P micro-batches per chunk; stage 0 warms up with 2 (P - 1) + (v - 1) P = 4.
  parallel::Partition part{{0, 1, 2, 3, 4}, {0, 1, 0, 1}};
  auto s = parallel::make_schedule(part, 2, 4, parallel::PpSchedule::kInterleaved);
  EXPECT_EQ(parallel::order_str(part, 2, s[0]),
            "F0/0 F1/0 F0/2 F1/2 F2/0 B0/2 F3/0 B1/2 F2/2 B0/0 F3/2 B1/0 B2/2 B3/2 B2/0 B3/0");
  EXPECT_EQ(parallel::order_str(part, 2, s[1]),
            "F0/1 F1/1 F0/3 B0/3 F1/3 B1/3 F2/1 B0/1 F3/1 B1/1 F2/3 B2/3 F3/3 B3/3 B2/1 B3/1");
  // Every P, v and m that the schedule takes passes the check, with a tied table from the last
  // chunk to the first.
  for (int P = 2; P <= 6; ++P)
    for (int v = 2; v <= 3; ++v)
      for (int m = 1; m <= 3 * P; ++m) {
        parallel::Partition p;
        for (int c = 0; c <= P * v; ++c) p.begin.push_back(static_cast<size_t>(c));
        for (int c = 0; c < P * v; ++c) p.stage.push_back(c % P);
        if (m > P && m % P != 0) {
          EXPECT_THROW(parallel::make_schedule(p, P, m, parallel::PpSchedule::kInterleaved),
                       InvalidArgument);
          continue;
        }
        auto order = parallel::make_schedule(p, P, m, parallel::PpSchedule::kInterleaved);
        EXPECT_NO_THROW(parallel::check_schedule(p, order, m, P * v - 1, 0))
            << "P " << P << " v " << v << " m " << m;
        for (const auto& stage : order) EXPECT_EQ(stage.size(), static_cast<size_t>(2 * v * m));
      }
  // One chunk per stage is 1f1b's job.
  EXPECT_THROW(parallel::make_schedule(parallel::Partition{{0, 1, 2}, {0, 1}}, 2, 4,
                                       parallel::PpSchedule::kInterleaved),
               InvalidArgument);
}

TEST(Pipeline, ZbH1ScheduleIsPyTorchs) {
  parallel::Partition part{{0, 1, 2, 3, 4}, {0, 1, 2, 3}};
  const auto s = parallel::make_schedule(part, 4, 8, parallel::PpSchedule::kZbH1);
  // Stage s: 1f1b's 3 - s warm-up forwards, then F B with the W held back by s micro-batches.
  EXPECT_EQ(parallel::order_str(part, 4, s[0]),
            "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7");
  EXPECT_EQ(parallel::order_str(part, 4, s[3]),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7");
  const auto bound = parallel::inflight_bound(part, 4, 8, parallel::PpSchedule::kZbH1);
  EXPECT_EQ(bound, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_NO_THROW(parallel::check_schedule(part, s, 8, 3, 0, bound));
  EXPECT_EQ(parallel::inflight_bound(part, 4, 8, parallel::PpSchedule::k1f1b),
            (std::vector<int>{4, 3, 2, 1}));
  EXPECT_NO_THROW(parallel::check_schedule(
      part, parallel::make_schedule(part, 4, 8, parallel::PpSchedule::k1f1b), 8, 3, 0,
      parallel::inflight_bound(part, 4, 8, parallel::PpSchedule::k1f1b)));
  // Fewer micro-batches than stages, and the bubble model: (P-1)/(3m+P-1) for m >= P.
  EXPECT_NO_THROW(parallel::check_schedule(
      part, parallel::make_schedule(part, 4, 2, parallel::PpSchedule::kZbH1), 2, 3, 0,
      parallel::inflight_bound(part, 4, 2, parallel::PpSchedule::kZbH1)));
  EXPECT_DOUBLE_EQ(parallel::bubble_model(parallel::PpSchedule::kZbH1, 4, 8, 1), 3.0 / 27);
  EXPECT_DOUBLE_EQ(parallel::bubble_model(parallel::PpSchedule::kZbH1, 4, 2, 1), 5.0 / 11);
  auto expect_error = [&](std::vector<std::vector<parallel::Task>> bad, const std::string& what) {
    try {
      parallel::check_schedule(part, bad, 8, 3, 0, bound);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // All of stage 3's Ws at the end: 8 micro-batches hold activations there.
  auto late = s;
  std::stable_partition(late[3].begin(), late[3].end(),
                        [](const parallel::Task& t) { return t.op != parallel::TaskOp::kWeight; });
  expect_error(late, "stage 3 holds 5 activation sets after the forward of chunk 3 micro-batch 4");
  auto early = s;
  // Stage 1: F0 F1 F2 B0 F3 B1 W0 ... with W0 moved before B0.
  std::rotate(early[1].begin() + 3, early[1].begin() + 6, early[1].begin() + 7);
  expect_error(early, "stage 1 runs the weight gradient of chunk 1 micro-batch 0 before its");
  auto lost = s;
  lost[2].pop_back();
  expect_error(lost, "not the 96 of 4 chunks x 8 micro-batches");
  EXPECT_THROW(parallel::make_schedule(parallel::Partition{{0, 1, 2}, {0, 0}}, 2, 4,
                                       parallel::PpSchedule::kZbH1),
               InvalidArgument);
}

TEST(Pipeline, BadSchedulesAreCaughtBeforeTheyRun) {
  parallel::Partition part{{0, 1, 2}, {0, 1}};
  auto s = parallel::make_schedule(part, 2, 2, parallel::PpSchedule::kGpipe);
  auto expect_error = [&](std::vector<std::vector<parallel::Task>> bad, const std::string& what) {
    try {
      parallel::check_schedule(part, bad, 2, -1, -1);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  // Stage 1 runs its backward of micro-batch 0 before the forward of micro-batch 1 arrives,
  // but stage 0 waits for that backward's gradient first: a deadlock.
  auto dead = s;
  dead[0] = {{parallel::TaskOp::kForward, 0, 0},
             {parallel::TaskOp::kBackward, 0, 0},
             {parallel::TaskOp::kForward, 0, 1},
             {parallel::TaskOp::kBackward, 0, 1}};
  dead[1] = {{parallel::TaskOp::kForward, 1, 1},
             {parallel::TaskOp::kForward, 1, 0},
             {parallel::TaskOp::kBackward, 1, 0},
             {parallel::TaskOp::kBackward, 1, 1}};
  expect_error(dead, "different order");
  // Orders that pair up but wait on each other: stage 0 wants a gradient before sending the
  // activation stage 1 is waiting for.
  auto cycle = s;
  cycle[0] = {{parallel::TaskOp::kForward, 0, 0},
              {parallel::TaskOp::kBackward, 0, 0},
              {parallel::TaskOp::kForward, 0, 1},
              {parallel::TaskOp::kBackward, 0, 1}};
  expect_error(cycle, "deadlocks: stage 0 waits for the activation gradient of micro-batch 0");
  auto lost = s;
  lost[1].pop_back();  // the gradient of micro-batch 1 is never sent
  expect_error(lost, "no stage sends");
  auto twice = s;
  twice[0].push_back(twice[0].front());
  expect_error(twice, "twice");
}

TEST(Pipeline, BubbleFollowsTheModelWithFixedComputeBlocks) {
  // Loose bounds (a busy machine delays the sleeping stages); bench/pipeline_bubble measures
  // the full grid. Interleaved: v = 2 chunks per stage, each half a stage's compute; zb-h1:
  // backwards split into B and W of one forward's time each.
  const int P = 2, m = 4;
  using parallel::PpSchedule;
  for (PpSchedule schedule : {PpSchedule::k1f1b, PpSchedule::kInterleaved, PpSchedule::kZbH1}) {
    const int v = schedule == PpSchedule::kInterleaved ? 2 : 1;
    double measured = 0;
    comm::run_threads(P, [&](comm::Communicator& c) {
      auto model = testing::sleep_model(P * v, 8.0 / v);
      parallel::ParallelSpec spec;
      spec.pp_stages = P;
      spec.pp_microbatches = m;
      spec.pp_schedule = schedule;
      spec.pp_virtual_stages = v;
      parallel::Engine engine(spec, optim::OptimSpec{}, c, std::move(model), 1);
      Tensor x = Tensor::zeros({8, 4});
      Tensor y = Tensor::zeros({8}, DType::kI32);
      engine.start();
      for (int step = 0; step < 4; ++step) {
        if (step == 1) engine.take_stats(0);  // the first step allocates the caches
        engine.train_piece({x, y, nn::Context{true, 1, step, 0}, 1.0, true});
        engine.step(0.1f, 0, step);
      }
      double bubble = 0;
      for (const parallel::RankStats& s : engine.take_stats(0))
        bubble += 1.0 - (s.forward_s + s.backward_s) / s.schedule_s;
      if (c.rank() == 0) measured = bubble / P;
    });
    EXPECT_NEAR(measured, parallel::bubble_model(schedule, P, m, v), 0.1) << name_of(schedule);
  }
}

}  // namespace
}  // namespace tessel
