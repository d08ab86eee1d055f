#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/error.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / str("tessel_ckpt_test_", ::getpid(), "_", counter++);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A hand-made safetensors file: length, header (unpadded), data.
std::string st_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

Tensor arange_f32(Shape shape, float start) {
  Tensor t = Tensor::empty(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + 0.5f * static_cast<float>(i);
  return t;
}

// One tensor of every dtype, including a scalar and an empty tensor.
TensorFile every_dtype() {
  TensorFile f;
  f.tensors.emplace_back("weight.f32", arange_f32({2, 3}, -1.0f));
  Tensor f16 = Tensor::empty({4}, DType::kF16);
  Tensor bf16 = Tensor::empty({3}, DType::kBF16);
  for (int i = 0; i < 4; ++i) reinterpret_cast<uint16_t*>(f16.raw())[i] = f32_to_f16(0.25f * i);
  for (int i = 0; i < 3; ++i) reinterpret_cast<uint16_t*>(bf16.raw())[i] = f32_to_bf16(-2.0f * i);
  f.tensors.emplace_back("half", f16);
  f.tensors.emplace_back("brain", bf16);
  Tensor i32 = Tensor::empty({5}, DType::kI32);
  for (int i = 0; i < 5; ++i) i32.data<int32_t>()[i] = -7 + 3 * i;
  f.tensors.emplace_back("labels", i32);
  Tensor i64 = Tensor::empty({2, 1}, DType::kI64);
  i64.data<int64_t>()[0] = int64_t{1} << 40;
  i64.data<int64_t>()[1] = -3;
  f.tensors.emplace_back("ids", i64);
  Tensor u8 = Tensor::empty({3}, DType::kU8);  // 3 bytes: the next tensor is not 8-aligned
  for (int i = 0; i < 3; ++i) u8.data<uint8_t>()[i] = static_cast<uint8_t>(250 + i);
  f.tensors.emplace_back("pixels", u8);
  f.tensors.emplace_back("scalar", arange_f32({}, 42.0f));
  f.tensors.emplace_back("empty", Tensor::empty({0, 3}));
  f.metadata = {{"format", "pt"}, {"run", "unit test"}};
  return f;
}

void expect_same(const TensorFile& a, const TensorFile& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [na, ta] = a.tensors[i];
    const auto& [nb, tb] = b.tensors[i];
    EXPECT_EQ(na, nb);
    EXPECT_EQ(ta.dtype(), tb.dtype()) << na;
    EXPECT_EQ(ta.shape(), tb.shape()) << na;
    ASSERT_EQ(ta.nbytes(), tb.nbytes()) << na;
    EXPECT_EQ(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0) << na;
  }
  EXPECT_EQ(a.metadata, b.metadata);
}

TEST(Safetensors, RoundTripEveryDtype) {
  // Kept in the build folder so tests/fixtures/check_safetensors.py can be run on it by hand.
  const std::string path = TESSEL_BINARY_DIR "/tests/ckpt/roundtrip.safetensors";
  const TensorFile f = every_dtype();
  write_safetensors(path, f);
  const TensorFile g = read_safetensors(path);
  expect_same(f, g);
  ASSERT_NE(g.find("labels"), nullptr);
  EXPECT_EQ(g.find("labels")->data<int32_t>()[4], 5);
  EXPECT_EQ(g.find("missing"), nullptr);
  EXPECT_FLOAT_EQ(bf16_to_f32(reinterpret_cast<const uint16_t*>(g.find("brain")->raw())[2]), -4.0f);
}

