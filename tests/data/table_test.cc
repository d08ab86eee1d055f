// Tables (kinds npy and csv): .npy/.npz written by numpy in every dtype it saves, a checked-in
// numpy .npz, CSV with names, quotes and CRLF; class counts, the seeded split and a separate
// test file; per-feature normalisation; and each malformed input's error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tessel/data/dataset.h"
#include "tessel/data/loader.h"
#include "tessel/data/npy.h"

namespace tessel::data {
namespace {

namespace fs = std::filesystem;

class Table : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessel_table_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  // Runs python code with numpy as np and `d` the test folder; false when numpy is missing.
  bool numpy(const std::string& code) const {
    if (std::system("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") != 0) return false;
    const std::string script = path("make.py");
    std::ofstream(script) << "import numpy as np\nd = '" << dir_.string() << "/'\n" << code;
    EXPECT_EQ(std::system(("/usr/bin/python3 " + script).c_str()), 0) << code;
    return true;
  }
  DataSpec spec(DataKind kind, const std::string& name) const {
    DataSpec s;
    s.kind = kind;
    s.path = path(name);
    s.test_fraction = 0;
    return s;
  }
  fs::path dir_;
};

template <typename E>
void expect_error(const DataSpec& spec, const std::vector<std::string>& parts) {
  try {
    make_datasets(spec);
    FAIL() << "expected an error with " << parts[0];
  } catch (const E& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks \"" << p << "\": " << e.what();
  }
}

std::vector<float> row(const Dataset& d, int64_t i, int32_t* y) {
  std::vector<float> x(static_cast<size_t>(shape_numel(d.input_shape())));
  d.get(i, x.data(), y);
  return x;
}

// Every dtype numpy saves, .npy 1.0 and 2.0, savez and savez_compressed: values as numpy has
// them, converted to f32.
TEST_F(Table, NumpyWrittenArraysOfEveryDtypeReadBack) {
  const std::vector<std::string> dtypes = {"f2", "f4", "f8", "i1", "i2", "i4",
                                           "i8", "u1", "u2", "u4", "u8", "?"};
  std::string code = "a = np.arange(12).reshape(3, 4) * 1.5\n";
  for (const std::string& t : dtypes)
    code += "np.save(d + '" + t + ".npy', a.astype('" + t + "'))\n";
  code +=
      "np.lib.format.write_array(open(d + 'v2.npy', 'wb'), a.astype('<f8'), version=(2, 0))\n"
      "np.savez(d + 'plain.npz', x=a.astype('i4'), y=np.arange(3))\n"
      "np.savez_compressed(d + 'deflated.npz', x=a.astype('f8'), y=np.arange(3))\n";
  if (!numpy(code)) GTEST_SKIP() << "/usr/bin/python3 has no numpy (apt-get install python3-numpy)";
  for (const std::string& t : dtypes) {
    const NpyArray a = read_npy(path(t + ".npy"));
    ASSERT_EQ(a.shape, (std::vector<int64_t>{3, 4})) << t;
    for (int i = 0; i < 12; ++i) {
      const double v = i * 1.5;
      const double want = t == "?" ? (v != 0) : t[0] == 'f' ? v : std::floor(v);
      EXPECT_EQ(a.values[static_cast<size_t>(i)], static_cast<float>(want)) << t << " " << i;
    }
  }
  EXPECT_EQ(read_npy(path("v2.npy")).values[11], 16.5f);
  EXPECT_EQ(read_npz_member(path("plain.npz"), "x").values[11], 16.0f);
  EXPECT_EQ(read_npz_member(path("deflated.npz"), "x").values[11], 16.5f);
  EXPECT_EQ(read_npz_member(path("deflated.npz"), "y").shape, (std::vector<int64_t>{3}));
  EXPECT_THROW(read_npz_member(path("deflated.npz"), "z"), InvalidArgument);
}

// A numpy.savez_compressed archive kept in the tree (int16 x, int64 y), so that the zip and
// deflate path is checked where numpy is not installed.
TEST_F(Table, CheckedInNpzTrainsAsATable) {
  DataSpec s = spec(DataKind::kNpy, "");
  s.path = std::string(TESSEL_SOURCE_DIR) + "/tests/data/fixtures/table.npz";
  const Splits sp = make_datasets(s);
  ASSERT_EQ(sp.train->size(), 4);
  EXPECT_EQ(sp.train->num_classes(), 3);
  EXPECT_EQ(sp.train->input_shape(), Shape{3});
  ASSERT_EQ(sp.input_mean.size(), 3u);
  EXPECT_FLOAT_EQ(sp.input_mean[0], 0.5f);  // (1 + 4 + 7 - 10) / 4
  int32_t y = -1;
  const std::vector<float> x = row(*sp.train, 1, &y);
  EXPECT_EQ(y, 2);
  EXPECT_FLOAT_EQ(x[0], (4 - 0.5f) / sp.input_std[0]);
}

TEST_F(Table, CsvByColumnNameNormalisedPerFeature) {
  write("t.csv",
        "a, \"label\",b\r\n1,0,10\r\n\r\n3, 2 ,10\n5,1,10\n7,14,10\n");  // b is constant
  DataSpec s = spec(DataKind::kCsv, "t.csv");
  s.target = "label";
  const Splits sp = make_datasets(s);
  ASSERT_EQ(sp.train->size(), 4);
  EXPECT_EQ(sp.train->num_classes(), 15);
  EXPECT_EQ(sp.test, nullptr);
  EXPECT_EQ(sp.input_mean, (std::vector<float>{4, 10}));
  EXPECT_FLOAT_EQ(sp.input_std[0], std::sqrt(5.0f));
  EXPECT_EQ(sp.input_std[1], 1.0f);  // a constant feature passes through centred
  int32_t y = -1;
  const std::vector<float> x = row(*sp.train, 3, &y);
  EXPECT_EQ(y, 14);
  EXPECT_FLOAT_EQ(x[0], 3 / std::sqrt(5.0f));
  EXPECT_EQ(x[1], 0.0f);
  s.classes = 20;
  EXPECT_EQ(make_datasets(s).train->num_classes(), 20);
}

// The held-out rows are a seeded draw (the same for the same seed), disjoint from the train
// rows; a test_path table replaces the draw and is normalised by the train rows' statistics.
TEST_F(Table, SplitBySeedOrByTestFile) {
  std::string text = "f,y\n";
  for (int i = 0; i < 40; ++i) text += std::to_string(i) + "," + std::to_string(i % 3) + "\n";
  write("t.csv", text);
  DataSpec s = spec(DataKind::kCsv, "t.csv");
  s.test_fraction = 0.25;
  auto test_rows = [&](uint64_t seed) {
    s.seed = seed;
    const Splits sp = make_datasets(s);
    EXPECT_EQ(sp.train->size() + sp.test->size(), 40);
    std::vector<float> got;
    for (int64_t i = 0; i < sp.test->size(); ++i) {
      int32_t y;
      got.push_back(row(*sp.test, i, &y)[0] * sp.input_std[0] + sp.input_mean[0]);
    }
    return got;
  };
  EXPECT_EQ(test_rows(1).size(), 10u);
  EXPECT_EQ(test_rows(1), test_rows(1));
  EXPECT_NE(test_rows(1), test_rows(2));
  write("test.csv", "f,y\n100,2\n");
  s.test_path = path("test.csv");
  const Splits sp = make_datasets(s);
  EXPECT_EQ(sp.train->size(), 40);
  ASSERT_EQ(sp.test->size(), 1);
  int32_t y;
  EXPECT_FLOAT_EQ(row(*sp.test, 0, &y)[0], (100 - 19.5f) / sp.input_std[0]);
  write("wide.csv", "f,g,y\n1,2,0\n");
  s.test_path = path("wide.csv");
  expect_error<InvalidArgument>(s, {"wide.csv", "has 2 features per row, got 1"});
}

TEST_F(Table, NpyTableTargetColumnByNumber) {
  if (!numpy("np.save(d + 't.npy', np.array([[1, 0, 5], [2, 1, 6], [3, 1, 9]], dtype='f8'))\n"))
    GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  DataSpec s = spec(DataKind::kNpy, "t.npy");
  s.target = "1";
  const Splits sp = make_datasets(s);
  EXPECT_EQ(sp.train->input_shape(), Shape{2});
  EXPECT_EQ(sp.train->num_classes(), 2);
  s.target = "3";
  expect_error<InvalidArgument>(s, {"must be a column number in [0, 3), got '3'"});
  s.target = "label";
  expect_error<InvalidArgument>(s, {"got 'label'"});
  s.target = "";  // the last column: 5, 6, 9 as class labels
  EXPECT_EQ(make_datasets(s).train->num_classes(), 10);
}

// data.task = regression: f32 targets as they are in the file, one output, and batches whose y
// is f32.
TEST_F(Table, RegressionTargetsStayF32) {
  write("r.csv", "a,price\n1,2.5\n2,-7.25\n3,1e3\n");
  DataSpec s = spec(DataKind::kCsv, "r.csv");
  s.task = Task::kRegression;
  const Splits sp = make_datasets(s);
  EXPECT_EQ(sp.train->label_dtype(), DType::kF32);
  EXPECT_EQ(sp.train->num_classes(), 1);
  DataLoader loader(sp.train, LoaderOptions{.batch = 3, .shuffle = false, .prefetch = 0});
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_EQ(b.y.dtype(), DType::kF32);
  EXPECT_EQ(b.y.data<float>()[1], -7.25f);
  EXPECT_EQ(b.y.data<float>()[2], 1000.0f);
  EXPECT_FLOAT_EQ(b.x.data<float>()[2], std::sqrt(1.5f));  // (3 - 2) / sqrt(2/3)
  write("nan.csv", "a,price\n1,nan\n");
  s.path = path("nan.csv");
  expect_error<InvalidArgument>(s, {"nan.csv row 0 has target nan", "missing targets"});
}

// data.task = multilabel: the label columns by name or prefix (CSV) or number (.npy), an .npz
// y of [N, K]; batches of y [B, K] f32; the names kept for predict; labels other than 0/1 and
// a missing data.target refused.
TEST_F(Table, MultilabelTargetsByNamePrefixOrNumber) {
  write("m.csv", "tag_b,a,tag_c,b\n1,1,0,10\n0,2,1,20\n1,3,1,30\n");
  DataSpec s = spec(DataKind::kCsv, "m.csv");
  s.task = Task::kMultilabel;
  for (const std::string target : {"tag_b,tag_c", "tag_*"}) {
    s.target = target;
    const Splits sp = make_datasets(s);
    EXPECT_EQ(sp.train->task(), Task::kMultilabel);
    EXPECT_EQ(sp.train->num_classes(), 2);
    EXPECT_EQ(sp.train->input_shape(), Shape{2});
    EXPECT_EQ(sp.train->label_shape(), Shape{2});
    EXPECT_EQ(sp.input_names, (std::vector<std::string>{"a", "b"}));
    EXPECT_EQ(sp.target_names, (std::vector<std::string>{"tag_b", "tag_c"}));
    DataLoader loader(sp.train, LoaderOptions{.batch = 3, .shuffle = false, .prefetch = 0});
    Batch b;
    ASSERT_TRUE(loader.next(b));
    ASSERT_EQ(b.y.dtype(), DType::kF32);
    ASSERT_EQ(b.y.shape(), (Shape{3, 2}));
    const std::vector<float> want = {1, 0, 0, 1, 1, 1};
    EXPECT_EQ(std::vector<float>(b.y.data<float>(), b.y.data<float>() + 6), want) << target;
  }
  write("m.npy", std::string("\x93NUMPY\x01\x00\x76\x00", 10) +
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }" +
                     std::string(58, ' ') + "\n");
  {
    const float rows[8] = {0.5f, 1, 7, 0, -0.5f, 0, 8, 1};
    std::ofstream(path("m.npy"), std::ios::app | std::ios::binary)
        .write(reinterpret_cast<const char*>(rows), sizeof rows);
  }
  DataSpec n = spec(DataKind::kNpy, "m.npy");
  n.task = Task::kMultilabel;
  n.target = "1,3";
  const Splits np = make_datasets(n);
  EXPECT_EQ(np.train->num_classes(), 2);
  EXPECT_EQ(np.train->input_shape(), Shape{2});
  float x[2], y[2];
  np.train->get(1, x, reinterpret_cast<int32_t*>(y));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 1.0f);
  if (numpy("np.savez(d + 'm.npz', x=np.arange(12.).reshape(4, 3), "
            "y=np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=np.uint8))\n")) {
    DataSpec z = spec(DataKind::kNpy, "m.npz");
    z.task = Task::kMultilabel;
    EXPECT_EQ(make_datasets(z).train->label_shape(), Shape{2});
  }

  s.target = "";
  expect_error<InvalidArgument>(
      s, {"multilabel takes its label columns from data.target", "tag_b, a, tag_c, b", "label_*"});
  s.target = "tag_*,nope";
  expect_error<InvalidArgument>(s, {"has no column 'nope'"});
  s.target = "tag_b,a";
  expect_error<InvalidArgument>(s, {"row 1 has label 2 in target column 1", "0 or 1"});
  n.target = "1,9";
  expect_error<InvalidArgument>(n, {"column numbers separated by commas in [0, 4), got '1,9'"});
}

