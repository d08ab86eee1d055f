// safetensors files, SafetensorsReader, and sharded checkpoints: round trips over uneven
// writer layouts, resharding, integrity (every flipped bit is caught), crash safety and export.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/error.h"
#include "tessel/core/sha256.h"

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

// ---- SafetensorsReader ----

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in: " << text;
}

// The message of the IoError that f throws ("" and a failure when it throws none).
template <typename F>
std::string io_error(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no IoError";
  return "";
}

TEST(SafetensorsReader, ReadsAnyRangeOfAnyTensor) {
  TempDir dir;
  const TensorFile f = every_dtype();
  write_safetensors(dir / "r.safetensors", f);
  const SafetensorsReader r(dir / "r.safetensors");
  EXPECT_EQ(r.file_bytes(), static_cast<int64_t>(read_bytes(dir / "r.safetensors").size()));
  EXPECT_EQ(r.metadata(), f.metadata);
  ASSERT_EQ(r.tensors().size(), f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& [name, t] = f.tensors[i];
    const TensorInfo& info = r.tensors()[i];
    EXPECT_EQ(info.name, name);
    EXPECT_EQ(info.dtype, t.dtype());
    EXPECT_EQ(info.shape, t.shape());
    EXPECT_EQ(r.find(name), &info);
    const size_t elem = dtype_size(t.dtype());
    for (int64_t first = 0; first <= t.numel(); ++first)
      for (int64_t count = 0; first + count <= t.numel(); ++count) {
        std::vector<char> got(count * elem + 1, '\x5a');
        r.read(name, first, count, got.data());
        EXPECT_EQ(
            std::memcmp(got.data(), static_cast<const char*>(t.raw()) + first * elem, count * elem),
            0)
            << name << " [" << first << ", +" << count << ")";
        EXPECT_EQ(got.back(), '\x5a') << "wrote past the range";
      }
  }
  EXPECT_EQ(r.find("missing"), nullptr);
  float x;
  EXPECT_TRUE(Contains(io_error([&] { r.read("missing", 0, 1, &x); }), "has no tensor 'missing'"));
  for (auto [first, count] : {std::pair<int64_t, int64_t>{-1, 1}, {0, 7}, {5, 2}, {6, 1}, {0, -1}})
    EXPECT_TRUE(Contains(io_error([&] { r.read("weight.f32", first, count, &x); }),
                         "outside its 6 elements"))
        << first << " " << count;
}

