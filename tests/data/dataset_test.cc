// Datasets: IDX round trips and every way an IDX folder can be broken, the real Fashion-MNIST
// when installed, spiral, text and synthetic generation, and make_datasets dispatch.
#include "tessel/data/dataset.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace tessel::data {
namespace {

namespace fs = std::filesystem;

constexpr int kSide = 28;
constexpr int kPixels = kSide * kSide;

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessel_data_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gz) {
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

uint8_t pixel(int image, int k, int salt) {
  return static_cast<uint8_t>((image * 31 + k * 7 + salt) % 256);
}

std::vector<uint8_t> images_data(int count, int salt) {
  std::vector<uint8_t> d;
  for (int i = 0; i < count; ++i)
    for (int k = 0; k < kPixels; ++k) d.push_back(pixel(i, k, salt));
  return d;
}

std::vector<uint8_t> labels_data(int count, int salt) {
  std::vector<uint8_t> d;
  for (int i = 0; i < count; ++i) d.push_back(static_cast<uint8_t>((i + salt) % 10));
  return d;
}

// Writes a valid IDX folder: `train` and `test` images with matching labels.
void write_idx_folder(const TempDir& dir, int train, int test, bool gz, int salt = 0) {
  const std::string ext = gz ? ".gz" : "";
  write_file(dir / ("train-images-idx3-ubyte" + ext),
             idx_bytes(0x803, {uint32_t(train), kSide, kSide}, images_data(train, salt)), gz);
  write_file(dir / ("train-labels-idx1-ubyte" + ext),
             idx_bytes(0x801, {uint32_t(train)}, labels_data(train, salt)), gz);
  write_file(dir / ("t10k-images-idx3-ubyte" + ext),
             idx_bytes(0x803, {uint32_t(test), kSide, kSide}, images_data(test, salt + 1)), gz);
  write_file(dir / ("t10k-labels-idx1-ubyte" + ext),
             idx_bytes(0x801, {uint32_t(test)}, labels_data(test, salt + 1)), gz);
}

DataSpec idx_spec(const TempDir& dir) {
  DataSpec spec;
  spec.kind = DataKind::kMnistIdx;
  spec.path = dir.path();
  return spec;
}

// Runs make_datasets expecting an IoError whose message contains every part of `parts`.
void expect_io_error(const DataSpec& spec, const std::vector<std::string>& parts) {
  try {
    make_datasets(spec);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks \"" << p << "\": " << e.what();
  }
}

void check_idx_round_trip(bool gz) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, gz);
  DataSpec spec = idx_spec(dir);
  Splits s = make_datasets(spec);
  ASSERT_TRUE(s.train && s.test);
  EXPECT_EQ(s.train->name(), "mnist_idx");
  EXPECT_EQ(s.train->size(), 5);
  EXPECT_EQ(s.test->size(), 3);
  EXPECT_EQ(s.train->input_shape(), Shape{kPixels});
  EXPECT_EQ(s.train->label_shape(), Shape{});
  EXPECT_EQ(s.train->input_dtype(), DType::kF32);
  EXPECT_EQ(s.train->num_classes(), 5);  // labels 0..4 (train) and 1..3 (test)
  // The per-pixel map inference applies to raw pixels (model_io): the training rows are exactly
  // what it makes of them, which is (p / 255 - data.mean) / data.std to rounding.
  ASSERT_EQ(s.input_mean, std::vector<float>(kPixels, 255.0f * spec.mean));
  ASSERT_EQ(s.input_std, std::vector<float>(kPixels, 255.0f * spec.std));
  auto mapped = [&](uint8_t p) {
    return (static_cast<float>(p) - s.input_mean[0]) / s.input_std[0];
  };
  std::vector<float> x(kPixels);
  for (int i = 0; i < 5; ++i) {
    int32_t y = -1;
    s.train->get(i, x.data(), &y);
    EXPECT_EQ(y, i % 10);
    for (int k = 0; k < kPixels; ++k) {
      ASSERT_EQ(x[k], mapped(pixel(i, k, 0))) << i << "," << k;
      ASSERT_NEAR(x[k], (pixel(i, k, 0) / 255.0f - spec.mean) / spec.std, 1e-6) << i << "," << k;
    }
  }
  int32_t y = -1;
  s.test->get(2, x.data(), &y);
  EXPECT_EQ(y, 3);
  EXPECT_EQ(x[10], mapped(pixel(2, 10, 1)));

  spec.flatten = false;
  EXPECT_EQ(make_datasets(spec).train->input_shape(), (Shape{1, kSide, kSide}));
}

