#include "tessel/train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "tensorboard/compat/proto/event.pb.h"
#include "tessel/core/crc32c.h"
#include "tessel/core/error.h"
#include "tessel/train/run_folder.h"

namespace tessel::train {

namespace fs = std::filesystem;

namespace {

// Appends v's bytes, little-endian (x86-64's order, and TFRecord's).
template <typename T>
void append_le(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t masked_crc32c(const std::string& bytes) {
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string length, out;
  append_le<uint64_t>(length, data.size());
  out = length;
  append_le<uint32_t>(out, masked_crc32c(length));
  out += data;
  append_le<uint32_t>(out, masked_crc32c(data));
  return out;
}

std::string encode_event(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars,
                         const std::string& file_version) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  if (scalars.empty() && !file_version.empty()) {
    event.set_file_version(file_version);
  } else {
    tensorboard::Summary* summary = event.mutable_summary();
    for (const auto& [tag, value] : scalars) {
      tensorboard::Summary::Value* v = summary->add_value();
      v->set_tag(tag);
      v->set_simple_value(static_cast<float>(value));
    }
  }
  return event.SerializeAsString();
}

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "tensorboard";
  std::error_code ec;
  fs::create_directories(dir, ec);
  const double now = unix_seconds();
  path_ = (dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." +
                  host_name() + "." + std::to_string(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_)
    throw IoError(
        str("tensorboard: cannot create ", path_, ": ", std::strerror(errno),
            "; check that the run folder is writable or set metrics.tensorboard = false"));
  write(encode_event(now, 0, {}, "brain.Event:2"));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write(const std::string& event) {
  const std::string record = tfrecord(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0)
    throw IoError(str("tensorboard: cannot write ", path_, ": ", std::strerror(errno)));
}

void TensorBoardWriter::add_scalars(int64_t step,
                                    const std::vector<std::pair<std::string, double>>& scalars) {
  write(encode_event(unix_seconds(), step, scalars));
}

void TensorBoardWriter::add_record(const nlohmann::json& record) {
  const std::string type = record.value("type", "metrics");
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [key, value] : record.items())
    if (value.is_number() && key != "step" && key != "epoch")
      scalars.emplace_back(type + "/" + key, value.get<double>());
  if (!scalars.empty()) add_scalars(record.value("step", int64_t{0}), scalars);
}

}  // namespace tessel::train
