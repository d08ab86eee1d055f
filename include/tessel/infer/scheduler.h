// Scheduler: continuous batching for text generation (iteration-level scheduling, as in Orca
// and vLLM). One thread runs steps of one GPT over one paged KV cache (nn::KvCache). A step
// takes a row from every sequence that is generating, then rows of the prompts still being read
// (chunked prefill), in arrival order, up to max_step_tokens rows in all: prefill and decode
// share the step, a new sequence joins at the next step and a finished one leaves at once, its
// pages freed. Each step chooses a token for every sequence whose known tokens have all been
// fed, as generate() does; since a row's arithmetic does not depend on the rows beside it, a
// sequence gets the tokens generate() gives it alone. A generation whose alive() says no leaves
// before the next step: from the queue (it never reaches the model) or from the running batch.
// Callbacks run on the scheduler's thread. submit() is thread safe; close() finishes every
// generation already taken, then joins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tessel/infer/generate.h"
#include "tessel/nn/cache.h"

namespace tessel::infer {

// Why a generation ended: "length" (max_new_tokens or the context), "stop" (on_token said so),
// "cancelled" (alive said no); or an error.
struct Generation {
  Prompt prompt;  // tokens, max_new_tokens, sampling key
  SampleOptions sample;
  // Each new token; false ends the generation ("stop": a stop string met, the client gone).
  std::function<bool(int32_t token)> on_token;
  // Once, at the end: the finish reason, or the error that ended it (then reason is "error").
  std::function<void(const std::string& reason, std::exception_ptr error)> on_done;
  // Asked before each step, queued or running (optional): false cancels the generation (its
  // client has gone). Asked of every waiting generation at every step, under the scheduler's
  // lock: it must be cheap and must not call the scheduler.
  std::function<bool()> alive;
};

struct SchedulerOptions {
  int64_t max_sequences = 32;     // sequences in a step (1: one request at a time)
  int64_t max_step_tokens = 256;  // rows in a step
  int64_t max_queue = 256;        // generations waiting to join
  double step_delay_s = 0;        // debug: sleep before every step (debug.delay_ms of worker 0)
};

// Measured after each step.
struct SchedulerStats {
  int64_t sequences = 0;          // in the running batch
  int64_t waiting = 0;            // queued to join
  int64_t positions = 0;          // tokens held in the KV cache (the tokens in flight)
  int64_t kv_bytes = 0;           // page storage of the KV cache, held and free
  int64_t kv_held = 0;            // page storage the running sequences hold
  int64_t steps = 0, tokens = 0;  // steps run and tokens generated so far
  int64_t prompt_tokens = 0;      // prompt tokens read through the model so far (prefill)
  int64_t cancelled = 0;          // generations cancelled so far
  int64_t cancelled_queued = 0;   // of them, while they waited (before any prefill)
};

class Scheduler {
 public:
  // Starts the thread. Throws InvalidArgument when the model is no GPT.
  Scheduler(nn::Model& model, const SchedulerOptions& options);
  ~Scheduler();  // close()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a generation. Returns false (no callback will run) when max_queue wait already or
  // the scheduler is closed. Throws InvalidArgument when the prompt is empty or prompt plus
  // max_new_tokens passes the model's context.
  bool submit(Generation g);
  void close();
  SchedulerStats stats() const;
  int64_t context() const { return context_; }

 private:
  struct Seq {
    Generation g;
    std::vector<int32_t> tokens;  // the prompt, then the generated tokens
    int64_t id = -1;              // in the KV cache
    int64_t fed = 0;              // tokens through the model (in the KV cache)
    int64_t generated = 0;
  };
  void loop();
  void admit();
  void step();
  void finish(Seq& s, const std::string& reason, std::exception_ptr error);

  nn::Model& model_;
  const SchedulerOptions options_;
  int64_t context_ = 0;
  nn::KvCache kv_;
  std::vector<std::unique_ptr<Seq>> running_;  // the scheduler thread's only
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Generation> queue_;
  bool closed_ = false;
  SchedulerStats stats_;  // under mu_
  std::thread thread_;
};

}  // namespace tessel::infer
