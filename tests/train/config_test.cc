#include "tessel/config/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "../parallel/train_on.h"
#include "tessel/core/error.h"
#include "tessel/train/dry_run.h"

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
  Config c = parse_config(
      "seed = 3\n[model]\nkind = \"cnn\"\nchannels = [8, 4]\n"
      "[optim]\nlr = 1\n[train]\nbatch = 64\n",
      "demo");
  EXPECT_EQ(c.name, "demo");
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.model.kind, nn::ModelKind::kCnn);
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
  EXPECT_NE(error_of("[model]\nhidden = [1, \"x\"]\n").find("array of integers"),
            std::string::npos);
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
  EXPECT_EQ(resolve_prefetch(3, 2, 1, 2), 3);  // an explicit value stands
  EXPECT_EQ(resolve_prefetch(0, 1, 1, 16), 0);
}

TEST(Config, BackendAutoIsMpiUnderALauncherAndWorkersAreForThreads) {
  Config c;
  EXPECT_EQ(resolve_backend(c, false), comm::Backend::kThreads);
  EXPECT_EQ(resolve_backend(c, true), comm::Backend::kMpi);
  c.runtime.backend = BackendChoice::kThreads;
  EXPECT_EQ(resolve_backend(c, true), comm::Backend::kThreads);
  c.runtime.backend = BackendChoice::kMpi;
  c.runtime.workers = 2;
  try {
    resolve_backend(c, false);
    FAIL() << "runtime.workers = 2 on mpi was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("under mpirun use -np"), std::string::npos) << e.what();
  }
}

TEST(Config, LayoutKeysSayWhatIsAllowed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"pp.stages=0", "pp.stages must be in [1, 1024], got 0"},
      {"pp.microbatches=0", "pp.microbatches must be in [1, 65536], got 0"},
      {"pp.schedule=zigzag", "pp.schedule must be gpipe, 1f1b, interleaved or zb-h1, got 'zigzag'"},
      {"pp.virtual_stages=0", "pp.virtual_stages must be in [1, 1024], got 0"},
      {"pp.partition=random", "pp.partition must be balanced, uniform or round_robin"},
      {"ps.servers=-1", "ps.servers must be in [0, 1024]"},
      {"ps.mode=eventual", "ps.mode must be sync, async or ssp, got 'eventual'"},
      {"ps.staleness=-2", "ps.staleness must be in [0, 1048576], got -2"},
      {"ps.stale_lr=sqrt", "ps.stale_lr must be none or inverse, got 'sqrt'"},
      {"debug.slow_rank=-2", "debug.slow_rank must be in [-1, 1048576]"},
      {"debug.delay_ms=-1", "debug.delay_ms must be in [0, 1000000]"},
  };
  for (const auto& [set, want] : cases)
    EXPECT_NE(error_of("", {set}).find(want), std::string::npos)
        << set << ": " << error_of("", {set});
}

TEST(Config, OverridesApplyAndAreChecked) {
  Config c = parse_config("[train]\nbatch = 8\n", "t",
                          {"train.batch=32", "model.kind=gpt", "model.hidden=[7]", "optim.lr=0.5"});
  EXPECT_EQ(c.train.batch, 32);
  EXPECT_EQ(c.model.kind, nn::ModelKind::kGpt);  // a bare word is taken as a string
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
// cell is the registry's (a number range, a string key's values, or empty).
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
    const std::string key =
        key_at == std::string::npos
            ? ""
            : cells[2].substr(key_at + 1, cells[2].find('`', key_at + 1) - key_at - 1);
    std::stringstream names(cells[1]);
    for (std::string name; std::getline(names, name, '`');) {
      if (!std::getline(names, name, '`')) break;  // the text between backticks
      const std::string path = name.find('.') == std::string::npos ? "train." + name : name;
      const std::string e = error_of("", {path + "=1"});
      EXPECT_NE(e.find(key.empty() ? "tessel has no such key" : "did you mean '" + key + "'"),
                std::string::npos)
          << name << " -> " << e;
      ++rows;
    }
  }
  EXPECT_GE(rows, 20);
}

