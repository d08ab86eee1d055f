// TensorBoard event files: the wire bytes of an Event (TensorBoard's field numbers), the TFRecord
// framing, and a real run's file decoded by an independent reader (tb_decode.py: TensorBoard's
// own reader where installed, else Python classes protoc generates from the vendored schema with
// its own CRC-32C) to exactly metrics.jsonl's values.
#include "tessel/train/tensorboard.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "../parallel/train_on.h"
#include "tessel/config/config.h"

namespace tessel::train {
namespace {

std::string hex(const std::string& bytes) {
  std::string out;
  char buf[4];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", c);
    out += buf;
  }
  return out;
}

TEST(TensorBoard, EventWireFormat) {
  // Event{wall_time: 1.5, step: 7, summary {value {tag: "a", simple_value: 1.0}}}
  EXPECT_EQ(hex(encode_event(1.5, 7, {{"a", 1.0}})),
            "09000000000000f83f"
            "1007"
            "2a0a"
            "0a08"
            "0a0161"
            "150000803f");
  // Event{wall_time: 2, step: 300, file_version: "brain.Event:2"}: a two-byte varint step.
  EXPECT_EQ(hex(encode_event(2, 300, {}, "brain.Event:2")),
            "090000000000000040"
            "10ac02"
            "1a0d" +
                hex("brain.Event:2"));
  // proto3 leaves out fields at their default (wall_time 0, step 0); readers take them as 0.
  EXPECT_EQ(hex(encode_event(0, 0, {}, "v")), "1a0176");
  // No scalars and no file version: an empty summary.
  EXPECT_EQ(hex(encode_event(0, 1, {})),
            "1001"
            "2a00");
}

TEST(TensorBoard, RecordFraming) {
  // masked_crc32c("123456789"): CRC 0xE3069283 rotated right by 15, plus 0xa282ead8.
  EXPECT_EQ(masked_crc32c("123456789"), 0xc78ab0e5u);
  const std::string r = tfrecord("123456789");
  ASSERT_EQ(r.size(), 8u + 4 + 9 + 4);
  EXPECT_EQ(hex(r.substr(0, 8)), "0900000000000000");
  uint32_t length_crc, data_crc;
  std::memcpy(&length_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 21, 4);
  EXPECT_EQ(length_crc, masked_crc32c(r.substr(0, 8)));
  EXPECT_EQ(data_crc, 0xc78ab0e5u);
  EXPECT_EQ(r.substr(12, 9), "123456789");
}

bool have(const std::string& cmd) { return std::system((cmd + " > /dev/null 2>&1").c_str()) == 0; }

TEST(TensorBoard, RunDecodesToMetrics) {
  if (!have("protoc --version") || !have("/usr/bin/python3 -c 'import google.protobuf'"))
    GTEST_SKIP() << "needs protobuf-compiler and python3-protobuf (scripts/setup.sh)";
  Config cfg = load_config(TESSEL_SOURCE_DIR "/examples/spiral.toml",
                           {"train.epochs=6", "train.log_every=7", "metrics.tensorboard=true",
                            "checkpoint.every_epochs=0"});
  RunOptions opts;
  opts.run_dir = testing::test_run_dir("tensorboard");
  const testing::RunResult r = testing::train_on(cfg, 2, opts);
  const std::string cmd = "/usr/bin/python3 " + std::string(TESSEL_SOURCE_DIR) +
                          "/tests/train/tb_decode.py " + opts.run_dir + " " + TESSEL_SOURCE_DIR +
                          "/third_party/tensorboard_proto 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_EQ(out.rfind("ok ", 0), 0u) << out;
  std::filesystem::remove_all(opts.run_dir);
}

}  // namespace
}  // namespace tessel::train
