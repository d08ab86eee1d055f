// ChunkQueue: hands the chunks of a predict input to replicas that are threads of this process
// and takes their outputs back, in any order, for the writer to commit in input order.
// Chunk c is rows [c * chunk_rows, (c + 1) * chunk_rows) of the input (the last one shorter),
// whatever the number of replicas, so the output does not depend on it. A chunk is read from
// the input when first handed out, at most `window` chunks ahead of the writer, so memory
// stays bounded for any input size; its rows are kept until its output arrives.
// Faults: a replica that fails (fail()) or holds a chunk longer than the timeout (a stall,
// noticed while the writer waits) has that chunk handed to another replica. The first output
// of a chunk is kept and any later one dropped, so every row is written exactly once. Bad
// input and setup errors end the job instead (abort()): every replica would fail alike.
// Thread safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tessel/infer/input.h"

namespace tessel::infer {

struct Chunk {
  int64_t id = -1;
  Rows rows;
};

class ChunkQueue {
 public:
  // Chunks from first_chunk on (a resumed job skips the committed ones).
  ChunkQueue(InputReader& input, int64_t chunk_rows, int64_t first_chunk, int replicas,
             double timeout_s);

  // Replica r's next chunk: one to re-run first, else the next of the input. Blocks while the
  // window is full, or while nothing is left to read but other replicas' chunks may still need
  // a re-run. False once the job is over (or aborted).
  bool take(int replica, Chunk& out);
  // Chunk `id`'s output. False when the chunk was done already (a re-run's late twin).
  bool finish(int replica, int64_t id, std::string bytes, int64_t rows);
  // Replica r failed: its chunk goes to the others and it takes no more. The job fails once
  // every replica has.
  void fail(int replica, const std::string& why);
  // Ends the job with `error`, which next() rethrows.
  void abort(std::exception_ptr error);

  // The writer's side: every finished chunk that comes next in input order, at least one
  // (false: all written). Blocks, re-queueing stalled chunks while it waits. Rethrows an abort
  // or a read error; throws Error when every replica failed.
  struct Output {
    int64_t id;
    std::string bytes;
    int64_t rows;
  };
  bool next(std::vector<Output>& ready);
  // Sleeps up to `seconds`, less if the job ends first (debug.delay_ms).
  void sleep(double seconds);

  int64_t reruns() const;  // chunks handed out again after a failure or a stall
  double started() const;  // when the first chunk was handed out (now_seconds())
  std::vector<int> failed() const;

 private:
  struct Held {  // a chunk handed out and not yet finished
    Chunk chunk;
    int holder = -1;
    double since = 0;
    bool queued = false;  // waiting in retry_ for another replica
  };
  bool over() const;  // every chunk written, or aborted
  bool read_next(std::unique_lock<std::mutex>& lock, int replica, Chunk& out);
  void requeue_stalled();

  InputReader& input_;
  const int64_t chunk_rows_;
  const int64_t window_;
  const double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_read_, next_write_;
  bool input_done_ = false;
  bool reading_ = false;  // a replica is reading the next chunk (without mu_)
  std::map<int64_t, Held> held_;
  std::deque<int64_t> retry_;
  std::map<int64_t, std::pair<std::string, int64_t>> done_;  // outputs waiting for the writer
  std::vector<bool> dead_;
  int alive_;
  std::string first_failure_;
  std::exception_ptr error_;
  int64_t reruns_ = 0;
  double started_ = 0;
};

}  // namespace tessel::infer