TEST(Idx, RoundTripPlain) { check_idx_round_trip(false); }
TEST(Idx, RoundTripGz) { check_idx_round_trip(true); }

TEST(Idx, PrefersGzOverPlain) {
  TempDir dir;
  write_idx_folder(dir, 4, 2, false, /*salt=*/0);
  write_idx_folder(dir, 6, 2, true, /*salt=*/5);
  Splits s = make_datasets(idx_spec(dir));
  EXPECT_EQ(s.train->size(), 6);
  int32_t y;
  std::vector<float> x(kPixels);
  s.train->get(0, x.data(), &y);
  EXPECT_EQ(y, 5);
}

TEST(Idx, MissingFileNamesPathAndFix) {
  TempDir dir;
  expect_io_error(idx_spec(dir), {dir / "train-images-idx3-ubyte.gz",
                                  dir / "train-images-idx3-ubyte", "data.path"});
  DataSpec spec = idx_spec(dir);
  spec.path = DataSpec{}.path;
  if (!fs::exists(spec.path))
    expect_io_error(spec, {"apt-get install dataset-fashion-mnist", "make setup"});
}

TEST(Idx, TruncatedImages) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  write_file(dir / "train-images-idx3-ubyte",
             idx_bytes(0x803, {5, kSide, kSide}, images_data(4, 0)), false);
  expect_io_error(idx_spec(dir), {dir / "train-images-idx3-ubyte", "truncated"});
}

TEST(Idx, TruncatedLabels) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, true);
  write_file(dir / "t10k-labels-idx1-ubyte.gz", idx_bytes(0x801, {3}, labels_data(2, 0)), true);
  expect_io_error(idx_spec(dir), {dir / "t10k-labels-idx1-ubyte.gz", "truncated"});
}

TEST(Idx, TruncatedHeader) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  write_file(dir / "train-labels-idx1-ubyte", {0, 0, 8, 1, 0}, false);
  expect_io_error(idx_spec(dir), {dir / "train-labels-idx1-ubyte", "too short"});
}

TEST(Idx, TrailingBytes) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  write_file(dir / "train-labels-idx1-ubyte", idx_bytes(0x801, {4}, labels_data(5, 0)), false);
  expect_io_error(idx_spec(dir), {dir / "train-labels-idx1-ubyte", "1 bytes after"});
}

TEST(Idx, BadMagic) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  // A labels file where images belong: right size rules, wrong magic.
  write_file(dir / "train-images-idx3-ubyte", idx_bytes(0x801, {5}, labels_data(5, 0)), false);
  expect_io_error(idx_spec(dir),
                  {dir / "train-images-idx3-ubyte", "bad IDX magic", "0x00000801", "0x00000803"});
}

TEST(Idx, GarbageWithGzName) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, true);
  write_file(dir / "train-images-idx3-ubyte.gz", {'n', 'o', 't', ' ', 'g', 'z', 'i', 'p', 0, 1},
             false);
  expect_io_error(idx_spec(dir), {dir / "train-images-idx3-ubyte.gz", "not a gzip file"});
}

TEST(Idx, CorruptGzBody) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, true);
  std::string path = dir / "train-images-idx3-ubyte.gz";
  std::vector<uint8_t> bytes = read_bytes(path);
  ASSERT_GT(bytes.size(), 40u);
  for (size_t i = 12; i < bytes.size() - 8; ++i) bytes[i] = static_cast<uint8_t>(i * 97 + 13);
  write_file(path, bytes, false);
  expect_io_error(idx_spec(dir), {path, "zlib error"});
}

TEST(Idx, TruncatedGzStream) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, true);
  std::string path = dir / "train-images-idx3-ubyte.gz";
  std::vector<uint8_t> bytes = read_bytes(path);
  bytes.resize(bytes.size() / 2);
  write_file(path, bytes, false);
  expect_io_error(idx_spec(dir), {path, "zlib error"});
}

TEST(Idx, CountMismatch) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  write_file(dir / "train-labels-idx1-ubyte", idx_bytes(0x801, {4}, labels_data(4, 0)), false);
  expect_io_error(idx_spec(dir), {"5 images and 4 labels"});
}

