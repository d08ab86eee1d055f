// Config values at the edges and hostile config files: every numeric key of the registry, set to
// each edge value, is either accepted (and then round-trips through to_toml and plans a run) or
// refused with an InvalidArgument naming the key; inputs nested or sized past the documented
// limits are refused before the TOML parser sees them. Meant to run under ASan/UBSan too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../parallel/train_on.h"
#include "tessel/core/error.h"
#include "tessel/train/config.h"
#include "tessel/train/dry_run.h"

namespace tessel::train {
namespace {

// A spiral mlp that plans and trains in milliseconds.
const std::string kBase =
    "[model]\nkind = \"mlp\"\nhidden = [8]\n"
    "[data]\nkind = \"spiral\"\npoints_per_class = 20\n"
    "[train]\nepochs = 1\nbatch = 16\nprefetch = 0\n";

// The message of the InvalidArgument that parsing throws, "" if it parses.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(text, "t", overrides);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// 0, -1, 2^31, 2^62, 2^63 - 1 as integers, and as floats with 1e-45, NaN and infinities.
const std::vector<std::string> kIntegers = {"0", "-1", "2147483648", "4611686018427387904",
                                            "9223372036854775807"};
const std::vector<std::string> kFloats = {
    "0.0", "-1.0", "2147483648.0", "4.611686018427388e18", "9.223372036854776e18", "1e-45",
    "nan", "inf",  "-inf"};

TEST(ConfigEdges, EveryNumericKeyTakesItsRangeOrNamesTheKey) {
  int keys = 0, accepted = 0, refused = 0;
  for (const KeyInfo& key : config_keys()) {
    if (key.range.empty()) continue;
    ++keys;
    std::vector<std::string> values = kIntegers;
    values.insert(values.end(), kFloats.begin(), kFloats.end());
    for (const std::string& v : values) {
      const std::string set = key.path + "=" + (key.type == "integer array" ? "[" + v + "]" : v);
      SCOPED_TRACE(set);
      Config c;
      try {
        c = parse_config(kBase, "t", {set});
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(key.path), std::string::npos) << what;
        ++refused;
        continue;
      }
      ++accepted;
      // An integer key takes no float, and no key takes NaN or an infinity.
      EXPECT_TRUE(v.find_first_of(".ena") == std::string::npos || key.type == "number");
      EXPECT_EQ(to_toml(parse_config(to_toml(c), "t")), to_toml(c));
      try {  // forms the trainer's products (steps, batches) from the accepted value
        dry_run(c, 1);
      } catch (const InvalidArgument&) {  // a clear error is fine (e.g. fp16-only debug keys)
      }
    }
  }
  EXPECT_GE(keys, 80);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

// The defaults are inside their ranges: the resolved default config parses back.
TEST(ConfigEdges, DefaultsAreInRange) {
  const Config d = parse_config("", "t");
  EXPECT_EQ(to_toml(parse_config(to_toml(d), "t")), to_toml(d));
}

TEST(ConfigEdges, RangeErrorsSayTheRange) {
  EXPECT_NE(error_of(kBase, {"train.epochs=2147483648"})
                .find("config: train.epochs must be in [1, 1000000], got 2147483648"),
            std::string::npos);
  EXPECT_NE(error_of(kBase, {"optim.lr=nan"}).find("optim.lr must be in (0, 1000], got nan"),
            std::string::npos);
  EXPECT_NE(error_of(kBase, {"optim.momentum=1.0"}).find("optim.momentum must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(kBase, {"model.hidden=[8, 0]"})
                .find("every entry of model.hidden must be in [1, 1048576], got 0"),
            std::string::npos);
  EXPECT_NE(error_of(kBase, {"train.batch=1.5"}).find("train.batch must be an integer, got 1.5"),
            std::string::npos);
  // 1e-50 is inside (0, 1000] as a double but 0 as the float optim.lr stores.
  EXPECT_NE(error_of(kBase, {"optim.lr=1e-50"}).find("optim.lr must be in (0, 1000]"),
            std::string::npos);
  EXPECT_EQ(error_of(kBase, {"optim.lr=1e-45"}), "");
}

// The largest values the products of the trainer are formed from, in a real (short) run.
TEST(ConfigEdges, LargestStepProductsTrain) {
  Config c = parse_config(
      kBase, "edges",
      {"train.epochs=1000000", "train.batch=16777216", "train.accumulate=65536",
       "train.base_batch=1099511627776", "train.max_steps=2", "train.log_every=1099511627776",
       "checkpoint.every_epochs=0", "runtime.memory_limit_mb=1073741824"});
  const testing::RunResult r = testing::train_on(c, 1);
  EXPECT_EQ(r.summary["steps"].get<int64_t>(), 2);
}

TEST(ConfigEdges, DeepHeadersAndKeysAreRefusedBeforeParsing) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  for (int n : {70000, 100000}) {
    std::string e = error_of("[model" + repeat(".a", n) + "]\n");
    EXPECT_NE(e.find("config: t:1: tables, keys and arrays nest more than 16 levels"),
              std::string::npos)
        << e.substr(0, 200);
    e = error_of("seed = 1\nx" + repeat(".a", n) + " = 1\n");
    EXPECT_NE(e.find("config: t:2: "), std::string::npos) << e.substr(0, 200);
    e = error_of("x = " + repeat("{a = ", n) + "1" + repeat("}", n) + "\n");
    EXPECT_NE(e.find("nest more than 16 levels"), std::string::npos) << e.substr(0, 200);
    e = error_of("x = " + repeat("[", n) + repeat("]", n) + "\n");
    EXPECT_NE(e.find("nest more than 16 levels"), std::string::npos) << e.substr(0, 200);
    e = error_of(kBase, {"model.hidden=" + repeat("[", n)});
    EXPECT_NE(e.find("config: --set model.hidden:1: tables, keys and arrays nest"),
              std::string::npos)
        << e.substr(0, 200);
  }
  // The limit itself: 16 levels reach the parser (an unknown key), 17 do not.
  EXPECT_NE(error_of("[model" + repeat(".a", 15) + "]\n").find("unknown key"), std::string::npos);
  EXPECT_NE(error_of("[model" + repeat(".a", 16) + "]\n").find("16 levels"), std::string::npos);
  EXPECT_NE(error_of("[model]\nx" + repeat(".a", 14) + " = 1\n").find("unknown key"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\nx" + repeat(".a", 15) + " = 1\n").find("16 levels"),
            std::string::npos);
  // Brackets, braces and dots inside strings and comments are not levels.
  const std::string deep = repeat("[{.", 40);
  Config c = parse_config("name = \"" + deep + "\" # " + deep + "\n[model] # " + deep +
                              "\nkind = '''\n" + deep + "'''\n",
                          "t");
  EXPECT_EQ(c.name, deep);
  EXPECT_EQ(c.model.kind, deep);
}

TEST(ConfigEdges, HugeInputsAreRefusedNamingTheLimit) {
  const std::string big(kMaxConfigBytes + 1, '#');
  std::string e = error_of(big);
  EXPECT_NE(e.find("config: t is larger than the 1048576 bytes (1 MiB)"), std::string::npos) << e;
  e = error_of("", {"name=\"" + std::string(kMaxConfigBytes, 'x') + "\""});
  EXPECT_NE(e.find("config: --set name is larger than"), std::string::npos) << e;
  const std::string path = ::testing::TempDir() + "/huge_config.toml";
  std::ofstream(path) << big;
  try {
    load_config(path);
    ADD_FAILURE() << "a config over 1 MiB loaded";
  } catch (const InvalidArgument& ex) {
    EXPECT_NE(std::string(ex.what()).find("config: " + path + " is larger than"), std::string::npos)
        << ex.what();
  }
  std::filesystem::remove(path);
  // A key too long to be near any valid key is named without a suggestion.
  e = error_of("[" + std::string(500000, 'a') + "]\nb = 1\n");
  EXPECT_NE(e.find("keys are short names"), std::string::npos) << e.substr(0, 300);
  EXPECT_LT(e.size(), 400u);
}

}  // namespace
}  // namespace tessel::train
