// What a person watching a run sees: plain progress lines exactly every train.log_every steps
// when stderr is not a terminal, none with --quiet, and `tessel report`'s HTML page, rendered
// in headless Chromium (no console errors, every section drawn; a screenshot is saved in the
// build folder as report_test.png).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_testing.h"

namespace {

using tessel_cli::kTessel;
using tessel_cli::sh;
using tessel_cli::slurp;
const std::string kSpiral = std::string(TESSEL_SOURCE_DIR) + "/examples/spiral.toml";
const char* kSections[] = {"overview", "curves",   "throughput", "load-balance", "memory",
                           "pipeline", "timeline", "staleness",  "collectives"};

using tessel_cli::Result;
class Observe : public tessel_cli::Cli {};

// Progress goes to stderr; piped, it is one plain line per train.log_every steps and the last.
TEST_F(Observe, PipedProgressIsOneLinePerLogEvery) {
  // spiral: 300 training samples, batch 30: 10 steps per epoch, 5 epochs = 50 steps.
  const Result r = sh(kTessel + " train " + kSpiral +
                      " --set train.epochs=5 --set train.log_every=4 "
                      "--set checkpoint.every_epochs=0 --run-dir " +
                      (dir_ / "run").string() + " 2>&1 >/dev/null | cat");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<int> steps;
  const std::regex line(
      R"(epoch \d+/5 step (\d+)/50 loss [0-9.]+ acc [0-9.]+% \d+ samples/s comm \d+% mem [0-9.]+ MiB \(rank 0\).* ETA \S+)");
  const std::regex any_line("[^\n]*step [^\n]*");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), any_line), end; it != end; ++it) {
    std::smatch m;
    const std::string text = it->str();
    ASSERT_TRUE(std::regex_match(text, m, line)) << "unexpected progress line: " << text;
    steps.push_back(std::stoi(m[1]));
  }
  EXPECT_EQ(steps, (std::vector<int>{4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 50}));
  EXPECT_EQ(r.output.find('\r'), std::string::npos) << "a live line in a pipe";
  const Result quiet =
      sh(kTessel + " train " + kSpiral + " --quiet --set train.epochs=2 --run-dir " +
         (dir_ / "quiet").string() + " 2>&1 >/dev/null | cat");
  EXPECT_EQ(quiet.exit_code, 0);
  EXPECT_EQ(quiet.output, "");
}

// A rank persistently slower than its peers is named in the progress line once it has been the
// slowest for 3 records in a row, and in summary.json.
TEST_F(Observe, StragglerIsNamedInTheLineAndSummary) {
  const fs::path run = dir_ / "slow";
  const Result r = sh(kTessel + " train " + kSpiral +
                      " --workers 3 --set train.epochs=2 "
                      "--set train.log_every=2 --set debug.slow_rank=1 --set debug.delay_ms=8 "
                      "--set checkpoint.every_epochs=0 --run-dir " +
                      run.string() + " 2>&1 >/dev/null | cat");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex(R"(step 20/20 .* straggler rank 1 \(x[0-9.]+\))")))
      << r.output;
  EXPECT_FALSE(std::regex_search(r.output, std::regex("straggler rank [02]"))) << r.output;
  const std::string summary = slurp(run / "summary.json");
  EXPECT_TRUE(std::regex_search(summary, std::regex(R"("straggler": \{\s*"rank": 1,)"))) << summary;
}

// `tessel bench comm` prints nccl-tests' columns, out of place and in place, with no wrong
// element (allreduce works in place only: its out-of-place columns read n/a).
TEST_F(Observe, BenchCommPrintsNcclTestsColumns) {
  const Result r = sh(kTessel +
                      " bench comm --workers 3 --sizes 4KiB,64KiB --repeats 3 "
                      "--collective reduce_scatter,allgather,allreduce --algorithm ring 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("#       size        count      type  redop  root       time   algbw   busbw "
                    "#wrong       time   algbw   busbw #wrong"),
      std::string::npos)
      << r.output;
  // A row: size count type redop root, then time algbw busbw #wrong out of place and in place.
  const std::regex row(
      R"(\s+(\d+)\s+(\d+)\s+float\s+(sum|none)\s+-1\s+(n/a|[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+0)\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+0)");
  int rows = 0, na = 0;
  std::istringstream lines(r.output);
  for (std::string l; std::getline(lines, l);) {
    if (l.empty() || l[0] == '#') continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, row)) << "unexpected row: " << l;
    EXPECT_EQ(std::stoul(m[1]), 4 * std::stoul(m[2])) << l;  // bytes = 4 x count (float)
    ++rows;
    na += m[4] == "n/a";
  }
  EXPECT_EQ(rows, 6);  // 3 collectives x 2 sizes
  EXPECT_EQ(na, 2);    // allreduce
  EXPECT_NE(r.output.find("# wrong elements : 0 OK"), std::string::npos) << r.output;
}

