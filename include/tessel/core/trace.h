// Tracer: one rank's timeline (spans, instants and counters) for a Trace Event Format file;
// train/run_trace.h sets it up per run and merges every rank's into one file. Code that records
// asks active_tracer(): null unless this thread runs under a TraceScope whose tracer is
// recording, so tracing off costs one thread-local load and a branch. Any thread of a rank may
// record (each gets its own row, named by set_trace_thread_name); a mutex guards the events.
// An event's name and args are appended to the tracer's text blocks (64 KiB each, never moved):
// recording allocates nothing per event (a heap block per event, or a growing buffer's copies,
// cost 2-5 us an event on this machine, most of it page faults).
// Times are now_seconds() values; the tracer renders them in microseconds.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace tessel {

// The args object of one event, rendered as JSON text as it is built. Keys are literals of
// letters, digits and underscores (written unescaped).
class TraceArgs {
 public:
  TraceArgs& num(const char* key, double value);
  TraceArgs& text(const char* key, std::string_view value);
  TraceArgs& json(const char* key, std::string_view json_value);  // e.g. an array
  const std::string& body() const { return body_; }               // "k": v, ... (no braces)

 private:
  void key(const char* k);
  std::string body_;
};

std::string json_escape(std::string_view s);  // a JSON string literal, quotes included

class Tracer {
 public:
  Tracer();
  bool recording() const { return recording_.load(std::memory_order_relaxed); }
  void set_recording(bool on) { recording_.store(on, std::memory_order_relaxed); }
  // A window of steps [first, end): at_step(s) records from the start of step s if it lies
  // inside, else stops. The default window holds every step.
  void set_window(int64_t first, int64_t end) { first_ = first, end_ = end; }
  void at_step(int64_t step) { set_recording(first_ <= step && step < end_); }

  // A complete span [start, end) on the calling thread's row; category `cat` (a literal).
  // Events take their args (callers std::move them in: no copy).
  void span(std::string_view name, const char* cat, double start, double end, TraceArgs args = {});
  void instant(std::string_view name, const char* cat, double at, TraceArgs args = {});
  // A counter track `name` with one series per arg (numbers only).
  void counter(std::string_view name, double at, TraceArgs series);

  size_t size() const;
  // Every event and the thread names as Trace Event Format objects, comma separated, with
  // pid `pid` and ts = (time - origin) in microseconds.
  std::string render(int pid, double origin) const;

 private:
  struct Event {
    char ph;
    int tid;
    double ts, dur;
    const char* cat;
    const char* text;  // the name, then the args, in a block of text_
    uint32_t name_size, args_size;
  };
  int tid_locked();  // the calling thread's row (mu_ held)
  void add(char ph, const char* cat, double ts, double dur, std::string_view name,
           std::string_view args);

  const uint64_t id_;  // distinguishes tracers in the threads' row caches
  std::atomic<bool> recording_{false};
  int64_t first_ = 0, end_ = INT64_MAX;
  mutable std::mutex mu_;
  std::deque<Event> events_;      // grows in blocks: no event is moved as it grows
  std::deque<std::string> text_;  // blocks of names and args, each filled up to its capacity
  std::map<std::thread::id, int> tids_;
  std::vector<std::string> thread_names_;  // by tid
};

// The tracer of this thread's TraceScope if it is recording, else null.
Tracer* active_tracer();
// The tracer of this thread's TraceScope, recording or not (to hand to a thread it starts).
Tracer* scoped_tracer();

// While alive, this thread records into `tracer` (may be null: none); scopes nest.
class TraceScope {
 public:
  explicit TraceScope(Tracer* tracer);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Tracer* saved_;
};

// Names the calling thread's row in every trace it records into (default "compute"); `name`
// must outlive the thread (a literal).
void set_trace_thread_name(const char* name);

// A span from construction to destruction on this thread, recorded when a tracer was active at
// construction. args() is null when not recording.
class TraceSpan {
 public:
  TraceSpan(std::string_view name, const char* cat);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  TraceArgs* args() { return tracer_ ? &args_ : nullptr; }

 private:
  Tracer* tracer_;
  double start_ = 0;
  std::string name_;
  const char* cat_;
  TraceArgs args_;
};

}  // namespace tessel