TEST(SafetensorsReader, ReadsOnDemandFromTheOpenFile) {
  TempDir dir;
  TensorFile f;
  f.tensors.emplace_back("w", arange_f32({4}, 1.0f));
  write_safetensors(dir / "w.safetensors", f);
  const SafetensorsReader r(dir / "w.safetensors");
  // Same size, new values in place: the reader holds no copy of the data.
  f.tensors[0].second.fill_(7.0f);
  write_safetensors(dir / "w.safetensors", f);
  float got[4] = {};
  r.read("w", 1, 3, got);
  EXPECT_EQ(got[0], 7.0f);
  EXPECT_EQ(got[2], 7.0f);
  // Several threads share the one descriptor (pread keeps no position).
  std::vector<std::thread> threads;
  std::vector<float> each(8, 0.0f);
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { r.read("w", i % 4, 1, &each[i]); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(each, std::vector<float>(8, 7.0f));
  fs::resize_file(dir / "w.safetensors", r.file_bytes() - 4);  // shrinks under the reader
  EXPECT_TRUE(Contains(io_error([&] { r.read("w", 0, 4, got); }), "file shrank while reading"));
}

TEST(SafetensorsReader, ValidatesAsReadSafetensorsDoes) {
  TempDir dir;
  for (const Corruption& c : corruptions()) {
    const std::string path = dir / (std::string(c.name) + ".safetensors");
    write_bytes(path, c.bytes);
    const std::string whole = io_error([&] { read_safetensors(path); });
    EXPECT_EQ(io_error([&] { SafetensorsReader r(path); }), whole) << c.name;
    EXPECT_TRUE(Contains(whole, c.defect)) << c.name;
  }
  EXPECT_TRUE(Contains(io_error([] { SafetensorsReader r("/nonexistent/x.safetensors"); }),
                       "cannot open /nonexistent/x.safetensors"));
}

// ---- checkpoints ----

std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A small model's checkpoint, whole: its manifest (no shards yet), every checkpointed tensor
// (parameters and "<buffer>/<parameter>") flattened, and trainer.json. Values are exact in f32.
struct Model {
  Manifest manifest;
  std::map<std::string, std::vector<float>> tensors;
  std::string trainer_json;
};

Model make_model(float seed) {
  Model m;
  m.manifest.model_kind = "mlp";
  m.manifest.parameters = {{"fc1.weight", {4, 3}},
                           {"fc1.bias", {4}},
                           {"blocks/0/ln.scale", {}},
                           {"fc2.weight", {2, 5}},
                           {"unused", {0, 3}}};
  m.manifest.optimizer_kind = "adamw";
  m.manifest.optimizer_steps = static_cast<int64_t>(seed) * 10;
  m.manifest.state_buffers = {"exp_avg", "exp_avg_sq"};
  float base = seed;
  for (const TensorSpec& p : m.manifest.parameters)
    for (const std::string prefix : {"", "exp_avg/", "exp_avg_sq/"}) {
      std::vector<float>& v = m.tensors[prefix + p.name];
      for (int64_t i = 0; i < shape_numel(p.shape); ++i) v.push_back(base + 0.5f * float(i));
      base += 16.0f;
    }
  m.trainer_json = str("{\"step\": ", seed, ", \"note\": \"opaque\"}\n");
  return m;
}

Tensor f32(const float* data, int64_t n) {
  Tensor t = Tensor::empty({n});
  if (n > 0) std::memcpy(t.raw(), data, static_cast<size_t>(n) * sizeof(float));
  return t;
}

// Slices for `writers` writers: the tensors laid end to end (in name order) are cut into chunks
// of `chunk` elements dealt round-robin, so slices start and end at odd places inside tensors
// and one writer holds several slices of a tensor.
std::vector<std::vector<ShardSlice>> deal(const Model& m, int64_t chunk, int writers) {
  std::vector<std::vector<ShardSlice>> out(static_cast<size_t>(writers));
  int64_t flat = 0;
  for (const auto& [name, v] : m.tensors) {
    const int64_t n = static_cast<int64_t>(v.size());
    for (int64_t i = 0; i < n;) {
      const int64_t c = (flat + i) / chunk;
      const int64_t stop = std::min(n, (c + 1) * chunk - flat);
      out[static_cast<size_t>(c % writers)].push_back({name, i, f32(v.data() + i, stop - i)});
      i = stop;
    }
    flat += n;
  }
  return out;
}

// One save as the ranks would do it: begin, every writer's shard, commit.
std::string save(const std::string& run, int64_t step, const Model& m,
                 const std::vector<std::vector<ShardSlice>>& writers, int keep_last = 2) {
  const std::string dir = begin_checkpoint(run, step);
  Manifest manifest = m.manifest;
  for (size_t r = 0; r < writers.size(); ++r)
    manifest.shards.push_back(write_shard(dir, static_cast<int>(r), writers[r]));
  return commit_checkpoint(run, dir, step, manifest, m.trainer_json, keep_last);
}

std::string save(const std::string& run, int64_t step, const Model& m, int keep_last = 2) {
  return save(run, step, m, deal(m, 5, 3), keep_last);
}

std::vector<float> read_all(const CheckpointReader& r, const std::string& name, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -1.0f);
  r.read(name, 0, n, out.data());
  return out;
}

void expect_model(const CheckpointReader& r, const Model& m) {
  const Manifest& got = r.manifest();
  EXPECT_EQ(got.model_kind, m.manifest.model_kind);
  ASSERT_EQ(got.parameters.size(), m.manifest.parameters.size());
  for (size_t i = 0; i < got.parameters.size(); ++i) {
    EXPECT_EQ(got.parameters[i].name, m.manifest.parameters[i].name);
    EXPECT_EQ(got.parameters[i].shape, m.manifest.parameters[i].shape);
  }
  EXPECT_EQ(got.optimizer_kind, m.manifest.optimizer_kind);
  EXPECT_EQ(got.optimizer_steps, m.manifest.optimizer_steps);
  EXPECT_EQ(got.state_buffers, m.manifest.state_buffers);
  EXPECT_EQ(r.trainer_json(), m.trainer_json);
  for (const auto& [name, v] : m.tensors) {
    EXPECT_EQ(r.has(name), !v.empty()) << name;
    EXPECT_EQ(read_all(r, name, static_cast<int64_t>(v.size())), v) << name;
  }
}

