// Reading sharded checkpoints: any element range across slice boundaries, resharding onto other
// splits, clear errors for missing elements and files, integrity (every flipped bit is caught,
// every manifest defect names its field), and export to one plain safetensors file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ckpt_testing.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/error.h"
#include "tessel/core/sha256.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::Contains;
using testing::deal;
using testing::expect_model;
using testing::f32;
using testing::io_error;
using testing::listing;
using testing::make_model;
using testing::Model;
using testing::read_all;
using testing::read_bytes;
using testing::save;
using testing::TempDir;
using testing::write_bytes;

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
      {[](Json& j) { j["version"] = 4; }, "has version 4, newer than the 3 this tessel reads",
       false},
      {[](Json& j) { j.erase("model_io"); }, "field \"model_io\" missing"},
      {[](Json& j) { j["model_io"].erase("num_classes"); },
       "field \"model_io.num_classes\" missing"},
      {[](Json& j) { j["model_io"]["num_classes"] = 0; },
       "field \"model_io.num_classes\" that is not a positive integer"},
      {[](Json& j) { j["model_io"]["input_shape"] = Json::array(); },
       "field \"model_io.input_shape\" that is empty"},
      {[](Json& j) { j["model_io"]["input_shape"][0] = 0; },
       "field \"model_io.input_shape[0]\" that is not a dimension, got 0"},
      {[](Json& j) { j["model_io"]["input_dtype"] = "f64"; },
       "field \"model_io.input_dtype\" that is not 'f32' or 'i32', got 'f64'"},
      {[](Json& j) {
         j["tokenizer"] = {{"kind", "words"}, {"vocabulary", {97}}};
       },
       "field \"tokenizer.kind\" that is 'words', not 'bytes'"},
      {[](Json& j) {
         j["tokenizer"] = {{"kind", "bytes"}, {"vocabulary", {97, 98, 97}}};
       },
       "field \"tokenizer.vocabulary[2]\" that is not a byte of its own, got 97"},
      {[](Json& j) {
         j["tokenizer"] = {{"kind", "bytes"}, {"vocabulary", {300}}};
       },
       "field \"tokenizer.vocabulary[0]\" that is not a byte of its own, got 300"},
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
  // A language model's tokenizer reads back; a version 1 manifest (before tokenizers) loads.
  edit_manifest(dir, [](Json& j) {
    j["tokenizer"] = {{"kind", "bytes"}, {"vocabulary", {10, 97, 255}}};
  });
  const auto tokenizer = CheckpointReader(dir).manifest().tokenizer;
  ASSERT_TRUE(tokenizer);
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{2, 0, 1}), std::string("\xff\na"));
  write_bytes(manifest, good);
  // Versions 1 and 2 (before model_io) load without it.
  Model old = m;
  old.manifest.io.reset();
  for (int version : {1, 2}) {
    write_bytes(manifest, good);
    edit_manifest(dir, [&](Json& j) {
      j["version"] = version;
      j.erase("model_io");
    });
    expect_model(CheckpointReader(dir), old);
    EXPECT_FALSE(CheckpointReader(dir).manifest().tokenizer);
  }
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
