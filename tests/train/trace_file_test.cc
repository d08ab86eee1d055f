// trace.json of real runs checked against the Trace Event Format and what tessel promises:
// every span closed and nested per thread, monotone clocks per rank, every collective paired
// across the ranks of its group (same op and bytes, overlapping in time within the measured
// clock uncertainty), a process per rank with named thread rows. Runs dp 2 x pp 2 as threads,
// a parameter server with a slow worker, and dp 2 x pp 2 under mpirun when it is installed.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "../parallel/train_on.h"
#include "tessel/config/config.h"
#include "tessel/train/run_trace.h"

namespace tessel::train {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr double kRoundingUs = 0.002;  // ts and dur are printed to 0.001 us

json read_trace(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "trace.json");
  EXPECT_TRUE(in) << "no trace.json in " << run_dir;
  return json::parse(in);
}

double end_of(const json& e) { return e["ts"].get<double>() + e.value("dur", 0.0); }

// Checks the schema and returns the number of spans per category.
std::map<std::string, int> check_trace(const json& doc, int ranks) {
  std::map<std::string, int> cats;
  const json& meta = doc.at("otherData");
  EXPECT_EQ(meta.at("clock_offset_us").size(), static_cast<size_t>(ranks));
  double uncertainty = 0;
  for (const json& u : meta.at("clock_uncertainty_us"))
    uncertainty = std::max(uncertainty, u.get<double>());
  std::set<int> processes;
  std::set<std::pair<int, int>> named_threads;
  std::map<std::pair<int, int>, std::vector<json>> rows;  // (pid, tid) -> events in recorded order
  for (const json& e : doc.at("traceEvents")) {
    const std::string ph = e.at("ph");
    EXPECT_TRUE(ph == "X" || ph == "i" || ph == "C" || ph == "M") << e.dump();
    const int pid = e.at("pid");
    EXPECT_TRUE(pid >= 0 && pid < ranks) << e.dump();
    if (ph == "M") {
      if (e["name"] == "process_name") processes.insert(pid);
      if (e["name"] == "thread_name") named_threads.insert({pid, e["tid"].get<int>()});
      continue;
    }
    EXPECT_GE(e.at("ts").get<double>(), -uncertainty - kRoundingUs) << e.dump();
    if (ph == "X") {
      EXPECT_GE(e.at("dur").get<double>(), 0.0) << "unclosed span " << e.dump();
      ++cats[e.at("cat").get<std::string>()];
    }
    rows[{pid, e.at("tid").get<int>()}].push_back(e);
  }
  EXPECT_EQ(processes.size(), static_cast<size_t>(ranks));
  std::map<std::string, std::vector<json>> calls;  // collective (group, seq) -> its spans
  for (auto& [row, events] : rows) {
    EXPECT_TRUE(named_threads.count(row))
        << "row without a thread name: " << row.first << "/" << row.second;
    // Monotone clock: events are recorded when they end, so their ends never go back in time.
    for (size_t i = 1; i < events.size(); ++i)
      EXPECT_GE(end_of(events[i]), end_of(events[i - 1]) - kRoundingUs)
          << events[i - 1].dump() << " then " << events[i].dump();
    // Spans of one thread nest: sorted by start, each lies inside the enclosing one.
    std::vector<json> spans;
    for (const json& e : events)
      if (e["ph"] == "X") spans.push_back(e);
    std::sort(spans.begin(), spans.end(), [](const json& a, const json& b) {
      return a["ts"] != b["ts"] ? a["ts"] < b["ts"] : a["dur"] > b["dur"];
    });
    std::vector<double> open;  // ends of the enclosing spans
    for (const json& s : spans) {
      while (!open.empty() && open.back() <= s["ts"].get<double>() + kRoundingUs) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(end_of(s), open.back() + kRoundingUs) << "overlaps: " << s.dump();
      }
      open.push_back(end_of(s));
      if (s["cat"] == "comm")
        calls[s["args"]["group"].get<std::string>() + "#" + s["args"]["seq"].dump()].push_back(s);
    }
  }
  // Collectives: one span per member rank, alike, and in time as the collective requires (a
  // rank's clock is off by at most its uncertainty): an all-to-all kind ends nowhere before every
  // rank has entered it; a broadcast ends nowhere before the root entered it; a reduce or gather
  // ends on the root after every rank entered it.
  EXPECT_FALSE(calls.empty());
  const double tol = 2 * uncertainty + kRoundingUs;
  for (const auto& [key, spans] : calls) {
    const json& peers = spans[0]["args"]["peers"];
    if (spans.size() != peers.size()) {
      ADD_FAILURE() << key << " recorded on " << spans.size() << " of " << peers.size()
                    << " ranks: " << spans[0].dump();
      continue;
    }
    const std::string op = spans[0]["name"];
    const int root = spans[0]["args"].contains("root")
                         ? peers[spans[0]["args"]["root"].get<size_t>()].get<int>()
                         : -1;
    std::set<int> pids;
    double last_start = -1e300, first_end = 1e300, root_start = 0, root_end = 0, others_end = 1e300;
    for (const json& s : spans) {
      const int pid = s["pid"];
      pids.insert(pid);
      EXPECT_EQ(s["name"], op) << key;
      EXPECT_EQ(s["args"]["bytes"], spans[0]["args"]["bytes"]) << key;
      EXPECT_EQ(s["args"]["algorithm"], spans[0]["args"]["algorithm"]) << key;
      last_start = std::max(last_start, s["ts"].get<double>());
      first_end = std::min(first_end, end_of(s));
      if (pid == root)
        root_start = s["ts"], root_end = end_of(s);
      else
        others_end = std::min(others_end, end_of(s));
    }
    EXPECT_EQ(pids, peers.get<std::set<int>>()) << key;
    if (op == "broadcast")
      EXPECT_LE(root_start, others_end + tol)
          << key << ": a rank got the data before the root sent it";
    else if (op == "reduce" || op == "gather")
      EXPECT_LE(last_start, root_end + tol) << key << ": the root finished before a rank entered";
    else
      EXPECT_LE(last_start, first_end + tol) << key << ": a rank left before another entered";
  }
  return cats;
}

