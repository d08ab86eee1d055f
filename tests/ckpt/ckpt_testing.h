// Helpers shared by the ckpt tests: a fresh folder per test, whole-file reads and writes,
// checks on the message of the IoError a call throws, and a small model's checkpoint saved by
// several writers and compared with what a CheckpointReader reads back.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/error.h"

namespace tessel::ckpt::testing {

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

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

inline ::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
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

// ---- a model's checkpoint ----

// A small model's checkpoint, whole: its manifest (no shards yet), every checkpointed tensor
// (parameters and "<buffer>/<parameter>") flattened, and trainer.json. Values are exact in f32.
struct Model {
  Manifest manifest;
  std::map<std::string, std::vector<float>> tensors;
  std::string trainer_json;
};

inline Model make_model(float seed) {
  Model m;
  m.manifest.model_kind = "mlp";
  m.manifest.io = ModelIo{{3}, DType::kF32, 2};
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

inline Tensor f32(const float* data, int64_t n) {
  Tensor t = Tensor::empty({n});
  if (n > 0) std::memcpy(t.raw(), data, static_cast<size_t>(n) * sizeof(float));
  return t;
}

// Slices for `writers` writers: the tensors laid end to end (in name order) are cut into chunks
// of `chunk` elements dealt round-robin, so slices start and end at odd places inside tensors
// and one writer holds several slices of a tensor.
inline std::vector<std::vector<ShardSlice>> deal(const Model& m, int64_t chunk, int writers) {
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
inline std::string save(const std::string& run, int64_t step, const Model& m,
                        const std::vector<std::vector<ShardSlice>>& writers, int keep_last = 2) {
  const std::string dir = begin_checkpoint(run, step);
  Manifest manifest = m.manifest;
  for (size_t r = 0; r < writers.size(); ++r)
    manifest.shards.push_back(write_shard(dir, static_cast<int>(r), writers[r]));
  return commit_checkpoint(run, dir, step, manifest, m.trainer_json, keep_last);
}

inline std::string save(const std::string& run, int64_t step, const Model& m, int keep_last = 2) {
  return save(run, step, m, deal(m, 5, 3), keep_last);
}

inline std::vector<float> read_all(const CheckpointReader& r, const std::string& name, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -1.0f);
  r.read(name, 0, n, out.data());
  return out;
}

inline void expect_model(const CheckpointReader& r, const Model& m) {
  const Manifest& got = r.manifest();
  EXPECT_EQ(got.model_kind, m.manifest.model_kind);
  EXPECT_EQ(got.io, m.manifest.io);
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

}  // namespace tessel::ckpt::testing
