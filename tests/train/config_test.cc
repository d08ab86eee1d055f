#include "tessel/train/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tessel/core/error.h"

namespace tessel::train {
namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "t", overrides);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAndValues) {
  Config c = parse_config("seed = 3\n[model]\nkind = \"cnn\"\nchannels = [8, 4]\n"
                          "[optim]\nlr = 1\n[train]\nbatch = 64\n", "demo");
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.model.kind, "cnn");
  EXPECT_EQ(c.model.channels, (std::vector<int64_t>{8, 4}));
  EXPECT_FLOAT_EQ(c.optim.lr, 1.0f);  // an integer is accepted for a float key
  EXPECT_EQ(c.train.batch, 64);
  EXPECT_EQ(c.train.epochs, TrainSpec{}.epochs);
}

TEST(Config, UnknownKeyNamesNearest) {
  std::string e = error_of("[optim]\nlearning_rate = 0.1\n");
  EXPECT_NE(e.find("unknown key 'optim.learning_rate'"), std::string::npos) << e;
  e = error_of("[trian]\nepochs = 2\n");
  EXPECT_NE(e.find("did you mean 'train.epochs'"), std::string::npos) << e;
  e = error_of("[train]\nbatchsize = 2\n");
  EXPECT_NE(e.find("did you mean 'train.batch'"), std::string::npos) << e;
}

TEST(Config, BadValuesSayWhatIsAllowed) {
  EXPECT_NE(error_of("[optim]\nlr = -1.0\n").find("optim.lr must be in (0, 1000], got -1"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nbatch = 0\n").find("train.batch must be in [1, 16777216], got 0"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nbatch = \"big\"\n").find("train.batch must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nhidden = [1, \"x\"]\n").find("array of integers"), std::string::npos);
  EXPECT_NE(error_of("[train\nbatch = 1\n").find("t:1:"), std::string::npos);  // syntax error
  EXPECT_NE(error_of("", {"runtime.threads=0"}).find("runtime.threads must be in [1, 256]"),
            std::string::npos);
}

TEST(Config, PrefetchAutoOnlyWithASpareCore) {
  EXPECT_NE(error_of("", {"train.prefetch=-2"}).find("train.prefetch must be in [-1, 1024]"),
            std::string::npos);
  EXPECT_EQ(resolve_prefetch(-1, 1, 1, 2), 2);  // 1 rank on 2 cores: the loader gets the other
  EXPECT_EQ(resolve_prefetch(-1, 2, 1, 2), 0);  // 2 ranks on 2 cores: no core to spare
  EXPECT_EQ(resolve_prefetch(-1, 1, 2, 2), 0);  // 1 rank with 2 BLAS threads
  EXPECT_EQ(resolve_prefetch(-1, 2, 1, 16), 2);
  EXPECT_EQ(resolve_prefetch(3, 2, 1, 2), 3);   // an explicit value stands
  EXPECT_EQ(resolve_prefetch(0, 1, 1, 16), 0);
}

TEST(Config, LayoutKeysSayWhatIsAllowed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"pp.stages=0", "pp.stages must be in [1, 1024], got 0"},
      {"pp.microbatches=0", "pp.microbatches must be in [1, 65536], got 0"},
      {"pp.schedule=zigzag", "pp.schedule must be gpipe or 1f1b, got 'zigzag'"},
      {"pp.partition=random", "pp.partition must be balanced, uniform or round_robin"},
      {"ps.servers=-1", "ps.servers must be in [0, 1024]"},
      {"ps.mode=eventual", "ps.mode must be sync, async or ssp, got 'eventual'"},
      {"ps.staleness=-2", "ps.staleness must be in [0, 1048576], got -2"},
      {"ps.stale_lr=sqrt", "ps.stale_lr must be none or inverse, got 'sqrt'"},
      {"debug.slow_rank=-2", "debug.slow_rank must be in [-1, 1048576]"},
      {"debug.delay_ms=-1", "debug.delay_ms must be in [0, 1000000]"},
  };
  for (const auto& [set, want] : cases)
    EXPECT_NE(error_of("", {set}).find(want), std::string::npos) << set << ": " << error_of("", {set});
}