Config spiral(std::vector<std::string> extra) {
  std::vector<std::string> o = {"train.epochs=3",    "train.batch=24",
                                "train.log_every=4", "checkpoint.every_epochs=0",
                                "train.trace=true",  "trace.steps=3:9"};
  o.insert(o.end(), extra.begin(), extra.end());
  return load_config(std::string(TESSEL_SOURCE_DIR) + "/examples/spiral.toml", o);
}

TEST(TraceFile, PipelineDpTimesPpThreads) {
  RunOptions opts;
  opts.run_dir = testing::test_run_dir("trace_dpxpp");
  testing::train_on(spiral({"pp.stages=2", "pp.microbatches=3", "checkpoint.every_steps=6"}), 4,
                    opts);
  const json doc = read_trace(opts.run_dir);
  EXPECT_EQ(doc["otherData"]["layout"], "dp=2 pp=2");
  const std::map<std::string, int> cats = check_trace(doc, 4);
  // 6 steps x 4 ranks, every block's forward and backward, every micro-batch's tasks.
  EXPECT_EQ(cats.at("step"), 6 * 4);
  EXPECT_EQ(cats.at("pipeline_forward"), 6 * 4 * 3);
  EXPECT_EQ(cats.at("pipeline_backward"), 6 * 4 * 3);
  EXPECT_GT(cats.at("forward"), 0);
  EXPECT_GT(cats.at("backward"), 0);
  EXPECT_GT(cats.at("p2p"), 0);
  EXPECT_GT(cats.at("optimizer"), 0);
  EXPECT_GT(cats.at("checkpoint"), 0);  // the checkpoint of step 6
  int counters = 0;
  for (const json& e : doc["traceEvents"]) counters += e["ph"] == "C";
  EXPECT_GT(counters, 0);
  fs::remove_all(opts.run_dir);
}