TEST_F(Table, EachBadInputNamesTheFileTheLineAndTheFix) {
  write("ragged.csv", "a,b,y\n1,2,0\n3,1\n");
  expect_error<IoError>(spec(DataKind::kCsv, "ragged.csv"),
                        {"ragged.csv line 3 has 2 fields", "ragged row", "header has 3"});
  write("text.csv", "a,b,y\n1,2,0\n1,two,1\n");
  expect_error<IoError>(spec(DataKind::kCsv, "text.csv"),
                        {"text.csv line 3 column 'b' is not a number, got \"two\""});
  DataSpec s = spec(DataKind::kCsv, "text.csv");
  s.target = "label";
  expect_error<InvalidArgument>(
      s, {"has no column 'label', got columns [a, b, y]", "set data.target"});
  write("float.csv", "a,y\n1,0.5\n");
  expect_error<InvalidArgument>(spec(DataKind::kCsv, "float.csv"),
                                {"float.csv row 0 has target 0.5", "not a class label"});
  write("nan.csv", "a,y\n1,0\nnan,1\n");
  expect_error<InvalidArgument>(spec(DataKind::kCsv, "nan.csv"), {"row 1 feature 0 is nan"});
  write("empty.csv", "");
  expect_error<IoError>(spec(DataKind::kCsv, "empty.csv"), {"empty.csv is empty"});
  write("header.csv", "a,y\n");
  expect_error<IoError>(spec(DataKind::kCsv, "header.csv"), {"no rows"});
  expect_error<IoError>(spec(DataKind::kCsv, "missing.csv"),
                        {"missing.csv is not a readable file"});
  write("bad.npy", "\x93NUMPX garbage");
  expect_error<IoError>(spec(DataKind::kNpy, "bad.npy"), {"bad.npy is not a .npy file"});
  write("short.npy", std::string("\x93NUMPY\x01\x00\x40\x00", 10) + "{'descr'");
  expect_error<IoError>(spec(DataKind::kNpy, "short.npy"),
                        {"short.npy has a .npy header of 64 bytes"});
  auto npy = [](const std::string& dict, size_t data_bytes) {
    std::string h = dict;
    h.resize(118, ' ');
    h += '\n';
    return std::string("\x93NUMPY\x01\x00\x77\x00", 10) + h + std::string(data_bytes, '\0');
  };
  write("fortran.npy", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16));
  expect_error<InvalidArgument>(spec(DataKind::kNpy, "fortran.npy"),
                                {"fortran_order True", "C order"});
  write("complex.npy", npy("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 2), }", 32));
  expect_error<InvalidArgument>(spec(DataKind::kNpy, "complex.npy"), {"descr '<c8'"});
  write("cut.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 12));
  expect_error<IoError>(spec(DataKind::kNpy, "cut.npy"),
                        {"cut.npy holds fewer elements", "truncated"});
  write("flat.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", 16));
  expect_error<InvalidArgument>(spec(DataKind::kNpy, "flat.npy"),
                                {"flat.npy has shape [4]", "2-D"});
  write("broken.npz", "PK\x03\x04 not a zip at all");
  expect_error<IoError>(spec(DataKind::kNpy, "broken.npz"), {"broken.npz is not a readable .npz"});
  std::ifstream fixture(std::string(TESSEL_SOURCE_DIR) + "/tests/data/fixtures/table.npz",
                        std::ios::binary);
  std::string npz{std::istreambuf_iterator<char>(fixture), {}};
  npz[60] ^= 0x55;  // inside the first member's deflate stream
  write("flipped.npz", npz);
  expect_error<IoError>(spec(DataKind::kNpy, "flipped.npz"), {"flipped.npz", "member x.npy"});
  DataSpec few = spec(DataKind::kNpy, "");
  few.path = std::string(TESSEL_SOURCE_DIR) + "/tests/data/fixtures/table.npz";
  few.classes = 2;
  expect_error<InvalidArgument>(few, {"data.classes = 2 is too few", "at least 3"});
  few.classes = 0;
  few.test_fraction = 0.9;
  expect_error<InvalidArgument>(few, {"too few to hold out test_fraction = 0.9"});
}

}  // namespace
}  // namespace tessel::data
