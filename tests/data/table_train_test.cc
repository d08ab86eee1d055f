// Users' tables end to end: `tessel train` on a float64 .npy (3 classes) and a CSV (15 classes)
// whose features sit far from zero at scales from 1 to 100, then `tessel predict` on raw rows
// (a float64 .npy, as numpy saves by default) and `tessel serve` on the same raw rows in JSON:
// both classify the held-out rows well (only possible through the stored normalisation) and
// give the same probabilities. The CSV-trained model also predicts a CSV read by column names;
// regression and multilabel tables predict values and per-label probabilities the same way.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tessel/config/config.h"
#include "tessel/infer/server.h"

namespace tessel::data {
namespace {

namespace fs = std::filesystem;

constexpr int kFeatures = 8;
const std::string kTessel = std::string(TESSEL_BINARY_DIR) + "/apps/tessel/tessel";

struct Result {
  int exit_code = -1;
  std::string output;
};

Result run(const std::string& args) {
  Result r;
  FILE* p = popen((kTessel + " " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Gaussian blobs, `classes` of them, in raw units: feature k is 1000 + k * 37 + (k + 1) * 12 *
// (centre + noise), so a model that saw unnormalised rows would see nothing but the offset.
struct Blobs {
  std::vector<std::vector<double>> x;
  std::vector<int> y;
};

Blobs blobs(int classes, int rows, unsigned seed) {
  std::mt19937 gen(7);  // the same centres for every draw
  std::normal_distribution<double> normal;
  std::vector<double> centres(static_cast<size_t>(classes * kFeatures));
  for (double& c : centres) c = 3 * normal(gen);
  gen.seed(seed);
  Blobs b;
  for (int i = 0; i < rows; ++i) {
    const int c = i % classes;
    std::vector<double> row;
    for (int k = 0; k < kFeatures; ++k)
      row.push_back(1000 + k * 37 + (k + 1) * 12 * (centres[c * kFeatures + k] + normal(gen)));
    b.x.push_back(row);
    b.y.push_back(c);
  }
  return b;
}

// A float64 .npy [rows, kFeatures (+ 1 with the label last)].
void write_npy(const std::string& path, const Blobs& b, bool with_label) {
  const int cols = kFeatures + (with_label ? 1 : 0);
  std::string h = "{'descr': '<f8', 'fortran_order': False, 'shape': (" +
                  std::to_string(b.x.size()) + ", " + std::to_string(cols) + "), }";
  h.resize(118, ' ');
  h += '\n';
  std::ofstream out(path, std::ios::binary);
  out << std::string("\x93NUMPY\x01\x00\x77\x00", 10) << h;
  for (size_t r = 0; r < b.x.size(); ++r) {
    std::vector<double> row = b.x[r];
    if (with_label) row.push_back(b.y[r]);
    out.write(reinterpret_cast<const char*>(row.data()),
              static_cast<std::streamsize>(row.size() * sizeof(double)));
  }
}

void write_csv(const std::string& path, const Blobs& b) {
  std::ofstream out(path);
  for (int k = 0; k < kFeatures; ++k) out << "f" << k << ",";
  out << "species\n";
  out.precision(17);
  for (size_t r = 0; r < b.x.size(); ++r) {
    for (double v : b.x[r]) out << v << ",";
    out << b.y[r] << "\n";
  }
}

// The answers of `tessel serve` of the run (in this process) to JSON bodies POSTed in order.
std::vector<httplib::Result> serve(const std::string& config, const std::string& run,
                                   const std::vector<std::pair<std::string, std::string>>& posts) {
  infer::Server server(train::load_config(config), run, 1);
  const int port = server.bind(0);
  std::thread serving([&] { server.run(); });
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30);
  std::vector<httplib::Result> replies;
  for (const auto& [route, body] : posts)
    replies.push_back(client.Post(route, body, "application/json"));
  server.stop();
  serving.join();
  return replies;
}

class TableTrain : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessel_table_train_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Trains the config at path(config) into path("run"), predicts path("raw.npy") with it and
  // returns the records of the predictions (one per row).
  std::vector<nlohmann::json> train_and_predict(const std::string& config) const {
    const Result trained = run("train " + path(config) + " --quiet --run-dir " + path("run"));
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    const Result predicted = run("predict " + path(config) + " --checkpoint " + path("run") +
                                 " --input " + path("raw.npy") + " --output " + path("p.jsonl"));
    EXPECT_EQ(predicted.exit_code, 0) << predicted.output;
    std::vector<nlohmann::json> records;
    std::ifstream in(path("p.jsonl"));
    for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
    return records;
  }
  // Predict of the trained csv model on a CSV of `test`'s rows, its columns written in the
  // order `columns` (f0.. f7, species, or any other name: a column of zeros) into csv.jsonl.
  Result predict_csv(const Blobs& test, const std::vector<std::string>& columns) const {
    std::ofstream out(path("rows.csv"));
    for (size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c];
    out << "\n";
    out.precision(17);
    for (size_t r = 0; r < test.x.size(); ++r) {
      for (size_t c = 0; c < columns.size(); ++c) {
        out << (c ? "," : "");
        if (columns[c] == "species")
          out << test.y[r];
        else if (columns[c][0] == 'f')
          out << test.x[r][static_cast<size_t>(std::stoi(columns[c].substr(1)))];
        else
          out << 0;
      }
      out << "\n";
    }
    out.close();
    return run("predict " + path("c.toml") + " --checkpoint " + path("run") + " --input " +
               path("rows.csv") + " --output " + path("csv.jsonl"));
  }
  // A CSV input is read by column names, in any order, with the target column ignored: the
  // same records as the .npy of the same rows; a missing or unknown column is named.
  void expect_csv_input_reads_columns_by_name(const Blobs& test,
                                              const std::vector<nlohmann::json>& want) const {
    const Result ok =
        predict_csv(test, {"species", "f7", "f6", "f5", "f4", "f3", "f2", "f1", "f0"});
    ASSERT_EQ(ok.exit_code, 0) << ok.output;
    std::ifstream in(path("csv.jsonl"));
    size_t r = 0;
    for (std::string line; std::getline(in, line); ++r) {
      ASSERT_LT(r, want.size());
      const nlohmann::json got = nlohmann::json::parse(line);
      EXPECT_EQ(got["class"], want[r]["class"]) << r;
      EXPECT_NEAR(got["top_k"][0]["prob"].get<double>(), want[r]["top_k"][0]["prob"].get<double>(),
                  1e-5)
          << r;
    }
    EXPECT_EQ(r, want.size());
    const Result missing = predict_csv(test, {"f0", "f1", "f2", "f4", "f5", "f6", "f7"});
    EXPECT_NE(missing.exit_code, 0);
    EXPECT_NE(missing.output.find("lacks the feature columns [f3]"), std::string::npos)
        << missing.output;
    const Result extra =
        predict_csv(test, {"f0", "f1", "f2", "f3", "colour", "f4", "f5", "f6", "f7"});
    EXPECT_NE(extra.exit_code, 0);
    EXPECT_NE(extra.output.find("not trained on (or repeated) [colour]"), std::string::npos)
        << extra.output;
  }
  fs::path dir_;
};

TEST_P(TableTrain, PredictAndServeTakeRawRowsAndAgree) {
  const bool csv = GetParam() == "csv";
  const int classes = csv ? 15 : 3;
  const Blobs train = blobs(classes, 40 * classes, 1), test = blobs(classes, 60, 2);
  const std::string table = path(csv ? "train.csv" : "train.npy");
  csv ? write_csv(table, train) : write_npy(table, train, true);
  write_npy(path("raw.npy"), test, false);
  std::ofstream(path("c.toml")) << "name = \"table\"\nseed = 1\n[model]\nkind = \"mlp\"\n"
                                << "hidden = [32]\n[data]\nkind = \"" << GetParam()
                                << "\"\npath = \"" << table << "\"\n"
                                << (csv ? "target = \"species\"\n" : "")
                                << "[optim]\nkind = \"adamw\"\nlr = 0.01\n"
                                << "[train]\nbatch = 32\nepochs = 15\n";
  const std::vector<nlohmann::json> records = train_and_predict("c.toml");
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(records.size(), test.x.size());
  int correct = 0;
  for (size_t r = 0; r < records.size(); ++r) correct += records[r]["class"] == test.y[r];
  EXPECT_GE(correct, 54) << "of 60 raw rows";  // unnormalised rows would score near chance
  if (csv) expect_csv_input_reads_columns_by_name(test, records);

  const auto replies = serve(path("c.toml"), path("run"),
                             {{"/v1/predict", nlohmann::json{{"inputs", test.x}}.dump()}});
  const httplib::Result& res = replies[0];
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto outputs = nlohmann::json::parse(res->body)["outputs"];
  ASSERT_EQ(outputs.size(), records.size());
  for (size_t r = 0; r < records.size(); ++r) {
    EXPECT_EQ(outputs[r]["class"], records[r]["class"]) << r;
    for (size_t j = 0; j < records[r]["top_k"].size(); ++j)
      EXPECT_NEAR(outputs[r]["top_k"][j]["prob"].get<double>(),
                  records[r]["top_k"][j]["prob"].get<double>(), 2e-6)
          << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, TableTrain, ::testing::Values("npy", "csv"));

// data.task = regression: a linear target of the raw features (plus noise) is learnt; predict
// and serve answer raw rows with the same values, close to the truth.
TEST_F(TableTrain, RegressionPredictsValuesFromRawRows) {
  Blobs train = blobs(1, 400, 3), test = blobs(1, 50, 4);
  std::mt19937 gen(5);
  std::normal_distribution<double> noise(0, 0.1);
  std::vector<double> truth;
  for (Blobs* b : {&train, &test})
    for (size_t r = 0; r < b->x.size(); ++r) {
      double v = 0;
      for (int k = 0; k < kFeatures; ++k) v += (k % 3 - 1) * (b->x[r][k] - 1000 - k * 37) / (k + 1);
      b->y[r] = 0;
      if (b == &test) truth.push_back(v / 12);
      b->x[r].push_back(v / 12 + noise(gen));  // the target column
    }
  std::ofstream csv(path("r.csv"));
  csv.precision(17);
  for (int k = 0; k < kFeatures; ++k) csv << "f" << k << ",";
  csv << "y\n";
  for (const auto& row : train.x) {
    for (size_t k = 0; k < row.size(); ++k) csv << row[k] << (k + 1 < row.size() ? "," : "\n");
  }
  csv.close();
  for (auto& row : test.x) row.pop_back();
  write_npy(path("raw.npy"), test, false);
  std::ofstream(path("r.toml")) << "name = \"reg\"\nseed = 1\n[model]\nkind = \"mlp\"\n"
                                << "hidden = [32]\n[data]\nkind = \"csv\"\ntask = \"regression\"\n"
                                << "path = \"" << path("r.csv") << "\"\n"
                                << "[optim]\nkind = \"adamw\"\nlr = 0.01\n"
                                << "[train]\nbatch = 32\nepochs = 30\n";
  const std::vector<nlohmann::json> records = train_and_predict("r.toml");
  ASSERT_FALSE(HasFailure());
  std::vector<double> values;
  for (const auto& record : records) values.push_back(record["value"].get<double>());
  ASSERT_EQ(values.size(), truth.size());
  double err = 0, var = 0;
  for (size_t r = 0; r < truth.size(); ++r) {
    err += (values[r] - truth[r]) * (values[r] - truth[r]);
    var += truth[r] * truth[r];
  }
  EXPECT_LT(err, 0.05 * var) << "squared error " << err << " against " << var;

  std::vector<double> flat;
  for (const auto& row : test.x) flat.insert(flat.end(), row.begin(), row.end());
  const nlohmann::json v2 = {{"inputs",
                              {{{"name", "input"},
                                {"shape", {test.x.size(), kFeatures}},
                                {"datatype", "FP64"},
                                {"data", flat}}}}};
  const auto replies = serve(path("r.toml"), path("run"),
                             {{"/v1/predict", nlohmann::json{{"inputs", test.x}}.dump()},
                              {"/v2/models/reg/infer", v2.dump()}});
  const httplib::Result &res = replies[0], &res2 = replies[1];
  ASSERT_TRUE(res && res2);
  ASSERT_EQ(res->status, 200) << res->body;
  ASSERT_EQ(res2->status, 200) << res2->body;
  const auto outputs = nlohmann::json::parse(res->body)["outputs"];
  const auto tensor = nlohmann::json::parse(res2->body)["outputs"][0];
  EXPECT_EQ(tensor["name"], "value");
  ASSERT_EQ(outputs.size(), values.size());
  ASSERT_EQ(tensor["data"].size(), values.size());
  for (size_t r = 0; r < values.size(); ++r) {
    EXPECT_NEAR(outputs[r]["value"].get<double>(), values[r], 1e-5 * (1 + std::abs(values[r])));
    EXPECT_EQ(tensor["data"][r], outputs[r]["value"]);
  }
}

// data.task = multilabel: three labels per row (the blob's class has a bit set: classes 1, 3,
// 5, ... for label 0, and so on), columns named by a prefix; predict answers each label's
// probability for raw rows, right for nearly every label, and serve (/v1 and /v2) the same.
TEST_F(TableTrain, MultilabelPredictsEachLabelsProbability) {
  const int classes = 8;
  const Blobs train = blobs(classes, 40 * classes, 5), test = blobs(classes, 64, 6);
  std::ofstream csv(path("m.csv"));
  csv.precision(17);
  for (int k = 0; k < kFeatures; ++k) csv << "f" << k << ",";
  csv << "has_a,has_b,has_c\n";
  for (size_t r = 0; r < train.x.size(); ++r) {
    for (double v : train.x[r]) csv << v << ",";
    const int c = train.y[r];
    csv << (c & 1) << "," << ((c >> 1) & 1) << "," << ((c >> 2) & 1) << "\n";
  }
  csv.close();
  write_npy(path("raw.npy"), test, false);
  std::ofstream(path("m.toml")) << "name = \"tags\"\nseed = 1\n[model]\nkind = \"mlp\"\n"
                                << "hidden = [32]\n[data]\nkind = \"csv\"\ntask = \"multilabel\"\n"
                                << "target = \"has_*\"\npath = \"" << path("m.csv") << "\"\n"
                                << "[optim]\nkind = \"adamw\"\nlr = 0.01\n"
                                << "[train]\nbatch = 32\nepochs = 15\n";
  const std::vector<nlohmann::json> records = train_and_predict("m.toml");
  ASSERT_FALSE(HasFailure());
  ASSERT_EQ(records.size(), test.x.size());
  int right = 0;
  for (size_t r = 0; r < records.size(); ++r) {
    ASSERT_EQ(records[r]["probs"].size(), 3u) << records[r].dump();
    for (int k = 0; k < 3; ++k) {
      const double p = records[r]["probs"][k].get<double>();
      EXPECT_EQ(records[r]["labels"][k].get<int>(), p >= 0.5 ? 1 : 0);
      right += (p >= 0.5) == (((test.y[r] >> k) & 1) == 1);
    }
  }
  EXPECT_GE(right, 180) << "of 192 labels";  // 64 rows x 3

  const nlohmann::json v2 = {{"inputs",
                              {{{"name", "input"},
                                {"shape", {test.x.size(), kFeatures}},
                                {"datatype", "FP64"},
                                {"data", [&] {
                                   std::vector<double> flat;
                                   for (const auto& row : test.x)
                                     flat.insert(flat.end(), row.begin(), row.end());
                                   return flat;
                                 }()}}}}};
  const auto replies = serve(path("m.toml"), path("run"),
                             {{"/v1/predict", nlohmann::json{{"inputs", test.x}}.dump()},
                              {"/v2/models/tags/infer", v2.dump()}});
  ASSERT_TRUE(replies[0] && replies[1]);
  ASSERT_EQ(replies[0]->status, 200) << replies[0]->body;
  ASSERT_EQ(replies[1]->status, 200) << replies[1]->body;
  const auto outputs = nlohmann::json::parse(replies[0]->body)["outputs"];
  const auto tensors = nlohmann::json::parse(replies[1]->body)["outputs"];
  ASSERT_EQ(outputs.size(), records.size());
  ASSERT_EQ(tensors[0]["name"], "probs");
  EXPECT_EQ(tensors[0]["shape"], nlohmann::json({test.x.size(), 3}));
  for (size_t r = 0; r < records.size(); ++r)
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_NEAR(outputs[r]["probs"][k].get<double>(), records[r]["probs"][k].get<double>(), 2e-6)
          << r;
      EXPECT_EQ(tensors[0]["data"][r * 3 + k], outputs[r]["probs"][k]) << r;
      EXPECT_EQ(tensors[1]["data"][r * 3 + k], outputs[r]["labels"][k]) << r;
    }
}

}  // namespace
}  // namespace tessel::data