TEST(Checkpoint, ThreeWritersAndAnEmptyOneRoundTrip) {
  TempDir run;
  const Model m = make_model(3.0f);
  auto writers = deal(m, 5, 3);
  writers.emplace_back();  // a fourth writer that owns nothing
  const std::string dir = begin_checkpoint(run.path().string(), 100);
  EXPECT_EQ(dir, str(run / "checkpoints/step-000100.tmp-", ::getpid()));
  Manifest manifest = m.manifest;
  for (size_t r = 0; r < writers.size(); ++r)
    manifest.shards.push_back(write_shard(dir, static_cast<int>(r), writers[r]));
  EXPECT_EQ(manifest.shards[3].file, "");  // wrote nothing
  const std::string step_dir =
      commit_checkpoint(run.path().string(), dir, 100, manifest, m.trainer_json);
  EXPECT_EQ(step_dir, run / "checkpoints/step-000100");
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(read_bytes(run / "checkpoints/latest"), "step-000100\n");
  EXPECT_EQ(listing(step_dir),
            (std::vector<std::string>{"manifest.json", "shard-00000.safetensors",
                                      "shard-00001.safetensors", "shard-00002.safetensors",
                                      "trainer.json"}));
  EXPECT_EQ(read_bytes(step_dir + "/trainer.json"), m.trainer_json);  // stored as given

  for (const std::string& p : {run.path().string(), run / "checkpoints", step_dir}) {
    EXPECT_EQ(resolve_checkpoint_dir(p), step_dir) << p;
    const CheckpointReader r(p);
    EXPECT_EQ(r.dir(), step_dir);
    expect_model(r, m);
    ASSERT_EQ(r.manifest().shards.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const ShardFile& s = r.manifest().shards[i];
      EXPECT_EQ(s.file, manifest.shards[i].file);
      EXPECT_EQ(s.bytes, manifest.shards[i].bytes);
      const std::string bytes = read_bytes(step_dir + "/" + s.file);
      EXPECT_EQ(s.bytes, static_cast<int64_t>(bytes.size()));
      EXPECT_EQ(s.sha256, sha256_hex(bytes.data(), bytes.size()));
    }
  }
  // A shard is a plain safetensors file: "<name>@<begin>" keys, described in __metadata__.
  const TensorFile shard = read_safetensors(step_dir + "/shard-00001.safetensors");
  const ShardSlice& first = writers[1][0];
  ASSERT_NE(shard.find(str(first.name, "@", first.begin)), nullptr);
  EXPECT_EQ(shard.metadata.at(str(first.name, "@", first.begin)),
            str("{\"name\":\"", first.name, "\",\"begin\":", first.begin, "}"));
}

TEST(Checkpoint, ReadsAnyRangeAcrossSliceBoundaries) {
  TempDir run;
  const Model m = make_model(1.0f);
  save(run.path().string(), 1, m, deal(m, 3, 3));
  const CheckpointReader r(run.path().string());
  for (const auto& [name, v] : m.tensors) {
    const int64_t n = static_cast<int64_t>(v.size());
    for (int64_t begin = 0; begin <= n; ++begin)
      for (int64_t count = 0; begin + count <= n; ++count) {
        std::vector<float> got(static_cast<size_t>(count) + 1, -99.0f);
        r.read(name, begin, count, got.data());
        EXPECT_TRUE(std::equal(got.begin(), got.end() - 1, v.begin() + begin))
            << name << " [" << begin << ", +" << count << ")";
        EXPECT_EQ(got.back(), -99.0f) << "wrote past the range";
      }
  }
}