TEST(Safetensors, HeaderFollowsTheSpec) {
  TempDir dir;
  TensorFile f;
  f.tensors.emplace_back("zeta", arange_f32({3}, 1.0f));  // not alphabetical: order must hold
  f.tensors.emplace_back("alpha", arange_f32({1, 2}, 5.0f));
  write_safetensors(dir / "a.safetensors", f);
  const std::string bytes = read_bytes(dir / "a.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 20);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind("{\"zeta\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                         "\"alpha\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[12,20]}}",
                         0),
            0u)
      << header;
  const size_t last = header.find_last_not_of(' ');  // padded with spaces only
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - 1 - last, 8u);
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.0f);
  EXPECT_EQ(read_safetensors(dir / "a.safetensors").tensors[0].first, "zeta");
}

TEST(Safetensors, FileOrderIsDataOrder) {
  TempDir dir;
  // JSON key order differs from data order; readers return tensors as laid out in the data.
  write_bytes(dir / "o.safetensors",
              st_file(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},)"
                      R"("a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                      "\x01\x02\x03\x04"));
  TensorFile f = read_safetensors(dir / "o.safetensors");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "a");
  EXPECT_EQ(f.tensors[1].second.data<uint8_t>()[1], 4);
}

TEST(Safetensors, WriterRejectsBadNames) {
  TempDir dir;
  TensorFile f;
  f.tensors.emplace_back("w", arange_f32({1}, 0));
  f.tensors.emplace_back("w", arange_f32({1}, 0));
  EXPECT_THROW(write_safetensors(dir / "d.safetensors", f), InvalidArgument);
  f.tensors.pop_back();
  f.tensors.emplace_back("__metadata__", arange_f32({1}, 0));
  EXPECT_THROW(write_safetensors(dir / "d.safetensors", f), InvalidArgument);
  f.tensors.pop_back();
  f.tensors.emplace_back("undefined", Tensor());
  EXPECT_THROW(write_safetensors(dir / "d.safetensors", f), InvalidArgument);
}

struct Corruption {
  const char* name;
  std::string bytes;
  const char* defect;  // a fragment the message must contain
};

std::vector<Corruption> corruptions() {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\0');
  return {
      {"empty", "", "file too short"},
      {"short", std::string(5, '\0'), "file too short"},
      {"huge_header_length", le64(1ull << 40) + "{}", "exceeds the 104857600-byte limit"},
      {"header_past_eof", le64(1000) + "{}      ", "exceeds the 8 bytes after it"},
      {"truncated_data", st_file("{" + ok_entry + "}", data8.substr(0, 5)), "beyond the 5-byte"},
      {"invalid_json", st_file("{\"w\": {\"dtype\": ", data8), "not valid JSON"},
      {"not_json_at_all", st_file("\x89PNG\r\n\x1a\n", ""), "does not start with '{'"},
      {"header_not_object_entry", st_file(R"({"w":[1,2]})", ""), "is not a JSON object"},
      {"bad_dtype", st_file(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data8),
       "unsupported dtype 'F64'"},
      {"overlap",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               data8),
       "overlap"},
      {"shape_bytes_mismatch",
       st_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8),
       "but its data_offsets span 8 bytes"},
      {"end_before_begin",
       st_file(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", data8),
       "ending before they begin"},
      {"gap", st_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8),
       "belong to no tensor"},
      {"trailing_bytes", st_file("{" + ok_entry + "}", data8 + "xx"), "belong to no tensor"},
      {"negative_shape",
       st_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
       "invalid shape"},
      {"overflowing_shape",
       st_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
               data8),
       "invalid shape"},
      {"missing_offsets", st_file(R"({"w":{"dtype":"F32","shape":[2]}})", data8), "data_offsets"},
      {"metadata_not_string", st_file("{\"__metadata__\":{\"k\":1}," + ok_entry + "}", data8),
       "is not a string"},
  };
}

TEST(Safetensors, CorruptFilesThrowIoError) {
  TempDir dir;
  for (const Corruption& c : corruptions()) {
    const std::string path = dir / (std::string(c.name) + ".safetensors");
    write_bytes(path, c.bytes);
    try {
      read_safetensors(path);
      ADD_FAILURE() << c.name << ": no error";
    } catch (const IoError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.defect), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find("checkpoint: " + path + ": "), std::string::npos) << msg;
      EXPECT_NE(msg.find("; the file is corrupt or not a safetensors file"), std::string::npos)
          << msg;
    }
  }
}

