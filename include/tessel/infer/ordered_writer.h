// OrderedWriter: the output file of `tessel predict`, written chunk after chunk in input order,
// with a progress file beside it ("OUTPUT.progress", JSON) that records what is committed.
// append() adds chunks' bytes; commit() syncs them to the disk, then replaces the progress file
// (write a temporary file, rename): whatever kills the job, the progress file names chunks
// whose bytes are all in the output. A commit costs a few syncs (milliseconds each), so a
// writer commits when due(): infer.commit_every_s after the last commit. --resume truncates the
// output to the committed bytes (dropping a chunk half written after the last commit) and continues
// with the next chunk, so no row is missing or written twice. The progress file also records the
// job's input, checkpoint and chunk size; a resume with different ones is refused. Used by one
// thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace tessel::infer {

class OrderedWriter {
 public:
  // job: what makes chunk numbers mean the same rows (input, checkpoint, chunk rows ...).
  // header: written first in a fresh file (a CSV header line). Throws IoError when the file
  // cannot be written, InvalidArgument when resume finds no progress file or another job's.
  OrderedWriter(const std::string& path, const nlohmann::json& job, const std::string& header,
                bool resume, double commit_every_s);
  ~OrderedWriter();

  int64_t next_chunk() const { return chunks_; }  // the first chunk not appended
  int64_t rows() const { return rows_; }          // rows appended
  bool complete() const { return complete_; }     // a resumed job had already finished
  void append(int64_t chunk, const std::string& bytes, int64_t rows);  // the next chunk
  bool due() const;  // commit_every_s have passed since the last commit
  void commit();     // what was appended is durable and counted
  void finish();     // the whole input is written (and committed)

 private:
  void write_progress();

  std::string path_, progress_path_;
  nlohmann::json job_;
  std::unique_ptr<FILE, int (*)(FILE*)> file_;
  int64_t chunks_ = 0, rows_ = 0, bytes_ = 0;  // appended
  double commit_every_s_, last_commit_ = 0;
  bool complete_ = false;
};

}  // namespace tessel::infer