TEST(Checkpoint, ReshardsOntoOtherSplits) {
  TempDir run;
  const Model m = make_model(2.0f);
  save(run.path().string(), 10, m);  // 3 writers, round-robin chunks of 5
  const CheckpointReader r(run.path().string());
  // Read back as 2 ranks of a ZeRO-like split: the tensors end to end, cut at element 37.
  std::vector<std::vector<ShardSlice>> zero(2);
  int64_t flat = 0;
  for (const auto& [name, v] : m.tensors) {
    const int64_t n = static_cast<int64_t>(v.size());
    const int64_t cut = std::clamp<int64_t>(37 - flat, 0, n);
    for (auto [rank, b, e] : {std::tuple<int, int64_t, int64_t>{0, 0, cut}, {1, cut, n}}) {
      if (e == b) continue;
      Tensor part = Tensor::empty({e - b});
      r.read(name, b, e - b, part.data<float>());
      EXPECT_TRUE(std::equal(part.data<float>(), part.data<float>() + (e - b), v.begin() + b))
          << name;
      zero[static_cast<size_t>(rank)].push_back({name, b, part});
    }
    flat += n;
  }
  // ... and as 2 pipeline stages: whole tensors, fc1.* on the first stage.
  std::vector<std::vector<ShardSlice>> stages(2);
  for (const auto& [name, v] : m.tensors) {
    const int64_t n = static_cast<int64_t>(v.size());
    Tensor t = Tensor::empty({n});
    r.read(name, 0, n, t.data<float>());
    stages[name.find("fc1.") != std::string::npos ? 0 : 1].push_back({name, 0, t});
  }
  // Either split saves again from 2 writers and reads back the same model.
  save(run.path().string(), 11, m, zero);
  expect_model(CheckpointReader(run.path().string()), m);
  save(run.path().string(), 12, m, stages);
  expect_model(CheckpointReader(run.path().string()), m);
  EXPECT_EQ(listing(run.path() / "checkpoints/step-000012").size(), 4u);  // 2 shards
}

TEST(Checkpoint, MissingRangeNamesTensorAndFirstElement) {
  TempDir run;
  Model m = make_model(1.0f);
  auto writers = deal(m, 100, 1);  // one slice per tensor
  auto& w = writers[0];
  const auto it = std::find_if(w.begin(), w.end(), [](auto& s) { return s.name == "fc1.weight"; });
  const std::vector<float>& v = m.tensors["fc1.weight"];
  *it = {"fc1.weight", 0, f32(v.data(), 5)};
  w.push_back({"fc1.weight", 8, f32(v.data() + 8, 4)});  // [5, 8) is nobody's
  w.erase(std::find_if(w.begin(), w.end(), [](auto& s) { return s.name == "exp_avg/fc1.bias"; }));
  save(run.path().string(), 1, m, writers);
  const CheckpointReader r(run.path().string());
  std::vector<float> got(12);
  r.read("fc1.weight", 0, 5, got.data());
  r.read("fc1.weight", 8, 4, got.data());
  EXPECT_TRUE(r.has("fc1.weight"));
  std::string msg = io_error([&] { r.read("fc1.weight", 0, 12, got.data()); });
  EXPECT_TRUE(Contains(msg, "tensor 'fc1.weight'"));
  EXPECT_TRUE(Contains(msg, "lacks elements [5, 8) (asked for [0, 12), first missing element 5)"));
  EXPECT_TRUE(Contains(io_error([&] { r.read("fc1.weight", 6, 1, got.data()); }),
                       "first missing element 6"));
  EXPECT_FALSE(r.has("exp_avg/fc1.bias"));
  msg = io_error([&] { r.read("exp_avg/fc1.bias", 1, 2, got.data()); });
  EXPECT_TRUE(Contains(msg, "holds no tensor 'exp_avg/fc1.bias'"));
  EXPECT_TRUE(Contains(msg, "first missing element 1"));
  r.read("exp_avg/fc1.bias", 0, 0, got.data());  // nothing asked, nothing missing
  EXPECT_THROW(r.read("fc1.weight", -1, 2, got.data()), InvalidArgument);
  // Export needs every parameter whole; it fails and leaves nothing behind.
  TempDir out;
  EXPECT_TRUE(Contains(io_error([&] { export_model(run.path().string(), out / "m.safetensors"); }),
                       "first missing element 5"));
  EXPECT_TRUE(listing(out.path()).empty());
}