TEST(Safetensors, EveryTruncationOfAValidFileIsRejected) {
  TempDir dir;
  write_safetensors(dir / "full.safetensors", every_dtype());
  const std::string bytes = read_bytes(dir / "full.safetensors");
  const size_t n = bytes.size();
  std::vector<size_t> lengths = {0, 1, 7, 8, 9, n - 1, n - 2, n - 3, n - 8};
  for (size_t len = 10; len < n; len += 7) lengths.push_back(len);  // a sample keeps it quick
  for (size_t len : lengths) {
    write_bytes(dir / "cut.safetensors", bytes.substr(0, len));
    EXPECT_THROW(read_safetensors(dir / "cut.safetensors"), IoError) << len;
  }
}

TEST(Safetensors, MissingFileNamesThePath) {
  try {
    read_safetensors("/nonexistent/dir/model.safetensors");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.safetensors"), std::string::npos);
  }
}

// ---- checkpoints ----

Checkpoint make_checkpoint(float seed) {
  Checkpoint c;
  c.model.tensors.emplace_back("fc1.weight", arange_f32({4, 3}, seed));
  c.model.tensors.emplace_back("fc1.bias", arange_f32({4}, -seed));
  c.optimizer.tensors.emplace_back("exp_avg", arange_f32({16}, seed * 2));
  c.optimizer.metadata["kind"] = "adamw";
  c.trainer_json = str("{\"step\": ", seed, ", \"note\": \"opaque\"}\n");
  return c;
}

void expect_same(const Checkpoint& a, const Checkpoint& b) {
  expect_same(a.model, b.model);
  expect_same(a.optimizer, b.optimizer);
  EXPECT_EQ(a.trainer_json, b.trainer_json);
}

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, SaveAndLoadFromEveryKindOfPath) {
  TempDir run;
  const Checkpoint c = make_checkpoint(3.0f);
  const std::string dir = save_checkpoint(run.path().string(), 100, c);
  EXPECT_EQ(dir, run / "checkpoints/step-000100");
  EXPECT_EQ(read_bytes(run / "checkpoints/latest"), "step-000100\n");
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"model.safetensors", "optimizer.safetensors",
                                                    "trainer.json"}));
  for (const std::string& p : {run.path().string(), run / "checkpoints", dir}) {
    EXPECT_EQ(resolve_checkpoint_dir(p), dir) << p;
    expect_same(load_checkpoint(p), c);
  }
  EXPECT_EQ(read_bytes(dir + "/trainer.json"), c.trainer_json);  // stored as given
}