// The class count is the data's (15 and 3 here, where 10 was fixed), or data.classes when it
// covers every label of either split.
TEST(Idx, ClassCountComesFromTheLabels) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  write_file(dir / "train-labels-idx1-ubyte", idx_bytes(0x801, {5}, {0, 14, 3, 7, 1}), false);
  EXPECT_EQ(make_datasets(idx_spec(dir)).train->num_classes(), 15);
  write_file(dir / "train-labels-idx1-ubyte", idx_bytes(0x801, {5}, {0, 1, 2, 1, 0}), false);
  write_file(dir / "t10k-labels-idx1-ubyte", idx_bytes(0x801, {3}, {1, 2, 0}), false);
  Splits s = make_datasets(idx_spec(dir));
  EXPECT_EQ(s.train->num_classes(), 3);
  EXPECT_EQ(s.test->num_classes(), 3);
  DataSpec spec = idx_spec(dir);
  spec.classes = 12;
  EXPECT_EQ(make_datasets(spec).test->num_classes(), 12);
  write_file(dir / "t10k-labels-idx1-ubyte", idx_bytes(0x801, {3}, {1, 200, 0}), false);
  try {
    make_datasets(spec);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("data.classes = 12 is too few"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("at least 201"), std::string::npos) << e.what();
  }
}

TEST(Idx, BadStdIsInvalidArgument) {
  TempDir dir;
  write_idx_folder(dir, 5, 3, false);
  DataSpec spec = idx_spec(dir);
  spec.std = 0;
  EXPECT_THROW(make_datasets(spec), InvalidArgument);
}

TEST(Idx, RealFashionMnist) {
  DataSpec spec;  // the defaults point at the packaged dataset
  if (!fs::exists(spec.path)) GTEST_SKIP() << spec.path << " not installed";
  Splits s = make_datasets(spec);
  EXPECT_EQ(s.train->name(), "fashion_mnist");
  ASSERT_EQ(s.train->size(), 60000);
  ASSERT_EQ(s.test->size(), 10000);
  EXPECT_EQ(s.train->input_shape(), Shape{784});
  std::vector<float> x(784);
  int32_t y = -1;
  s.train->get(0, x.data(), &y);
  EXPECT_EQ(y, 9);  // ankle boot
  const float lo = (0 - spec.mean) / spec.std, hi = (1 - spec.mean) / spec.std;
  for (float v : x) ASSERT_TRUE(v >= lo - 1e-5f && v <= hi + 1e-5f) << v;
  std::vector<int> counts(10);
  for (int64_t i = 0; i < s.test->size(); ++i) {
    s.test->get(i, x.data(), &y);
    ASSERT_TRUE(y >= 0 && y < 10) << y;
    ++counts[y];
  }
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test set is balanced
}

TEST(Spiral, ShapesLabelsAndDeterminism) {
  DataSpec spec;
  spec.kind = DataKind::kSpiral;
  spec.classes = 3;
  spec.points_per_class = 50;
  spec.test_fraction = 0.2;
  Splits s = make_datasets(spec);
  ASSERT_EQ(s.train->size(), 150);
  ASSERT_TRUE(s.test);
  EXPECT_EQ(s.test->size(), 30);
  EXPECT_EQ(s.train->input_shape(), Shape{2});
  EXPECT_EQ(s.train->num_classes(), 3);
  float x[2];
  int32_t y;
  for (int64_t i = 0; i < s.train->size(); ++i) {
    s.train->get(i, x, &y);
    EXPECT_EQ(y, i / 50);
    EXPECT_LE(std::hypot(x[0], x[1]), 1.0f + 1e-6f);
    // The radius is the grid value i/(N-1) whatever the angle noise.
    EXPECT_NEAR(std::hypot(x[0], x[1]), (i % 50) / 49.0f, 1e-5f);
  }
  std::set<int32_t> test_labels;
  for (int64_t i = 0; i < s.test->size(); ++i) {
    s.test->get(i, x, &y);
    test_labels.insert(y);
  }
  EXPECT_EQ(test_labels, (std::set<int32_t>{0, 1, 2}));

  float a[2], b[2];
  make_datasets(spec).train->get(77, a, &y);
  s.train->get(77, b, &y);
  EXPECT_EQ(a[0], b[0]);
  spec.seed = 2;
  make_datasets(spec).train->get(77, a, &y);
  EXPECT_NE(a[0], b[0]);

  spec.test_fraction = 0;
  EXPECT_EQ(make_datasets(spec).test, nullptr);
  spec.points_per_class = 0;
  EXPECT_THROW(make_datasets(spec), InvalidArgument);
}

