// Continuous batching: every sequence gets the tokens generate() gives it alone, whatever joins
// or leaves beside it and however its prompt is chunked; the paged KV cache holds pages for the
// positions in flight only; stop and cancellation end a sequence and free its pages; a queued
// generation cancelled leaves at once, before its prefill.
#include "tessel/infer/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "tiny_gpt.h"

namespace tessel::infer {
namespace {

constexpr int64_t kVocab = 23, kContext = 48;

std::unique_ptr<nn::Model> tiny_gpt() { return testing::tiny_gpt(kVocab, kContext, 5); }

Prompt prompt(int64_t i) {
  Prompt p;
  for (int64_t t = 0; t < 1 + (7 * i) % 19; ++t)
    p.tokens.push_back(static_cast<int32_t>((3 * i + 5 * t) % kVocab));
  p.max_new_tokens = 4 + (5 * i) % 17;
  p.key = static_cast<uint64_t>(i);
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::string reason;
  std::promise<void> done;
};

// Submits a generation whose tokens and finish reason land in `out`.
void submit(Scheduler& s, const Prompt& p, const SampleOptions& opts, Outcome& out,
            int64_t stop_after = -1) {
  Generation g{p, opts, nullptr, nullptr, nullptr};
  g.on_token = [&out, stop_after](int32_t t) {
    out.tokens.push_back(t);
    return static_cast<int64_t>(out.tokens.size()) != stop_after;
  };
  g.on_done = [&out](const std::string& reason, std::exception_ptr) {
    out.reason = reason;
    out.done.set_value();
  };
  ASSERT_TRUE(s.submit(std::move(g)));
}

TEST(Scheduler, EverySequenceGetsTheTokensOfGeneratingItAlone) {
  auto model = tiny_gpt();
  for (float temperature : {0.0f, 0.9f}) {
    const SampleOptions opts{temperature, 0, 17, true};
    // Few rows per step: prompts are read in chunks beside other sequences' decodes.
    Scheduler s(*model, {6, 7, 64});
    std::vector<Outcome> out(14);
    for (int64_t i = 0; i < 14; ++i) {
      submit(s, prompt(i), opts, out[i]);
      if (i % 4 == 0) out[i].done.get_future().wait();  // later ones join a running batch
    }
    for (int64_t i = 0; i < 14; ++i) {
      if (i % 4 != 0) out[i].done.get_future().wait();
      EXPECT_EQ(out[i].reason, "length");
      EXPECT_EQ(out[i].tokens, generate(*model, {prompt(i)}, opts)[0])
          << "prompt " << i << " temperature " << temperature;
    }
    s.close();  // the last step's figures follow its callbacks
    const SchedulerStats st = s.stats();
    EXPECT_EQ(st.sequences, 0);
    EXPECT_EQ(st.kv_held, 0);  // every page back on the free list
    EXPECT_GT(st.kv_bytes, 0);
  }
}

TEST(Scheduler, StopAndCancelEndASequence) {
  auto model = tiny_gpt();
  Scheduler s(*model, {});
  Outcome stopped, cancelled;
  submit(s, prompt(3), {}, stopped, 2);
  stopped.done.get_future().wait();
  EXPECT_EQ(stopped.reason, "stop");
  EXPECT_EQ(stopped.tokens.size(), 2u);
  Generation g{prompt(4), {}, nullptr, nullptr, [] { return false; }};
  g.on_done = [&](const std::string& reason, std::exception_ptr) {
    cancelled.reason = reason;
    cancelled.done.set_value();
  };
  ASSERT_TRUE(s.submit(std::move(g)));
  cancelled.done.get_future().wait();
  EXPECT_EQ(cancelled.reason, "cancelled");
  s.close();  // the step's figures follow its callbacks
  EXPECT_EQ(s.stats().kv_held, 0);
}

// A generation cancelled while it waits for a place (the one place held by a long generation)
// leaves the queue before the next step, not when the place frees: its prompt never reaches the
// model, and the long one runs on to its end.
TEST(Scheduler, AQueuedGenerationCancelledLeavesAtOnceWithoutItsPrefill) {
  auto model = tiny_gpt();
  Scheduler s(*model, {1, 256, 8});
  Prompt long_prompt = prompt(2);
  long_prompt.max_new_tokens = 20;
  std::promise<void> go;
  std::shared_future<void> went = go.get_future().share();
  Outcome running, queued;
  Generation a{long_prompt, {}, nullptr, nullptr, nullptr};
  a.on_token = [&](int32_t t) {
    running.tokens.push_back(t);
    if (running.tokens.size() == 1) went.wait();  // holds the step until b waits, cancelled
    return true;
  };
  a.on_done = [&](const std::string& reason, std::exception_ptr) {
    running.reason = reason;
    running.done.set_value();
  };
  ASSERT_TRUE(s.submit(std::move(a)));
  std::atomic<bool> cancel{false};
  size_t tokens_then = 0;  // the running generation's when the queued one left
  Generation b{prompt(5), {}, nullptr, nullptr, [&] { return !cancel; }};
  b.on_done = [&](const std::string& reason, std::exception_ptr) {
    queued.reason = reason;
    tokens_then = running.tokens.size();
    queued.done.set_value();
  };
  ASSERT_TRUE(s.submit(std::move(b)));
  cancel = true;
  go.set_value();
  queued.done.get_future().wait();
  running.done.get_future().wait();
  EXPECT_EQ(queued.reason, "cancelled");
  EXPECT_LE(tokens_then, 1u) << "the queued generation left only when the place freed";
  EXPECT_EQ(running.reason, "length");
  EXPECT_EQ(running.tokens.size(), 20u);
  s.close();  // its last step's figures are in (they follow the step's callbacks)
  const SchedulerStats st = s.stats();
  EXPECT_EQ(st.prompt_tokens, static_cast<int64_t>(long_prompt.tokens.size()));
  EXPECT_EQ(st.cancelled, 1);
  EXPECT_EQ(st.cancelled_queued, 1);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.kv_held, 0);
}

TEST(Scheduler, RefusesPromptsPastTheContext) {
  auto model = tiny_gpt();
  Scheduler s(*model, {});
  Prompt p = prompt(1);
  p.max_new_tokens = kContext;
  EXPECT_THROW(s.submit({p, {}, nullptr, nullptr, nullptr}), InvalidArgument);
}

TEST(KvCache, PagesFollowThePositionsHeld) {
  auto model = tiny_gpt();
  nn::KvCache kv(2);
  const int64_t a = kv.add(), b = kv.add();
  const std::vector<int32_t> ta(20, 1), tb(3, 2);
  std::vector<int32_t> both = ta;
  both.insert(both.end(), tb.begin(), tb.end());
  forward_step(*model, kv, both, {{a, 20}, {b, 3}});
  EXPECT_EQ(kv.length(a), 20);
  EXPECT_EQ(kv.length(b), 3);
  const int64_t page = 2 * 2 * nn::KvCache::kPage * 16 * 4;  // blocks x (k, v) x rows x C x f32
  EXPECT_EQ(kv.bytes_held(), 3 * page);                      // 2 pages for 20 positions, 1 for 3
  kv.release(a);
  EXPECT_THROW(kv.length(a), Error);
  EXPECT_EQ(kv.bytes_held(), page);
  EXPECT_EQ(kv.bytes(), 3 * page);  // freed pages are kept for reuse
  const int64_t c = kv.add();
  forward_step(*model, kv, std::vector<int32_t>(30, 4), {{c, 30}});
  EXPECT_EQ(kv.bytes(), 3 * page);  // reused
  EXPECT_EQ(kv.bytes_held(), 3 * page);
}

}  // namespace
}  // namespace tessel::infer