TEST(Checkpoint, KeepLastPrunesOlderSteps) {
  TempDir run;
  for (int step = 1; step <= 5; ++step)
    save_checkpoint(run.path().string(), step * 10, make_checkpoint(float(step)), 2);
  EXPECT_EQ(listing(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step-000040", "step-000050"}));
  expect_same(load_checkpoint(run.path().string()), make_checkpoint(5.0f));
  expect_same(load_checkpoint(run / "checkpoints/step-000040"), make_checkpoint(4.0f));

  TempDir all;
  for (int step = 1; step <= 3; ++step)
    save_checkpoint(all.path().string(), step, make_checkpoint(float(step)), 0);
  EXPECT_EQ(listing(all.path() / "checkpoints").size(), 4u);  // 0 keeps everything
}

TEST(Checkpoint, OlderStepSavedLastIsKeptAndLatest) {
  // A run resumed from an early checkpoint writes lower step numbers than folders already
  // there; what it just wrote must survive pruning and become `latest`.
  TempDir run;
  save_checkpoint(run.path().string(), 200, make_checkpoint(2.0f), 2);
  save_checkpoint(run.path().string(), 300, make_checkpoint(3.0f), 2);
  save_checkpoint(run.path().string(), 50, make_checkpoint(0.5f), 2);
  EXPECT_TRUE(fs::exists(run.path() / "checkpoints/step-000050"));
  EXPECT_EQ(read_bytes(run / "checkpoints/latest"), "step-000050\n");
  expect_same(load_checkpoint(run.path().string()), make_checkpoint(0.5f));
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  TempDir run;
  save_checkpoint(run.path().string(), 7, make_checkpoint(1.0f));
  save_checkpoint(run.path().string(), 7, make_checkpoint(9.0f));
  expect_same(load_checkpoint(run.path().string()), make_checkpoint(9.0f));
  EXPECT_EQ(listing(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step-000007"}));
}

TEST(Checkpoint, LeftoverTemporaryFolderIsIgnored) {
  TempDir run;
  const std::string root = run / "checkpoints";
  save_checkpoint(run.path().string(), 5, make_checkpoint(5.0f));
  // A crash mid-save of step 6 by a process that is gone: half-written files, newer step.
  for (const char* name : {"step-000006.tmp-123", "step-000006.tmp-4194305"}) {
    fs::create_directories(fs::path(root) / name);
    write_bytes(root + "/" + name + "/model.safetensors", "garbage");
  }
  expect_same(load_checkpoint(run.path().string()), make_checkpoint(5.0f));
  fs::remove(fs::path(root) / "latest");  // even the fallback scan skips temporary folders
  expect_same(load_checkpoint(run.path().string()), make_checkpoint(5.0f));

  save_checkpoint(run.path().string(), 6, make_checkpoint(6.0f));
  expect_same(load_checkpoint(run.path().string()), make_checkpoint(6.0f));
  // pid 4194305 is above Linux's pid limit, so its leftover is known stale and removed.
  EXPECT_FALSE(fs::exists(fs::path(root) / "step-000006.tmp-4194305"));
}

TEST(Checkpoint, MissingPiecesGiveClearErrors) {
  TempDir run;
  const std::string dir = save_checkpoint(run.path().string(), 100, make_checkpoint(1.0f));
  fs::remove(dir + "/optimizer.safetensors");
  try {
    load_checkpoint(run.path().string());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(
        std::string(e.what()).find("checkpoint: " + dir + "/optimizer.safetensors is missing; "),
        std::string::npos)
        << e.what();
  }
  write_bytes(dir + "/optimizer.safetensors", "not a safetensors file at all");
  EXPECT_THROW(load_checkpoint(dir), IoError);

  EXPECT_THROW(load_checkpoint(run / "no-such-run"), IoError);
  TempDir empty;
  EXPECT_THROW(load_checkpoint(empty.path().string()), IoError);
  fs::create_directories(empty.path() / "checkpoints");
  EXPECT_THROW(load_checkpoint(empty.path().string()), IoError);

  write_bytes(run / "checkpoints/latest", "step-000999\n");
  try {
    load_checkpoint(run.path().string());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("names step-000999, which does not exist"),
              std::string::npos)
        << e.what();
  }
  write_bytes(run / "checkpoints/latest", "../../etc\n");
  EXPECT_THROW(load_checkpoint(run.path().string()), IoError);
}

TEST(Checkpoint, WriteFileAtomicReplacesWholeFile) {
  TempDir dir;
  write_file_atomic(dir / "f.txt", "first version, long");
  write_file_atomic(dir / "f.txt", "second");
  EXPECT_EQ(read_bytes(dir / "f.txt"), "second");
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"f.txt"});  // no temporary left
  EXPECT_THROW(write_file_atomic(dir / "missing/f.txt", "x"), IoError);
  EXPECT_THROW(fsync_dir(dir / "missing"), IoError);
  EXPECT_THROW(save_checkpoint(dir.path().string(), -1, make_checkpoint(1.0f)), InvalidArgument);
}

}  // namespace
}  // namespace tessel::ckpt
