#include "tessel/infer/scheduler.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "tessel/core/error.h"
#include "tessel/core/memory.h"

namespace tessel::infer {

Scheduler::Scheduler(nn::Model& model, const SchedulerOptions& options)
    : model_(model), options_(options), context_(gpt_context(model)), kv_(model.num_blocks() - 2) {
  TESSEL_CHECK(options.max_sequences >= 1 && options.max_step_tokens >= 1 && options.max_queue >= 0,
               "scheduler: max_sequences and max_step_tokens must be >= 1, got ",
               options.max_sequences, " and ", options.max_step_tokens);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { close(); }

bool Scheduler::submit(Generation g) {
  check_prompts({g.prompt}, context_);
  std::lock_guard lock(mu_);
  if (closed_ || static_cast<int64_t>(queue_.size()) >= options_.max_queue) return false;
  queue_.push_back(std::move(g));
  stats_.waiting = static_cast<int64_t>(queue_.size());
  cv_.notify_one();
  return true;
}

void Scheduler::close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void Scheduler::loop() {
  MemoryScope scope(MemCategory::kActivations);
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return closed_ || !queue_.empty() || !running_.empty(); });
      if (queue_.empty() && running_.empty()) return;  // closed, and nothing left
    }
    admit();
    if (options_.step_delay_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.step_delay_s));
    step();
  }
}

// Cancelled generations leave the queue, wherever they wait; then waiting ones join the running
// batch, oldest first, while it has room.
void Scheduler::admit() {
  std::vector<Generation> left;
  {
    std::lock_guard lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();)
      if (it->alive && !it->alive()) {
        left.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    while (!queue_.empty() && static_cast<int64_t>(running_.size()) < options_.max_sequences) {
      auto s = std::make_unique<Seq>();
      s->g = std::move(queue_.front());
      queue_.pop_front();
      s->tokens = s->g.prompt.tokens;
      s->id = kv_.add();
      running_.push_back(std::move(s));
    }
    stats_.waiting = static_cast<int64_t>(queue_.size());
    stats_.cancelled += static_cast<int64_t>(left.size());
    stats_.cancelled_queued += static_cast<int64_t>(left.size());
  }
  for (Generation& g : left)  // outside the lock: on_done may take others
    if (g.on_done) g.on_done("cancelled", nullptr);
}

void Scheduler::finish(Seq& s, const std::string& reason, std::exception_ptr error) {
  kv_.release(s.id);
  s.id = -1;
  if (s.g.on_done) s.g.on_done(error ? "error" : reason, error);
}

// One iteration: cancelled sequences leave; rows are taken (decodes first, then prompt
// chunks) up to max_step_tokens; one forward over them; every sequence fed to its end gets a
// token, and those that are done leave.
void Scheduler::step() {
  int64_t cancelled = 0;
  for (auto& s : running_)
    if (s->g.alive && !s->g.alive()) {
      finish(*s, "cancelled", nullptr);
      ++cancelled;
    }
  std::vector<int32_t> tokens;
  std::vector<nn::KvCache::Run> runs;
  std::vector<Seq*> fed;
  int64_t budget = options_.max_step_tokens, made = 0, prompt_rows = 0;
  for (bool decodes : {true, false})
    for (auto& s : running_) {
      const int64_t left = static_cast<int64_t>(s->tokens.size()) - s->fed;
      if (s->id < 0 || (left == 1) != decodes || budget == 0) continue;
      const int64_t rows = std::min(left, budget);
      tokens.insert(tokens.end(), s->tokens.begin() + s->fed, s->tokens.begin() + s->fed + rows);
      runs.push_back({s->id, rows});
      fed.push_back(s.get());
      if (s->generated == 0) prompt_rows += rows;  // nothing generated: all rows are the prompt's
      s->fed += rows;
      budget -= rows;
    }
  if (!fed.empty()) {
    try {
      const Tensor logits = forward_step(model_, kv_, tokens, std::move(runs));
      const int64_t V = logits.dim(1);
      for (size_t r = 0; r < fed.size(); ++r) {
        Seq& s = *fed[r];
        const int64_t at = static_cast<int64_t>(s.tokens.size());
        if (s.fed < at) continue;  // still reading its prompt
        const int32_t t = choose_token(logits.data<float>() + static_cast<int64_t>(r) * V, V,
                                       s.g.sample, s.g.prompt.key, at);
        s.tokens.push_back(t);
        ++s.generated;
        ++made;
        const bool more = !s.g.on_token || s.g.on_token(t);
        if (!more)
          finish(s, "stop", nullptr);
        else if (s.generated >= s.g.prompt.max_new_tokens || at + 1 >= context_)
          finish(s, "length", nullptr);
      }
    } catch (...) {
      for (Seq* s : fed)
        if (s->id >= 0) finish(*s, "error", std::current_exception());
    }
  }
  std::erase_if(running_, [](const auto& s) { return s->id < 0; });
  std::lock_guard lock(mu_);
  stats_.sequences = static_cast<int64_t>(running_.size());
  stats_.positions = 0;
  for (const auto& s : running_) stats_.positions += s->fed;
  stats_.kv_bytes = kv_.bytes();
  stats_.kv_held = kv_.bytes_held();
  stats_.steps += fed.empty() ? 0 : 1;
  stats_.tokens += made;
  stats_.prompt_tokens += prompt_rows;
  stats_.cancelled += cancelled;
}

}  // namespace tessel::infer