// A string key with a fixed set of values names them and the nearest to a mistyped one.
TEST(Config, AMistypedValueGetsTheNearestValid) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train.precision=bf61",
       "train.precision must be fp32, bf16 or fp16, got 'bf61'; did you "
       "mean 'bf16'?"},
      {"model.kind=mpl",
       "model.kind must be mlp, cnn, gpt or sequential, got 'mpl'; did you mean 'mlp'?"},
      {"compress.kind=powersdg", "did you mean 'powersgd'?"},
      {"optim.kind=adamww", "did you mean 'adamw'?"},
      {"model.position=alibi", "model.position must be learned or rotary, got 'alibi'"},
      {"data.kind=cifar",
       "data.kind must be fashion_mnist, mnist_idx, spiral, text, synthetic, npy, csv or tokens, "
       "got 'cifar'"},
      {"runtime.backend=mpl", "did you mean 'mpi'?"},
      {"layout=atuo", "did you mean 'auto'?"},
      {"comm.algorithm=rnig", "did you mean 'ring'?"},
      {"debug.fail_mode=hnag", "did you mean 'hang'?"},
  };
  for (const auto& [set, want] : cases)
    EXPECT_NE(error_of("", {set}).find(want), std::string::npos)
        << set << ": " << error_of("", {set});
  const std::string far = error_of("", {"train.precision=float64"});
  EXPECT_NE(far.find("got 'float64'"), std::string::npos) << far;
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

// The choice keys read into their enums and write back the same spellings.
TEST(Config, ChoiceKeysAreEnumsWithTheirSpellings) {
  const Config c = parse_config(
      "layout = \"auto\"\n", "t",
      {"data.kind=spiral", "runtime.backend=mpi", "comm.algorithm=tree", "debug.fail_mode=kill"});
  EXPECT_EQ(c.layout, LayoutMode::kAuto);
  EXPECT_EQ(c.data.kind, data::DataKind::kSpiral);
  EXPECT_EQ(c.runtime.backend, BackendChoice::kMpi);
  EXPECT_EQ(c.comm.algorithm, comm::Algorithm::kTree);
  EXPECT_EQ(c.fault.fail_mode, FailMode::kKill);
  const std::string toml = to_toml(c);
  for (const char* line : {"layout = 'auto'", "kind = 'spiral'", "backend = 'mpi'",
                           "algorithm = 'tree'", "fail_mode = 'kill'"})
    EXPECT_NE(toml.find(line), std::string::npos) << line << "\n" << toml;
  const Config back = parse_config(toml, "t");
  EXPECT_EQ(back.runtime.backend, BackendChoice::kMpi);
  EXPECT_EQ(back.comm.algorithm, comm::Algorithm::kTree);
}