TEST(Checkpoint, BadSlicesAreRejected) {
  TempDir run;
  const std::string dir = begin_checkpoint(run.path().string(), 1);
  const float v[8] = {};
  auto bad = [&](std::vector<ShardSlice> slices, int rank = 0) {
    EXPECT_THROW(write_shard(dir, rank, slices), InvalidArgument);
  };
  bad({{"w", 0, f32(v, 4)}, {"w", 3, f32(v, 2)}});  // overlap
  bad({{"w", 0, Tensor::empty({2, 2})}});
  bad({{"w", 0, Tensor::empty({2}, DType::kI32)}});
  bad({{"w", 0, Tensor()}});
  bad({{"w", -1, f32(v, 1)}});
  bad({{"", 0, f32(v, 1)}});
  bad({{"w", 0, f32(v, 1)}}, -1);
  try {
    write_shard(dir, 0, {{"w", 2, f32(v, 4)}, {"w", 0, f32(v, 3)}});
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(Contains(e.what(), "slices of 'w' overlap in writer 0, got [0, 3) and [2, 6)"));
  }
  EXPECT_TRUE(listing(dir).empty());  // no half-written shard left
  // Empty slices are no data, and slices of one tensor may touch.
  write_shard(dir, 0,
              {{"w", 4, f32(v, 0)}, {"w", 4, f32(v, 0)}, {"w", 0, f32(v, 4)}, {"w", 4, f32(v, 4)}});

  // Overlaps across writers and slices beyond the shape only show when reading.
  const Model m = make_model(1.0f);
  auto writers = deal(m, 5, 2);
  writers[1].push_back(writers[0][0]);
  save(run.path().string(), 2, m, writers);
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(run.path().string()); }), "twice"));
  writers = deal(m, 5, 2);
  writers[1].push_back({"fc1.bias", 4, f32(v, 1)});
  save(run.path().string(), 3, m, writers);
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(run.path().string()); }),
                       "holds elements of 'fc1.bias' up to 5, beyond the 4"));
}

TEST(Checkpoint, CommitChecksItsInputsAndCleansUp) {
  TempDir run;
  const std::string root = run / "checkpoints";
  const Model m = make_model(1.0f);
  save(run.path().string(), 5, m);
  // Not the folder begin_checkpoint made for this step.
  std::string dir = begin_checkpoint(run.path().string(), 6);
  EXPECT_THROW(commit_checkpoint(run.path().string(), dir, 7, m.manifest, ""), InvalidArgument);
  EXPECT_THROW(commit_checkpoint(run.path().string(), root, 6, m.manifest, ""), InvalidArgument);
  EXPECT_TRUE(fs::exists(dir));  // a folder named wrongly is not removed
  // A writer whose shard is not where the committing rank looks.
  Manifest manifest = m.manifest;
  manifest.shards.push_back(write_shard(dir, 0, deal(m, 5, 1)[0]));
  TempDir elsewhere;
  manifest.shards.push_back(write_shard(elsewhere.path().string(), 1, deal(m, 5, 1)[0]));
  EXPECT_TRUE(
      Contains(io_error([&] { commit_checkpoint(run.path().string(), dir, 6, manifest, "{}"); }),
               "shard-00001.safetensors is missing, expected "));
  EXPECT_FALSE(fs::exists(dir));  // the failed save's folder is gone
  EXPECT_EQ(read_bytes(root + "/latest"), "step-000005\n");
  expect_model(CheckpointReader(run.path().string()), m);

  dir = begin_checkpoint(run.path().string(), 6);
  manifest = m.manifest;
  manifest.parameters.push_back(manifest.parameters[0]);  // a repeated name
  EXPECT_THROW(commit_checkpoint(run.path().string(), dir, 6, manifest, ""), InvalidArgument);
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(listing(root), (std::vector<std::string>{"latest", "step-000005"}));
}

// Flips one bit of the file at `path` in place, calls f, and flips it back. In place: ext4
// flushes a file that is truncated and rewritten, which would make thousands of flips slow.
template <typename F>
void with_flipped_bit(const std::string& path, size_t pos, int bit, F&& f) {
  std::fstream io(path, std::ios::binary | std::ios::in | std::ios::out);
  auto flip = [&] {
    char c;
    io.seekg(static_cast<std::streamoff>(pos));
    io.get(c);
    io.seekp(static_cast<std::streamoff>(pos));
    io.put(static_cast<char>(c ^ (1 << bit)));
    io.flush();
  };
  flip();
  f();
  flip();
}

