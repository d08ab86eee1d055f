// The parts of predict and serve on their own: the chunk queue hands every chunk out until it
// is written exactly once, also when a worker fails or stalls; the ordered writer resumes after
// its last commit; input files that do not fit the model are refused by name; serve's request
// fast path reads what a JSON document would. (The batcher: batcher_test.cc.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "inputs_json.h"
#include "protocol.h"
#include "tessel/core/error.h"
#include "tessel/infer/chunk_queue.h"
#include "tessel/infer/input.h"
#include "tessel/infer/metrics.h"
#include "tessel/infer/ordered_writer.h"
#include "tessel/infer/output.h"

namespace fs = std::filesystem;

namespace tessel::infer {
namespace {

// n text rows "row i".
class Lines final : public InputReader {
 public:
  explicit Lines(int64_t n) : n_(n) {}
  Rows read(int64_t n) override {
    Rows r;
    for (; r.count < n && at_ < n_; ++r.count) r.lines.push_back("row " + std::to_string(at_++));
    return r;
  }
  int64_t skip(int64_t n) override {
    const int64_t s = std::min(n, n_ - at_);
    at_ += s;
    return s;
  }

 private:
  int64_t n_, at_ = 0;
};

std::string output_of(const Chunk& c) {
  std::string s;
  for (const std::string& l : c.rows.lines) s += l + "\n";
  return s;
}

// Runs a queue over `rows` rows with `replicas` threads; `replica_fn` may fail or stall one.
// Returns the written text.
std::string drain(ChunkQueue& queue, int replicas,
                  const std::function<bool(ChunkQueue&, int, const Chunk&, int)>& replica_fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < replicas; ++r)
    threads.emplace_back([&, r] {
      Chunk c;
      for (int done = 0; queue.take(r, c); ++done)
        if (!replica_fn(queue, r, c, done)) return;
    });
  std::string out;
  std::vector<ChunkQueue::Output> ready;
  int64_t expect = 0;
  try {
    while (queue.next(ready))
      for (const auto& o : ready) {
        EXPECT_EQ(o.id, expect++);
        out += o.bytes;
      }
  } catch (...) {
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();
  return out;
}

std::string all_rows(int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += "row " + std::to_string(i) + "\n";
  return s;
}

TEST(ChunkQueue, EveryRowOnceInOrderForAnyReplicaCount) {
  for (int replicas : {1, 2, 3, 5})
    for (int64_t rows : {0, 1, 7, 100}) {
      Lines in(rows);
      ChunkQueue q(in, 7, 0, replicas, 10);
      EXPECT_EQ(drain(q, replicas,
                      [](ChunkQueue& q, int r, const Chunk& c, int) {
                        q.finish(r, c.id, output_of(c), c.rows.count);
                        return true;
                      }),
                all_rows(rows))
          << replicas << " replicas, " << rows << " rows";
    }
}

TEST(ChunkQueue, AFailedReplicasChunkIsRunByAnother) {
  Lines in(100);
  ChunkQueue q(in, 6, 0, 3, 10);
  Chunk taken;
  ASSERT_TRUE(q.take(1, taken));  // replica 1 dies holding chunk 0
  q.fail(1, "died");
  const std::string out = drain(q, 3, [](ChunkQueue& q, int r, const Chunk& c, int) {
    q.finish(r, c.id, output_of(c), c.rows.count);
    return true;
  });
  EXPECT_EQ(out, all_rows(100));
  EXPECT_EQ(q.reruns(), 1);
  EXPECT_EQ(q.failed(), std::vector<int>{1});
}

TEST(ChunkQueue, AStalledChunkIsRunByAnotherAndItsLateTwinDropped) {
  Lines in(50);
  ChunkQueue q(in, 5, 0, 2, 0.05);
  std::atomic<bool> stalled{false}, late_twin_kept{true};
  const std::string out = drain(q, 2, [&](ChunkQueue& q, int r, const Chunk& c, int) {
    // Whichever replica first takes chunk 1 stalls well past the timeout, then finishes anyway.
    if (c.id == 1 && !stalled.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      late_twin_kept = q.finish(r, c.id, "late twin\n", c.rows.count);
      return false;
    }
    q.finish(r, c.id, output_of(c), c.rows.count);
    return true;
  });
  EXPECT_EQ(out, all_rows(50));
  EXPECT_TRUE(stalled);
  EXPECT_GE(q.reruns(), 1);
  EXPECT_FALSE(late_twin_kept);
}

TEST(ChunkQueue, ResumeSkipsCommittedChunks) {
  Lines in(30);
  ChunkQueue q(in, 4, 3, 2, 10);  // chunks 0-2 (rows 0-11) were written
  Chunk c;
  ASSERT_TRUE(q.take(0, c));
  EXPECT_EQ(c.id, 3);
  EXPECT_EQ(c.rows.lines[0], "row 12");
  Lines short_input(5);
  ChunkQueue bad(short_input, 4, 3, 2, 10);
  std::vector<ChunkQueue::Output> ready;
  EXPECT_THROW(bad.next(ready), InvalidArgument);
}

TEST(ChunkQueue, EveryReplicaFailedIsAnError) {
  Lines in(40);
  ChunkQueue q(in, 4, 0, 2, 10);
  try {
    drain(q, 2, [](ChunkQueue& q, int r, const Chunk&, int) {
      q.fail(r, "boom " + std::to_string(r));
      return false;
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every worker failed"), std::string::npos) << e.what();
  }
}

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessel_infer_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  fs::path dir_;
};

TEST_F(Files, WriterResumesAfterItsLastCommit) {
  const nlohmann::json job = {{"input", "x"}, {"chunk_rows", 2}};
  {
    OrderedWriter w(path("out.csv"), job, "row,v\n", false, 0);
    w.append(0, "0,a\n1,b\n", 2);
    w.commit();
    w.append(1, "2,c\n", 1);  // never committed: the job "dies" here
  }
  {
    OrderedWriter w(path("out.csv"), job, "row,v\n", true, 0);
    EXPECT_EQ(w.next_chunk(), 1);
    EXPECT_EQ(w.rows(), 2);
    w.append(1, "2,c\n3,d\n", 2);
    w.finish();
  }
  EXPECT_EQ(slurp(path("out.csv")), "row,v\n0,a\n1,b\n2,c\n3,d\n");
  OrderedWriter done(path("out.csv"), job, "row,v\n", true, 0);
  EXPECT_TRUE(done.complete());
  EXPECT_THROW(OrderedWriter(path("out.csv"), {{"input", "y"}}, "", true, 0), InvalidArgument);
  EXPECT_THROW(OrderedWriter(path("none.csv"), job, "", true, 0), InvalidArgument);
}

ModelInfo classifier(Shape input) {
  ModelInfo m;
  m.spec.input_shape = input;
  m.spec.num_classes = 3;
  return m;
}

void write_npy(const std::string& p, const std::string& descr, const std::string& shape,
               size_t data_bytes) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += "\n";
  std::ofstream out(p, std::ios::binary);
  out << "\x93NUMPY" << '\x01' << '\x00';
  const uint16_t n = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&n), 2);
  out << header << std::string(data_bytes, '\0');
}