// A TOML syntax error names the file by its path (the name of the run is only its stem).
TEST(Config, ASyntaxErrorNamesTheFilesPath) {
  const std::string path = ::testing::TempDir() + "/syntax_error.toml";
  std::ofstream(path) << "name = \"x\"\n[model\nkind = \"mlp\"\n";
  try {
    load_config(path);
    ADD_FAILURE() << "a config with a syntax error loaded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("config: " + path + ":2:"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

// The resolved config lists the keys that apply: a cnn's keys not for an mlp, SGD's not for
// AdamW, the spiral's not for text.
TEST(Config, ResolvedTomlHasOnlyTheKeysThatApply) {
  const std::string mlp = to_toml(parse_config("", "t"));
  EXPECT_NE(mlp.find("hidden = "), std::string::npos) << mlp;
  EXPECT_EQ(mlp.find("channels = "), std::string::npos) << mlp;
  EXPECT_NE(mlp.find("momentum = "), std::string::npos) << mlp;
  EXPECT_NE(mlp.find("flatten = "), std::string::npos) << mlp;  // fashion_mnist, the default
  EXPECT_EQ(mlp.find("ratio = "), std::string::npos) << mlp;    // compress.kind = none
  const std::string gpt = to_toml(parse_config(
      "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\n[optim]\nkind = \"adamw\"\n", "t"));
  EXPECT_EQ(gpt.find("hidden = "), std::string::npos) << gpt;
  EXPECT_NE(gpt.find("layers = "), std::string::npos) << gpt;
  EXPECT_EQ(gpt.find("momentum = "), std::string::npos) << gpt;
  EXPECT_NE(gpt.find("beta2 = "), std::string::npos) << gpt;
  EXPECT_NE(gpt.find("context = "), std::string::npos) << gpt;
  EXPECT_EQ(gpt.find("flatten = "), std::string::npos) << gpt;
  EXPECT_EQ(to_toml(parse_config(gpt, "u")), gpt);  // and it reads back the same
}

// A key that applies to more than its doc's first words name keeps its value through the
// resolved config (a resumed run reads RUN/config.toml): AdamW's weight decay, a token file's
// context and test share, a table's test-row seed.
TEST(Config, ResolvedTomlKeepsEveryKeyThatApplies) {
  for (const char* text : {"[optim]\nkind = \"adamw\"\nweight_decay = 0.25\n",
                           "[data]\nkind = \"tokens\"\ncontext = 17\ntest_fraction = 0.25\n",
                           "[data]\nkind = \"csv\"\nseed = 17\n"}) {
    const Config c = parse_config(text, "t");
    const Config d = parse_config(to_toml(c), "t");
    EXPECT_EQ(d.optim.weight_decay, c.optim.weight_decay) << text;
    EXPECT_EQ(d.data.context, c.data.context) << text;
    EXPECT_EQ(d.data.test_fraction, c.data.test_fraction) << text;
    EXPECT_EQ(d.data.seed, c.data.seed) << text;
  }
}

TEST(Config, MissingFileIsIoError) { EXPECT_THROW(load_config("/nonexistent/x.toml"), IoError); }

// ---- config values at the edges, hostile config files ----

// Every numeric key of the registry, set to each edge value, is either accepted (and then
// round-trips through to_toml and plans a run) or refused with an InvalidArgument naming the
// key; inputs nested or sized past the documented limits are refused before the TOML parser
// sees them. Meant to run under ASan/UBSan too (-DTESSEL_SANITIZE=address,undefined).

// A spiral mlp that plans and trains in milliseconds.
const std::string kBase =
    "[model]\nkind = \"mlp\"\nhidden = [8]\n"
    "[data]\nkind = \"spiral\"\npoints_per_class = 20\n"
    "[train]\nepochs = 1\nbatch = 16\nprefetch = 0\n";

// 0, -1, 2^31, 2^62, 2^63 - 1 as integers, and as floats with 1e-45, NaN and infinities.
const std::vector<std::string> kIntegers = {"0", "-1", "2147483648", "4611686018427387904",
                                            "9223372036854775807"};
const std::vector<std::string> kFloats = {
    "0.0", "-1.0", "2147483648.0", "4.611686018427388e18", "9.223372036854776e18", "1e-45",
    "nan", "inf",  "-inf"};

TEST(ConfigEdges, EveryNumericKeyTakesItsRangeOrNamesTheKey) {
  int keys = 0, accepted = 0, refused = 0;
  for (const KeyInfo& key : config_keys()) {
    if (key.range.empty() || key.type == "string") continue;
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
  Config c = parse_config("name = \"" + deep + "\" # " + deep + "\n[data] # " + deep +
                              "\npath = '''\n" + deep + "'''\n",
                          "t");
  EXPECT_EQ(c.name, deep);
  EXPECT_EQ(c.data.path, deep);
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