TEST(Checkpoint, EveryFlippedBitIsDetected) {
  TempDir run;
  const Model m = make_model(4.0f);
  const std::string dir = save(run.path().string(), 1, m);
  int flips = 0;
  for (const std::string& name : listing(dir)) {
    const std::string path = dir + "/" + name;
    const size_t n = read_bytes(path).size();
    // Every byte (header, data, padding, last byte) with one bit; all 8 bits at a few.
    for (size_t pos = 0; pos < n; ++pos) {
      const bool all_bits = pos < 9 || pos == n / 2 || pos + 1 == n;
      for (int bit = all_bits ? 0 : int(pos % 8); bit < (all_bits ? 8 : int(pos % 8) + 1); ++bit)
        with_flipped_bit(path, pos, bit, [&] {
          ++flips;
          const std::string msg = io_error([&] { CheckpointReader r(dir); });
          EXPECT_TRUE(Contains(msg, path)) << "byte " << pos << " bit " << bit << " of\n"
                                           << read_bytes(path);
          if (name != "manifest.json") {
            EXPECT_TRUE(Contains(msg, "resume from an older checkpoint"));
          }
        });
    }
    // A byte more or less is caught by the size alone (manifest.json: by its content, and
    // whitespace around it is no content).
    if (name == "manifest.json") continue;
    const std::string bytes = read_bytes(path);
    for (const std::string& changed : {bytes + " ", bytes.substr(0, n - 1)}) {
      write_bytes(path, changed);
      EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(dir); }), path));
    }
    write_bytes(path, bytes);
  }
  EXPECT_GT(flips, 5000);
  expect_model(CheckpointReader(dir), m);  // every flip undone: the checkpoint reads again
}

// Rewrites manifest.json through `edit`, keeping its self-checksum valid unless told otherwise,
// so that the field checks behind the checksum are reached.
template <typename F>
void edit_manifest(const std::string& dir, F&& edit, bool rehash = true) {
  using Json = nlohmann::ordered_json;
  Json j = Json::parse(read_bytes(dir + "/manifest.json"));
  edit(j);
  if (rehash) {
    j.erase("manifest_sha256");
    const std::string body = j.dump();
    j["manifest_sha256"] = sha256_hex(body.data(), body.size());
  }
  write_bytes(dir + "/manifest.json", j.dump(2));
}

TEST(Checkpoint, ManifestDefectsNameTheField) {
  TempDir run;
  const Model m = make_model(1.0f);
  const std::string dir = save(run.path().string(), 1, m);
  const std::string manifest = dir + "/manifest.json";
  const std::string good = read_bytes(manifest);
  using Json = nlohmann::ordered_json;
  struct Case {
    std::function<void(Json&)> edit;
    std::string message;
    bool rehash = true;
  };
  const Case cases[] = {
      {[](Json& j) { j["parameters"][1]["shape"] = "x"; }, "field \"parameters[1].shape\""},
      {[](Json& j) { j["parameters"][0]["shape"][1] = -3; }, "field \"parameters[0].shape[1]\""},
      {[](Json& j) { j["parameters"][2]["name"] = "fc1.weight"; }, "\"parameters[2].name\""},
      {[](Json& j) { j["optimizer"]["steps"] = 1.5; }, "field \"optimizer.steps\""},
      {[](Json& j) { j["optimizer"]["state_buffers"][0] = 7; },
       "field \"optimizer.state_buffers[0]\""},
      {[](Json& j) { j["optimizer"]["state_buffers"][1] = "exp_avg"; },
       "field \"optimizer.state_buffers[1]\" that is empty or repeated"},
      {[](Json& j) { j["shards"][0]["file"] = "../x"; }, "field \"shards[0].file\""},
      {[](Json& j) { j["shards"][1]["sha256"] = "abc"; }, "field \"shards[1].sha256\""},
      {[](Json& j) { j.erase("model_kind"); }, "field \"model_kind\" missing"},
      {[](Json& j) { j["trainer"] = 3; }, "field \"trainer\" that is not a JSON object"},
      {[](Json& j) { j["format"] = "other"; }, "field \"format\" that is 'other'"},
      {[](Json& j) { j = Json::array(); }, "is not a JSON object", false},
      {[](Json& j) { j["version"] = 2; }, "has version 2, newer than the 1 this tessel reads",
       false},
      {[](Json& j) { j["model_kind"] = "cnn"; }, "does not match the SHA-256 it records", false},
      {[](Json& j) { j["shards"][2]["sha256"] = std::string(64, 'a'); },
       "shard-00002.safetensors does not match the SHA-256 manifest.json records"},
      {[](Json& j) { j["trainer"]["bytes"] = 1; }, "trainer.json has "},
  };
  for (const Case& c : cases) {
    edit_manifest(dir, c.edit, c.rehash);
    const std::string msg = io_error([&] { CheckpointReader r(dir); });
    EXPECT_TRUE(Contains(msg, c.message));
    EXPECT_TRUE(Contains(msg, "checkpoint: " + dir + "/"));
    write_bytes(manifest, good);
  }
  write_bytes(manifest, "{\"format\": ");
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(dir); }),
                       manifest + " is not valid JSON (error at byte "));
  write_bytes(manifest, good);
  expect_model(CheckpointReader(dir), m);
}

