#include "tessel/infer/ordered_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"

namespace tessel::infer {

OrderedWriter::OrderedWriter(const std::string& path, const nlohmann::json& job,
                             const std::string& header, bool resume, double commit_every_s)
    : path_(path),
      progress_path_(path + ".progress"),
      job_(job),
      file_(nullptr, std::fclose),
      commit_every_s_(commit_every_s) {
  if (resume) {
    std::ifstream in(progress_path_);
    if (!in)
      throw InvalidArgument(str("predict: --resume found no ", progress_path_,
                                "; run without --resume to start the job"));
    nlohmann::json p;
    try {
      p = nlohmann::json::parse(in);
      chunks_ = p.at("chunks").get<int64_t>();
      rows_ = p.at("rows").get<int64_t>();
      bytes_ = p.at("bytes").get<int64_t>();
      complete_ = p.at("complete").get<bool>();
    } catch (const nlohmann::json::exception& e) {
      throw IoError(str("predict: ", progress_path_, " is corrupt, got \"", e.what(),
                        "\"; run without --resume to start over"));
    }
    if (p.value("job", nlohmann::json()) != job)
      throw InvalidArgument(str("predict: --resume: ", progress_path_,
                                " belongs to another job, "
                                "got ",
                                p.value("job", nlohmann::json()).dump(), ", this job is ",
                                job.dump(),
                                "; resume with the same input, checkpoint, config "
                                "and infer.chunk_rows, or run without --resume"));
    std::error_code ec;
    const auto size = std::filesystem::file_size(path_, ec);
    if (ec || static_cast<int64_t>(size) < bytes_)
      throw IoError(str("predict: --resume: ", path_, " holds ", ec ? 0 : size, " bytes, got ",
                        "fewer than the ", bytes_, " committed; run without --resume"));
    std::filesystem::resize_file(path_, static_cast<uintmax_t>(bytes_));  // drop a torn chunk
    file_.reset(std::fopen(path_.c_str(), "ab"));
  } else {
    file_.reset(std::fopen(path_.c_str(), "wb"));
  }
  if (!file_)
    throw IoError(str("predict: cannot write ", path_, ", got \"", std::strerror(errno),
                      "\"; check --output"));
  if (!resume) {
    append(-1, header, 0);
    commit();
  }
}

OrderedWriter::~OrderedWriter() = default;

void OrderedWriter::append(int64_t chunk, const std::string& bytes, int64_t rows) {
  TESSEL_CHECK(chunk == -1 || chunk == chunks_, "predict: chunk ", chunk, " written after ",
               chunks_, " chunks");
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_.get()) != bytes.size())
    throw IoError(str("predict: cannot write ", path_, ", got \"", std::strerror(errno),
                      "\"; check the disk"));
  bytes_ += static_cast<int64_t>(bytes.size());
  if (chunk >= 0) ++chunks_;
  rows_ += rows;
}

bool OrderedWriter::due() const { return now_seconds() - last_commit_ >= commit_every_s_; }

void OrderedWriter::commit() {
  // Durable before the progress file says so (a machine crash too, not only a killed job).
  if (std::fflush(file_.get()) != 0 || ::fdatasync(fileno(file_.get())) != 0)
    throw IoError(str("predict: cannot write ", path_, ", got \"", std::strerror(errno),
                      "\"; check the disk"));
  write_progress();
  last_commit_ = now_seconds();
}

void OrderedWriter::finish() {
  complete_ = true;
  commit();
}

void OrderedWriter::write_progress() {
  const nlohmann::json p = {{"job", job_},
                            {"chunks", chunks_},
                            {"rows", rows_},
                            {"bytes", bytes_},
                            {"complete", complete_}};
  ckpt::write_file_atomic(progress_path_, p.dump(2) + "\n");
}

}  // namespace tessel::infer
