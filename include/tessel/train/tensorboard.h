// TensorBoardWriter: the run's metrics as TensorBoard scalars, written natively: an event file
// (run_dir/tensorboard/events.out.tfevents.<time>.<host>) of TFRecord records (length, masked
// CRC-32C of the length, data, masked CRC-32C of the data), each an `Event` protocol buffer
// encoded by libprotobuf with the messages protoc generates from TensorBoard's own event.proto
// and summary.proto (third_party/tensorboard_proto). The first record names the file version
// ("brain.Event:2"). Every metrics.jsonl record becomes one event holding its numbers as
// "<type>/<key>" scalars at its step, so the two files hold the same values. Flushed after each
// record; one thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace tessel::train {

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const std::string& bytes);
// One TFRecord record around `data`.
std::string tfrecord(const std::string& data);
// An Event with a Summary of simple_value scalars (tag, value), or with file_version when
// `scalars` is empty and file_version is not.
std::string encode_event(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars,
                         const std::string& file_version = "");

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& run_dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  // A metrics.jsonl record: every number but "step" and "epoch", tagged "<type>/<key>".
  void add_record(const nlohmann::json& record);

 private:
  void write(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tessel::train