TEST(Config, OverridesApplyAndAreChecked) {
  Config c = parse_config("[train]\nbatch = 8\n", "t",
                          {"train.batch=32", "model.kind=gpt", "model.hidden=[7]", "optim.lr=0.5"});
  EXPECT_EQ(c.train.batch, 32);
  EXPECT_EQ(c.model.kind, "gpt");  // bare word taken as a string
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{7}));
  EXPECT_FLOAT_EQ(c.optim.lr, 0.5f);
  EXPECT_NE(error_of("", {"train.epoch=3"}).find("did you mean 'train.epochs'"), std::string::npos);
  EXPECT_NE(error_of("", {"noequals"}).find("section.key=value"), std::string::npos);
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config c = parse_config("name = \"x y\"\n[model]\nhidden = [3]\n[optim]\nlr = 0.125\n", "t");
  Config d = parse_config(to_toml(c), "other");
  EXPECT_EQ(to_toml(c), to_toml(d));
  EXPECT_EQ(d.name, "x y");
  EXPECT_EQ(d.model.hidden, (std::vector<int64_t>{3}));
}

// Each key has its row in docs/config.md, "| `key` | default | range | meaning |", whose range
// cell is the registry's (empty for keys that are not numbers).
TEST(Config, EveryKeyAndRangeIsDocumented) {
  std::ifstream in(std::string(TESSEL_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::map<std::string, std::string> ranges;  // key -> its row's range cell
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    auto trim = [](const std::string& c) {
      const size_t b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
      return b == std::string::npos ? "" : c.substr(b, e - b + 1);
    };
    const std::string key = trim(cells[0]);  // `key`
    if (cells.size() >= 4) ranges[key.substr(1, key.size() - 2)] = trim(cells[2]);
  }
  for (const KeyInfo& k : config_keys()) {
    ASSERT_TRUE(ranges.count(k.path)) << k.path << " has no row in docs/config.md";
    EXPECT_EQ(ranges[k.path], k.range) << k.path;
  }
}

// docs/config.md's "Coming from PyTorch or DeepSpeed" table: every name in a row's second
// column is answered with the tessel key of its third column ("none": tessel has no key).
TEST(Config, OtherFrameworksNamesMatchTheDocsTable) {
  std::ifstream in(std::string(TESSEL_SOURCE_DIR) + "/docs/config.md");
  bool inside = false;
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) inside = line == "## Coming from PyTorch or DeepSpeed";
    if (!inside || line.rfind("| ", 0) != 0 || line.rfind("| their term", 0) == 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    for (std::string cell; std::getline(row, cell, '|');) cells.push_back(cell);
    ASSERT_GE(cells.size(), 3u) << line;
    const size_t key_at = cells[2].find('`');
    const std::string key = key_at == std::string::npos
                                ? "" : cells[2].substr(key_at + 1, cells[2].find('`', key_at + 1) - key_at - 1);
    std::stringstream names(cells[1]);
    for (std::string name; std::getline(names, name, '`');) {
      if (!std::getline(names, name, '`')) break;  // the text between backticks
      const std::string path = name.find('.') == std::string::npos ? "train." + name : name;
      const std::string e = error_of("", {path + "=1"});
      EXPECT_NE(e.find(key.empty() ? "tessel has no such key" : "did you mean '" + key + "'"),
                std::string::npos) << name << " -> " << e;
      ++rows;
    }
  }
  EXPECT_GE(rows, 20);
}

TEST(Config, MissingFileIsIoError) {
  EXPECT_THROW(load_config("/nonexistent/x.toml"), IoError);
}

}  // namespace
}  // namespace tessel::train
