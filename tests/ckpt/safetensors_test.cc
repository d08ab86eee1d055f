// safetensors files and SafetensorsReader: round trips of every dtype, the header as the spec
// lays it out, and every kind of corrupt or truncated file rejected with a message naming it.
#include "tessel/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt_testing.h"
#include "tessel/core/error.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using testing::Contains;
using testing::io_error;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

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

}  // namespace
}  // namespace tessel::ckpt