TEST(Checkpoint, CrashLeavesThePreviousCheckpoint) {
  TempDir run;
  const std::string root = run / "checkpoints";
  save(run.path().string(), 5, make_model(5.0f));
  // A crash mid-save of step 6: this process's shards are written, the commit never comes; and
  // the half-written folder of a writer that is gone.
  const std::string own = begin_checkpoint(run.path().string(), 6);
  write_shard(own, 0, deal(make_model(6.0f), 5, 1)[0]);
  fs::create_directories(fs::path(root) / "step-000006.tmp-4194305");
  write_bytes(root + "/step-000006.tmp-4194305/manifest.json", "garbage");
  expect_model(CheckpointReader(run.path().string()), make_model(5.0f));
  fs::remove(fs::path(root) / "latest");  // even the fallback scan skips temporary folders
  expect_model(CheckpointReader(run.path().string()), make_model(5.0f));

  save(run.path().string(), 6, make_model(6.0f));  // replaces its own leftover
  expect_model(CheckpointReader(run.path().string()), make_model(6.0f));
  EXPECT_EQ(read_bytes(root + "/latest"), "step-000006\n");
  // pid 4194305 is above Linux's pid limit, so its leftover is known stale and removed.
  EXPECT_EQ(listing(root), (std::vector<std::string>{"latest", "step-000005", "step-000006"}));
}

TEST(Checkpoint, KeepLastPrunesOlderSteps) {
  TempDir run;
  for (int step = 1; step <= 5; ++step)
    save(run.path().string(), step * 10, make_model(float(step)), 2);
  EXPECT_EQ(listing(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step-000040", "step-000050"}));
  expect_model(CheckpointReader(run.path().string()), make_model(5.0f));
  expect_model(CheckpointReader(run / "checkpoints/step-000040"), make_model(4.0f));

  TempDir all;
  for (int step = 1; step <= 3; ++step) save(all.path().string(), step, make_model(float(step)), 0);
  EXPECT_EQ(listing(all.path() / "checkpoints").size(), 4u);  // 0 keeps everything
}

TEST(Checkpoint, OlderStepSavedLastIsKeptAndLatest) {
  // A run resumed from an early checkpoint writes lower step numbers than folders already
  // there; what it just wrote must survive pruning and become `latest`.
  TempDir run;
  save(run.path().string(), 200, make_model(2.0f), 2);
  save(run.path().string(), 300, make_model(3.0f), 2);
  save(run.path().string(), 50, make_model(0.5f), 2);
  EXPECT_TRUE(fs::exists(run.path() / "checkpoints/step-000050"));
  EXPECT_EQ(read_bytes(run / "checkpoints/latest"), "step-000050\n");
  expect_model(CheckpointReader(run.path().string()), make_model(0.5f));
}

TEST(Checkpoint, ResavingAStepReplacesIt) {
  TempDir run;
  save(run.path().string(), 7, make_model(1.0f), deal(make_model(1.0f), 5, 3));
  save(run.path().string(), 7, make_model(9.0f), deal(make_model(9.0f), 4, 2));
  expect_model(CheckpointReader(run.path().string()), make_model(9.0f));
  EXPECT_EQ(listing(run.path() / "checkpoints"),
            (std::vector<std::string>{"latest", "step-000007"}));
  EXPECT_EQ(listing(run.path() / "checkpoints/step-000007").size(), 4u);  // no third shard
}

TEST(Checkpoint, MissingPiecesGiveClearErrors) {
  TempDir run;
  const std::string dir = save(run.path().string(), 100, make_model(1.0f));
  fs::remove(dir + "/shard-00001.safetensors");
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(run.path().string()); }),
                       "checkpoint: cannot open " + dir + "/shard-00001.safetensors"));
  fs::remove(dir + "/manifest.json");
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(dir); }),
                       "checkpoint: " + dir + "/manifest.json is missing; "));
  write_bytes(dir + "/model.safetensors", "");
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(dir); }), "the format before sharded"));

  EXPECT_THROW(CheckpointReader(run / "no-such-run"), IoError);
  TempDir empty;
  EXPECT_THROW(CheckpointReader(empty.path().string()), IoError);
  fs::create_directories(empty.path() / "checkpoints");
  EXPECT_THROW(CheckpointReader(empty.path().string()), IoError);

  write_bytes(run / "checkpoints/latest", "step-000999\n");
  EXPECT_TRUE(Contains(io_error([&] { CheckpointReader r(run.path().string()); }),
                       "names step-000999, which does not exist"));
  write_bytes(run / "checkpoints/latest", "../../etc\n");
  EXPECT_THROW(CheckpointReader(run.path().string()), IoError);
}