template <typename E>
void expect_throw_with(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    FAIL() << "no error, expected '" << needle << "'";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(Files, InputsThatDoNotFitTheModelAreRefusedByName) {
  const data::DataSpec data;
  write_npy(path("ok.npy"), "<f4", "(5, 4)", 5 * 4 * 4);
  auto r = open_input(path("ok.npy"), classifier({4}), data);
  EXPECT_EQ(r->read(3).count, 3);
  EXPECT_EQ(r->read(3).count, 2);
  EXPECT_EQ(r->read(3).count, 0);
  {  // float64 (numpy's default) and int16 rows are converted, not refused
    std::vector<double> f8(20);
    for (int i = 0; i < 20; ++i) f8[static_cast<size_t>(i)] = 0.25 * i - 2;
    write_npy(path("f8.npy"), "<f8", "(5, 4)", 0);
    std::ofstream(path("f8.npy"), std::ios::binary | std::ios::app)
        .write(reinterpret_cast<const char*>(f8.data()), 20 * 8);
    const Rows rows = open_input(path("f8.npy"), classifier({4}), data)->read(5);
    ASSERT_EQ(rows.count, 5);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(rows.x.data<float>()[i], 0.25f * i - 2) << i;
    write_npy(path("i2.npy"), "<i2", "(5, 4)", 5 * 4 * 2);
    EXPECT_EQ(open_input(path("i2.npy"), classifier({4}), data)->read(5).count, 5);
  }
  write_npy(path("c8.npy"), "<c8", "(5, 4)", 5 * 4 * 8);
  expect_throw_with<InvalidArgument>([&] { open_input(path("c8.npy"), classifier({4}), data); },
                                     "little-endian bool, int, uint or float");
  write_npy(path("wide.npy"), "<f4", "(5, 6)", 5 * 6 * 4);
  expect_throw_with<InvalidArgument>([&] { open_input(path("wide.npy"), classifier({4}), data); },
                                     "has shape");
  write_npy(path("short.npy"), "<f4", "(5, 4)", 3 * 4 * 4);
  expect_throw_with<IoError>([&] { open_input(path("short.npy"), classifier({4}), data)->read(5); },
                             "ends before row");
  std::ofstream(path("junk.npy")) << "not numpy at all";
  expect_throw_with<IoError>([&] { open_input(path("junk.npy"), classifier({4}), data); },
                             "not a .npy file");
  std::ofstream(path("p.txt")) << "a prompt\n";
  expect_throw_with<InvalidArgument>([&] { open_input(path("p.txt"), classifier({4}), data); },
                                     "p.txt");
  std::ofstream(path("x.bin")) << "?";
  expect_throw_with<InvalidArgument>([&] { open_input(path("x.bin"), classifier({4}), data); },
                                     "cannot tell the kind");
  expect_throw_with<IoError>([&] { open_input(path("missing.npy"), classifier({4}), data); },
                             "missing.npy");
}

// A .csv input: by column names for a CSV-trained model (any order, the target ignored), in
// order for any other; blank lines skipped, skip() counting rows; a ragged row or a cell that is
// not a number named by its line.
TEST_F(Files, CsvRowsByNameOrInOrder) {
  const data::DataSpec data;
  std::ofstream(path("r.csv")) << "c,y,a,b\n3,9,1,2\n\n6,9,4,5\r\n9,9,7,8\n";
  ModelInfo named = classifier({3});
  named.input_names = {"a", "b", "c"};
  named.target_names = {"y"};
  auto r = open_input(path("r.csv"), named, data);
  EXPECT_EQ(r->skip(1), 1);
  const Rows rows = r->read(5);
  ASSERT_EQ(rows.count, 2);
  EXPECT_EQ(std::vector<float>(rows.x.data<float>(), rows.x.data<float>() + 6),
            (std::vector<float>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(r->read(5).count, 0);
  std::ofstream(path("plain.csv")) << "p,q,r\n1,2,3\n";
  const Rows plain = open_input(path("plain.csv"), classifier({3}), data)->read(2);
  ASSERT_EQ(plain.count, 1);
  EXPECT_EQ(plain.x.data<float>()[2], 3.0f);
  expect_throw_with<InvalidArgument>(
      [&] { open_input(path("r.csv"), classifier({3}), data); },
      "has 4 columns [c, y, a, b], but the model takes 3 values per row");
  std::ofstream(path("bad.csv")) << "a,b,c\n1,2,3\n1,2\n";
  expect_throw_with<IoError>([&] { open_input(path("bad.csv"), named, data)->read(5); },
                             "line 3 has 2 fields, but the header has 3");
  std::ofstream(path("nan.csv")) << "a,b,c\n1,two,3\n";
  expect_throw_with<IoError>([&] { open_input(path("nan.csv"), named, data)->read(5); },
                             "line 2 column 'b' is not a number, got \"two\"");
}

TEST(Output, RecordsArePureFunctionsOfTheLogits) {
  const float logits[3] = {0.5f, 2.0f, 2.0f};
  const nlohmann::ordered_json r = class_record(logits, 3, 2);
  EXPECT_EQ(r["class"], 1);  // a tie goes to the lower class
  EXPECT_EQ(r["top_k"][1]["class"], 2);
  EXPECT_EQ(r["top_k"].size(), 2u);
  Tensor t = Tensor::empty({1, 3});
  std::copy(logits, logits + 3, t.data<float>());
  using data::Task;
  EXPECT_EQ(format_classes(t, 41, 1, OutputFormat::kCsv, Task::kClassification),
            "41,1,1,0.449816\n");
  EXPECT_EQ(csv_header(false, Task::kClassification, 1, 3), "row,class,top1_class,top1_prob\n");
  // A regression model's single output is the value.
  EXPECT_EQ(format_classes(t.view(1, {2, 1}), 3, 1, OutputFormat::kJsonl, Task::kRegression),
            "{\"row\":3,\"value\":2.0}\n{\"row\":4,\"value\":2.0}\n");
  EXPECT_EQ(format_classes(t.view(0, {1, 1}), 3, 1, OutputFormat::kCsv, Task::kRegression),
            "3,0.5\n");
  EXPECT_EQ(csv_header(false, Task::kRegression, 1, 1), "row,value\n");
  // A multilabel model's outputs are each label's sigmoid probability, labelled 1 from 0.5 on.
  const float ml[3] = {0.5f, -2.0f, 0.0f};
  std::copy(ml, ml + 3, t.data<float>());
  EXPECT_EQ(format_classes(t, 7, 1, OutputFormat::kJsonl, Task::kMultilabel),
            "{\"row\":7,\"probs\":[0.622459,0.119203,0.5],\"labels\":[1,0,1]}\n");
  EXPECT_EQ(format_classes(t, 7, 1, OutputFormat::kCsv, Task::kMultilabel),
            "7,0.622459,0.119203,0.500000\n");
  EXPECT_EQ(csv_header(false, Task::kMultilabel, 1, 3), "row,prob0,prob1,prob2\n");
  EXPECT_THROW(output_format("out.txt"), InvalidArgument);
}

// The serve fast path reads what nlohmann::json's document gives, to the bit, and leaves every
// other body to it.
TEST(ReadInputs, TakesExactlyTheCommonBodyAndReadsItsNumbersAsTheDocumentDoes) {
  const Shape row = {2, 2};
  auto expect_same = [&](const std::string& body) {
    const Tensor x = read_inputs(body, row, 3);
    ASSERT_TRUE(x.defined()) << body;
    const nlohmann::json rows = nlohmann::json::parse(body)["inputs"];
    ASSERT_EQ(x.shape(), (Shape{static_cast<int64_t>(rows.size()), 2, 2})) << body;
    for (size_t i = 0; i < rows.size(); ++i)
      for (size_t j = 0; j < 4; ++j) {
        const float want = rows[i][j].get<float>(), got = x.data<float>()[i * 4 + j];
        EXPECT_EQ(std::memcmp(&want, &got, sizeof want), 0)
            << body << " [" << i << "][" << j << "]";
      }
  };
  expect_same(R"({"inputs": [[1, -2, 0.5, -0.25]]})");
  expect_same(" {\n\t\"inputs\" :[ [ -0 ,-0.0, 2.5E+2, 1e-3 ] ,[0,7,123456789012345,3.4e38]]}\r\n");
  // Runs of digits read eight bytes at a time: 7, 8 and 9 digits, across the 8-byte windows, in
  // the integer and the fraction, and ending at the body's last bytes.
  expect_same(R"({"inputs": [[1234567, 12345678, 123456789, -98765432.123456789]]})");
  expect_same(R"({"inputs": [[0.00000001, 0.1234567890123, 1234567.8901234, 9.99999999e-9]]})");
  expect_same(R"({"inputs": [[1e22, 1.5e-22, -0.000000000000000000000000000001, 7]]})");
  expect_same(R"({"inputs":[[1,2,3,12345678]]})");
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> value(-3, 3);
  char buf[64];
  for (const char* format : {"%.17g", "%.4f", "%.9e", "%g"}) {
    std::string body = "{\"inputs\":[";
    for (int i = 0; i < 3; ++i) {
      body += i ? ",[" : "[";
      for (int j = 0; j < 4; ++j) {
        std::snprintf(buf, sizeof buf, format, value(gen) * std::pow(10.0, j * 9 - 20));
        body += std::string(j ? "," : "") + buf;
      }
      body += "]";
    }
    expect_same(body + "]}");
  }
  // Decimals of up to 15 digits within 10^+-22 take a fast path (m * 10^e): to the bit too, at
  // every magnitude and digit count around its edges.
  std::uniform_int_distribution<int> digits(1, 17), scale(-26, 26);
  for (int k = 0; k < 3000; ++k) {
    std::string body = "{\"inputs\":[[";
    for (int j = 0; j < 4; ++j) {
      const double v = value(gen) * std::pow(10.0, scale(gen));
      std::snprintf(buf, sizeof buf, j % 2 ? "%.*e" : "%.*f",
                    j % 2 ? digits(gen) - 1 : 1 + digits(gen) % 9, v);
      body += std::string(j ? "," : "") + buf;
    }
    expect_same(body + "]]}");
  }
  for (const std::string body :
       {R"({"inputs": [[1, 2, 3, 4]], "x": 1})",
        R"({"x": 1, "inputs": [[1, 2, 3, 4]]})",
        R"({"inputs": []})",
        R"({"inputs": [[1, 2, 3]]})",
        R"({"inputs": [[1, 2, 3, 4, 5]]})",
        R"({"inputs": [[1,2,3,4],[1,2,3,4],[1,2,3,4],[1,2,3,4]]})",  // over max_rows
        R"({"inputs": [[1, 2, 3, "4"]]})",
        R"({"inputs": [[1, 2, 3, 04]]})",
        R"({"inputs": [[1, 2, 3, .4]]})",
        R"({"inputs": [[1, 2, 3, 4.]]})",
        R"({"inputs": [[1, 2, 3, +4]]})",
        R"({"inputs": [[1, 2, 3, 4e]]})",
        R"({"inputs": [[1, 2, 3, NaN]]})",
        R"({"inputs": [[1, 2, 3, 1e999]]})",
        R"({"inputs": [[1, 2, 3, 12345678901234567890]]})",
        R"({"inputs": [[1, 2, 3, 4\u00e9]]})",
        "{\"inputs\": [[1, 2, 3, 4\xc3\xa9]]}",  // UTF-8 bytes right after the digits
        "{\"inputs\": [[1, 2, 3, 12345\x80"
        "678]]}",
        R"({"inputs": [[1, 2, 3, 1234567:]]})",
        R"({"inputs": [[1, 2, 3, -Infinity]]})",
        R"({"inputs": [[[1, 2], [3, 4]]]})",
        R"({"inputs": [[1, 2, 3, 4]])",
        R"({"inputs": [[1, 2, 3, 4]]} x)",
        R"({"input": [[1, 2, 3, 4]]})",
        R"({"inputs": [[1, 2, 3, 4],]})",
        ""})
    EXPECT_FALSE(read_inputs(body, row, 3).defined()) << body;
}

// The KServe v2 fast path gives the tensor the full reader (protocol.h) gives, to the bit, and
// leaves every other body to it.
TEST(ReadInputs, TakesTheCommonV2BodyAsTheFullReaderDoes) {
  ModelInfo info;
  info.spec.kind = nn::ModelKind::kMlp;
  info.spec.input_shape = {2, 2};
  info.spec.num_classes = 3;
  const ModelLimits limits{3, 1, 2};
  for (const std::string body :
       {R"({"inputs": [{"name": "input", "shape": [1, 2, 2], "datatype": "FP32",
            "data": [1, -2, 0.5, 3.4e38]}]})",
        R"({"inputs":[{"data":[1,2,3,4,5,6,7,8.25e-3],"datatype":"FP32","shape":[2,2,2],)"
        R"("name":"input"}]})"}) {
    const Tensor x = read_v2_inputs(body, info.spec.input_shape, limits.max_batch);
    ASSERT_TRUE(x.defined()) << body;
    const Tensor want = read_infer(nlohmann::json::parse(body), "", info, limits).request.x;
    ASSERT_EQ(x.shape(), want.shape()) << body;
    EXPECT_EQ(std::memcmp(x.raw(), want.raw(), x.nbytes()), 0) << body;
  }
  const std::string tensor = R"("name": "input", "datatype": "FP32", "data": [1, 2, 3, 4])";
  const std::string fits = R"({"inputs": [{"shape": [1, 2, 2], )" + tensor + "}]}";
  EXPECT_TRUE(read_v2_inputs(fits, info.spec.input_shape, limits.max_batch).defined()) << fits;
  for (const std::string& body : std::vector<std::string>{
           R"({"inputs": [{"shape": [1, 4], )" + tensor + "}]}",
           R"({"inputs": [{"shape": [1.0, 2, 2], )" + tensor + "}]}",
           R"({"inputs": [{"shape": [2, 2, 2], )" + tensor + "}]}",
           R"({"inputs": [{"shape": [4, 2, 2], )" + tensor + "}]}",  // over max_rows
           R"({"id": "a", "inputs": [{"shape": [1, 2, 2], )" + tensor + "}]}",
           R"({"inputs": [{"shape": [1, 2, 2], "x": 1, )" + tensor + "}]}",
           R"({"inputs": [{"shape": [1, 2, 2], )" + tensor + "}, {}]}",
           R"({"inputs": [{"shape": [1, 2, 2], "name": "input", "datatype": "FP64", )"
           R"("data": [1, 2, 3, 4]}]})",
           R"({"inputs": [{"shape": [1, 2, 2], "name": "inp\u0075t", "datatype": "FP32", )"
           R"("data": [1, 2, 3, 4]}]})",
           R"({"inputs": [{"shape": [1, 2, 2], "name": "input", "datatype": "FP32", )"
           R"("data": [[1, 2], [3, 4]]}]})"})
    EXPECT_FALSE(read_v2_inputs(body, info.spec.input_shape, limits.max_batch).defined()) << body;
}