TEST(Text, WindowsAreShiftedByOne) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20; ++i) text += "the cat sat on the mat. ";
  { std::ofstream(dir / "t.txt") << text; }
  DataSpec spec;
  spec.kind = DataKind::kText;
  spec.path = dir / "t.txt";
  spec.context = 16;
  spec.test_fraction = 0.25;
  Splits s = make_datasets(spec);
  const std::set<char> distinct(text.begin(), text.end());
  const std::string vocab(distinct.begin(), distinct.end());  // sorted bytes
  EXPECT_EQ(s.train->num_classes(), static_cast<int64_t>(vocab.size()));
  EXPECT_EQ(s.train->input_dtype(), DType::kI32);
  EXPECT_EQ(s.train->input_shape(), Shape{16});
  EXPECT_EQ(s.train->label_shape(), Shape{16});
  const size_t train_len = text.size() * 3 / 4;
  EXPECT_EQ(s.train->size(), static_cast<int64_t>((train_len - 1) / 16));
  EXPECT_EQ(s.test->size(), static_cast<int64_t>((text.size() - train_len - 1) / 16));
  std::vector<int32_t> x(16), y(16);
  for (int64_t i = 0; i < s.train->size(); ++i) {
    s.train->get(i, x.data(), y.data());
    for (int t = 0; t < 16; ++t) {
      ASSERT_EQ(vocab[x[t]], text[i * 16 + t]);
      ASSERT_EQ(vocab[y[t]], text[i * 16 + t + 1]);
    }
  }
  s.test->get(1, x.data(), y.data());
  EXPECT_EQ(vocab[x[0]], text[train_len + 16]);
  EXPECT_EQ(vocab[y[15]], text[train_len + 32]);
}

TEST(Text, BadFiles) {
  TempDir dir;
  DataSpec spec;
  spec.kind = DataKind::kText;
  spec.context = 8;
  spec.path = dir / "missing.txt";
  expect_io_error(spec, {dir / "missing.txt", "data.path"});
  { std::ofstream(dir / "empty.txt"); }
  spec.path = dir / "empty.txt";
  expect_io_error(spec, {"empty"});
  { std::ofstream(dir / "short.txt") << "abcdefgh"; }  // 8 bytes: no room for the label
  spec.path = dir / "short.txt";
  spec.test_fraction = 0;
  EXPECT_THROW(make_datasets(spec), InvalidArgument);
  { std::ofstream(dir / "nine.txt") << "abcdefghi"; }
  spec.path = dir / "nine.txt";
  EXPECT_EQ(make_datasets(spec).train->size(), 1);
  spec.test_fraction = 0.1;  // 8 train bytes and 1 test byte: too short for either
  EXPECT_THROW(make_datasets(spec), InvalidArgument);
}

TEST(Synthetic, ShapesAndNearestCentreAccuracy) {
  DataSpec spec;
  spec.kind = DataKind::kSynthetic;
  spec.samples = 600;
  spec.features = 16;
  spec.classes = 4;
  spec.test_fraction = 0.25;
  Splits s = make_datasets(spec);
  ASSERT_EQ(s.train->size(), 450);
  ASSERT_EQ(s.test->size(), 150);
  EXPECT_EQ(s.train->input_shape(), Shape{16});
  EXPECT_EQ(s.train->num_classes(), 4);
  // Class means from train classify test: the blobs are (nearly) separable.
  std::vector<double> mean(4 * 16, 0.0);
  std::vector<int> count(4, 0);
  std::vector<float> x(16);
  int32_t y;
  for (int64_t i = 0; i < s.train->size(); ++i) {
    s.train->get(i, x.data(), &y);
    ASSERT_TRUE(y >= 0 && y < 4);
    ++count[y];
    for (int k = 0; k < 16; ++k) mean[y * 16 + k] += x[k];
  }
  for (int c = 0; c < 4; ++c) {
    EXPECT_GT(count[c], 100);
    for (int k = 0; k < 16; ++k) mean[c * 16 + k] /= count[c];
  }
  int correct = 0;
  for (int64_t i = 0; i < s.test->size(); ++i) {
    s.test->get(i, x.data(), &y);
    int best = 0;
    double best_d = 1e300;
    for (int c = 0; c < 4; ++c) {
      double d = 0;
      for (int k = 0; k < 16; ++k) d += (x[k] - mean[c * 16 + k]) * (x[k] - mean[c * 16 + k]);
      if (d < best_d) best_d = d, best = c;
    }
    correct += best == y;
  }
  EXPECT_GT(correct, 140);

  spec.test_fraction = 1.0;
  EXPECT_THROW(make_datasets(spec), InvalidArgument);
}

}  // namespace
}  // namespace tessel::data