TEST(Checkpoint, WriteFileAtomicReplacesWholeFile) {
  TempDir dir;
  write_file_atomic(dir / "f.txt", "first version, long");
  write_file_atomic(dir / "f.txt", "second");
  EXPECT_EQ(read_bytes(dir / "f.txt"), "second");
  EXPECT_EQ(listing(dir.path()), std::vector<std::string>{"f.txt"});  // no temporary left
  EXPECT_THROW(write_file_atomic(dir / "missing/f.txt", "x"), IoError);
  EXPECT_THROW(fsync_dir(dir / "missing"), IoError);
  EXPECT_THROW(begin_checkpoint(dir.path().string(), -1), InvalidArgument);
}

// ---- export ----

TEST(Export, WritesEveryParameterWholeInModelOrder) {
  TempDir run, out;
  const Model m = make_model(2.0f);
  save(run.path().string(), 3, m, deal(m, 3, 3));
  export_model(run.path().string(), out / "model.safetensors");
  EXPECT_EQ(listing(out.path()), std::vector<std::string>{"model.safetensors"});
  const TensorFile f = read_safetensors(out / "model.safetensors");
  ASSERT_EQ(f.tensors.size(), m.manifest.parameters.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& [name, t] = f.tensors[i];
    EXPECT_EQ(name, m.manifest.parameters[i].name);
    EXPECT_EQ(t.shape(), m.manifest.parameters[i].shape);
    EXPECT_EQ(t.dtype(), DType::kF32);
    EXPECT_EQ(std::vector<float>(t.data<float>(), t.data<float>() + t.numel()), m.tensors.at(name))
        << name;
  }
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  export_model(run.path().string(), out / "model.safetensors");  // replaces it whole
  EXPECT_EQ(read_safetensors(out / "model.safetensors").tensors.size(), f.tensors.size());
}

// Runs a command, returning its exit status and what it printed.
std::pair<int, std::string> run_command(const std::string& cmd) {
  std::string output;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) output.append(buf, n);
  return {::pclose(p), output};
}

TEST(Export, LoadsInPyTorch) {
  // tests/fixtures/check_safetensors.py parses the file with json and torch alone.
  const std::string python = "/usr/bin/python3";
  if (run_command(python + " -c 'import torch'").first != 0)
    GTEST_SKIP() << python << " cannot import torch (Debian: apt-get install python3-torch)";
  TempDir run, out;
  const Model m = make_model(1.0f);
  save(run.path().string(), 1, m);
  export_model(run.path().string(), out / "model.safetensors");
  const auto [status, output] =
      run_command(python + " " TESSEL_SOURCE_DIR "/tests/fixtures/check_safetensors.py " +
                  out / "model.safetensors");
  ASSERT_EQ(status, 0) << output;
  std::string want = "metadata: {\"format\": \"pt\"}\n";
  for (const TensorSpec& p : m.manifest.parameters) {
    double sum = 0;
    for (float x : m.tensors.at(p.name)) sum += x;
    char line[256];
    std::snprintf(line, sizeof line, "%s: float32 %s sum=%g\n", p.name.c_str(),
                  shape_str(p.shape).c_str(), sum);
    want += line;
  }
  EXPECT_EQ(output, want);
}

}  // namespace
}  // namespace tessel::ckpt