// The v2 answer, written as text from a request's rows of its batch, is the text of the document
// of their records to the byte: every kind of output and value (probabilities down to 1e-06 and
// 0, integers, floats, strings to escape), from rows past the batch's first.
TEST(InferAnswer, IsTheTextOfItsRecordsDocument) {
  using ojson = nlohmann::ordered_json;
  const float logits[] = {9.0f, 0.0f,   0.0f,  0.0f,    // another request's row
                          2.0f, -14.0f, 0.5f,  -40.0f,  //
                          0.0f, 0.0f,   9.25f, 40.0f};
  BatchOutput values{Tensor::empty({3, 4}), {}};
  std::memcpy(values.values.raw(), logits, sizeof logits);
  const BatchOutput texts{{}, {"x", "a \"b\"\n"}};
  const BatchRows two{&values, 1, 2}, text{&texts, 1, 1};
  // The document, built as a tree from the rows' records: each output's metadata, then its data
  // row by row.
  auto document = [](const InferCall& call, const BatchRows& rows, data::Task task) {
    std::vector<ojson> records;
    for (int64_t i = 0; i < rows.count; ++i)
      records.push_back(rows.batch->values.defined()
                            ? output_record(rows.values(i), rows.width(), 3, task)
                            : ojson{{"text", rows.text(i)}});
    ojson out = {{"model_name", "m\"1"}, {"model_version", "1"}};
    if (!call.id.is_null()) out["id"] = call.id;
    out["outputs"] = ojson::array();
    const auto n = static_cast<int64_t>(records.size());
    for (const std::string& o : call.outputs) {
      ojson t = {{"name", o}}, data = ojson::array();
      if (o == "text" || o == "class" || o == "value") {
        t["datatype"] = o == "text" ? "BYTES" : o == "value" ? "FP32" : "INT64";
        t["shape"] = {n};
        for (const ojson& r : records) data.push_back(r[o]);
      } else if (o == "probs" || o == "labels") {
        t["datatype"] = o == "probs" ? "FP64" : "INT64";
        t["shape"] = {n, static_cast<int64_t>(records[0][o].size())};
        for (const ojson& r : records) data.insert(data.end(), r[o].begin(), r[o].end());
      } else {
        t["datatype"] = o == "top_k_class" ? "INT64" : "FP64";
        t["shape"] = {n, static_cast<int64_t>(records[0]["top_k"].size())};
        for (const ojson& r : records)
          for (const ojson& c : r["top_k"])
            data.push_back(c[o == "top_k_class" ? "class" : "prob"]);
      }
      t["data"] = std::move(data);
      out["outputs"].push_back(std::move(t));
    }
    return dump_json(out) + "\n";
  };
  const auto classification = data::Task::kClassification;
  InferCall call;
  call.outputs = {"class", "top_k_class", "top_k_prob"};
  EXPECT_EQ(infer_answer("m\"1", call, two, 3, classification).body,
            document(call, two, classification));
  call.id = "r\"1";
  call.outputs = {"top_k_prob", "class"};
  EXPECT_EQ(infer_answer("m\"1", call, two, 3, classification).body,
            document(call, two, classification));
  call.outputs = {"labels", "probs"};
  EXPECT_EQ(infer_answer("m\"1", call, two, 3, data::Task::kMultilabel).body,
            document(call, two, data::Task::kMultilabel));
  call.outputs = {"value"};
  EXPECT_EQ(infer_answer("m\"1", call, two, 3, data::Task::kRegression).body,
            document(call, two, data::Task::kRegression));
  call.outputs = {"text"};
  EXPECT_EQ(infer_answer("m\"1", call, text, 3, classification).body,
            document(call, text, classification));
}

}  // namespace
}  // namespace tessel::infer