TEST_F(Observe, ReportOfAMissingRunSaysWhatToPass) {
  const Result r = sh(kTessel + " report " + (dir_ / "nothing").string() + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("holds no summary.json"), std::string::npos) << r.output;
}

// The report shows numbers as a person reads them (4 significant digits, percentages, MiB);
// summary.json keeps every digit.
TEST_F(Observe, ReportRoundsTheNumbersItShows) {
  const fs::path run = dir_ / "rounded";
  const Result t = sh(kTessel + " train " + kSpiral +
                      " --quiet --set train.epochs=1 --set checkpoint.every_epochs=0 --run-dir " +
                      run.string() + " 2>&1");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const Result r = sh(kTessel + " report " + run.string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = slurp(run / "report.html");
  const auto summary = nlohmann::json::parse(slurp(run / "summary.json"));
  char want[128];
  std::snprintf(want, sizeof want, "<th>train_loss</th><td>%.4g</td>",
                summary["train_loss"].get<double>());
  EXPECT_NE(html.find(want), std::string::npos) << want;
  std::snprintf(want, sizeof want, "<th>train_accuracy</th><td>%.2f%%</td>",
                100 * summary["train_accuracy"].get<double>());
  EXPECT_NE(html.find(want), std::string::npos) << want;
  std::snprintf(want, sizeof want, "<th>peak_rss_bytes</th><td>%.1f MiB</td>",
                summary["peak_rss_bytes"].get<double>() / (1 << 20));
  EXPECT_NE(html.find(want), std::string::npos) << want;
  EXPECT_EQ(html.find(summary["train_loss"].dump()), std::string::npos) << "unrounded";
}

TEST_F(Observe, ReportOfATracedPipelineRendersInChromium) {
  const fs::path run = dir_ / "pp";
  const Result t = sh(kTessel + " train " + kSpiral +
                      " --quiet --trace --workers 4 --set pp.stages=2 "
                      "--set pp.microbatches=3 --set train.epochs=3 --set train.batch=24 "
                      "--set trace.steps=3:9 --set checkpoint.every_epochs=0 --run-dir " +
                      run.string() + " 2>&1");
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const Result r = sh(kTessel + " report " + run.string() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = slurp(run / "report.html");
  for (const char* id : kSections)
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\"><h2>"), std::string::npos) << id;
  EXPECT_EQ(html.find("src=\"http"), std::string::npos) << "the page must be self-contained";
  EXPECT_GE(sh("grep -c '<svg' " + (run / "report.html").string()).output.size(), 1u);
  if (sh("command -v chromium > /dev/null 2>&1").exit_code != 0)
    GTEST_SKIP() << "chromium not installed (scripts/setup.sh): HTML checked, not rendered";
  const std::string png = std::string(TESSEL_BINARY_DIR) + "/report_test.png";
  const std::string chromium =
      "chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=" +
      (dir_ / "profile").string() + " --enable-logging=stderr --v=0 --window-size=1200,5200 ";
  const std::string url = "file://" + (run / "report.html").string();
  const Result dom = sh(chromium + "--dump-dom " + url + " 2>" + (dir_ / "dom.log").string());
  ASSERT_EQ(dom.exit_code, 0) << slurp(dir_ / "dom.log");
  for (const char* id : kSections)
    EXPECT_NE(dom.output.find(std::string("<section id=\"") + id + "\">"), std::string::npos)
        << id << " missing from the rendered page";
  const Result shot =
      sh(chromium + "--screenshot=" + png + " " + url + " 2>" + (dir_ / "shot.log").string());
  ASSERT_EQ(shot.exit_code, 0) << slurp(dir_ / "shot.log");
  EXPECT_GT(fs::file_size(png), 10000u);
  // Console messages of the page are logged as ":CONSOLE(line)]" lines.
  for (const char* log : {"dom.log", "shot.log"}) {
    const std::string text = slurp(dir_ / log);
    EXPECT_EQ(text.find(":CONSOLE("), std::string::npos) << text;
  }
}

}  // namespace