TEST(TraceFile, ParameterServerWithStraggler) {
  RunOptions opts;
  opts.run_dir = testing::test_run_dir("trace_ps");
  const testing::RunResult r = testing::train_on(
      spiral({"ps.servers=1", "ps.mode=async", "debug.slow_rank=1", "debug.delay_ms=30",
              "trace.steps=3:20"}),  // the end of epoch 1 (step 11) and its collectives
      3, opts);
  const json doc = read_trace(opts.run_dir);
  const std::map<std::string, int> cats = check_trace(doc, 3);
  EXPECT_GT(cats.at("ps"), 0);
  std::map<int, std::set<std::string>> names;  // what each rank did
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X") names[e["pid"].get<int>()].insert(e["name"].get<std::string>());
  EXPECT_TRUE(names[2].count("apply push")) << "the server's updates";
  EXPECT_TRUE(names[0].count("push") && names[1].count("push"));
  EXPECT_TRUE(names[1].count("debug.delay_ms")) << "the slow worker's sleep";
  EXPECT_FALSE(names[0].count("debug.delay_ms"));
  // The slow worker is named in summary.json.
  ASSERT_TRUE(r.summary["straggler"].is_object()) << r.summary.dump(1);
  EXPECT_EQ(r.summary["straggler"]["rank"], 1);
  fs::remove_all(opts.run_dir);
}

TEST(TraceFile, OffWritesNothing) {
  RunOptions opts;
  opts.run_dir = testing::test_run_dir("trace_off");
  testing::train_on(spiral({"train.trace=false"}), 2, opts);
  EXPECT_FALSE(fs::exists(fs::path(opts.run_dir) / "trace.json"));
  fs::remove_all(opts.run_dir);
}

TEST(TraceFile, BadWindow) {
  for (const char* bad : {"5", "5:5", "a:9", "-1:3", "3:2", "1:2:3"})
    EXPECT_THROW(parse_step_window(bad), InvalidArgument) << bad;
  EXPECT_EQ(parse_step_window("100:120"), (std::pair<int64_t, int64_t>{100, 120}));
  try {
    spiral({"trace.steps=9:3"});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("trace.steps"), std::string::npos) << e.what();
  }
}

TEST(TraceFile, PipelineDpTimesPpMpi) {
  const std::string tessel = std::string(TESSEL_BINARY_DIR) + "/apps/tessel/tessel";
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0 || !fs::exists(tessel))
    GTEST_SKIP() << "needs mpirun and the tessel binary";
  const std::string dir = testing::test_run_dir("trace_mpi");
  fs::remove_all(dir);
  const std::string cmd =
      "mpirun --allow-run-as-root --oversubscribe -np 4 " + tessel + " train " + TESSEL_SOURCE_DIR +
      "/examples/spiral.toml --quiet --trace --set train.epochs=2 --set train.batch=24 "
      "--set checkpoint.every_epochs=0 --set trace.steps=2:8 --set pp.stages=2 --run-dir " +
      dir + " > " + dir + ".out 2>&1";
  const int status = std::system(cmd.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream out(dir + ".out");
    FAIL() << "mpirun failed:\n" << std::string(std::istreambuf_iterator<char>(out), {});
  }
  const json doc = read_trace(dir);
  EXPECT_EQ(doc["otherData"]["layout"], "dp=2 pp=2");
  const std::map<std::string, int> cats = check_trace(doc, 4);
  EXPECT_EQ(cats.at("step"), 6 * 4);
  fs::remove_all(dir);
  fs::remove(dir + ".out");
}

}  // namespace
}  // namespace tessel::train
