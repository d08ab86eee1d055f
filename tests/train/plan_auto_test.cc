// `tessel train --layout auto` end to end on a tiny GPT (calibrated into a scratch cache): the
// plan's pick is said, recorded in run.json and trained; a resume keeps it; a memory cap that
// no layout meets fails at start naming the category; under mpirun every rank trains the
// pick of rank 0.
#include <nlohmann/json.hpp>

#include "../cli/cli_testing.h"

namespace tessel_cli {
namespace {

using nlohmann::json;

class PlanAuto : public Cli {
 protected:
  // tessel with a scratch calibration cache (XDG_CACHE_HOME), stdout and stderr together.
  Result tessel(const std::string& args) {
    return sh("XDG_CACHE_HOME=" + path("cache") + " " + kTessel + " " + args + " 2>&1");
  }
  std::string gpt() {
    std::ofstream(path("gpt.toml"))
        << "layout = \"auto\"\n[model]\nkind = \"gpt\"\nlayers = 2\nheads = 2\nembed = 16\n"
           "[data]\nkind = \"text\"\npath = \"/usr/share/games/fortunes/songs-poems\"\n"
           "context = 16\n[train]\nbatch = 8\nepochs = 1\nmax_steps = 4\n"
           "[checkpoint]\nevery_epochs = 0\nevery_steps = 4\n";
    return path("gpt.toml");
  }
  json starts(const std::string& run) {
    return json::parse(slurp(fs::path(run) / "run.json"))["starts"];
  }
};

TEST_F(PlanAuto, PicksSaysRecordsTrainsAndResumeKeepsThePick) {
  const std::string cfg = gpt(), run = path("run");
  const Result r = tessel("train " + cfg + " --workers 2 --run-dir " + run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layout = auto: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the fastest of "), std::string::npos) << r.output;
  const json first = starts(run).at(0);
  ASSERT_TRUE(first.contains("layout_auto")) << first.dump(2);
  const json& pick = first["layout_auto"];
  // the layout trained is the one picked: run.json's mesh is the start of the pick's name
  EXPECT_EQ(pick["chosen"]["layout"].get<std::string>().rfind(first["layout"], 0), 0u)
      << pick.dump(2);
  EXPECT_GE(pick["feasible"].get<int>(), 1);
  // the run's config keeps the pick's keys with layout = manual
  const std::string toml = slurp(fs::path(run) / "config.toml");
  const auto holds = [&](const std::string& key, const std::string& value) {
    return toml.find("\n" + key + " = " + value + "\n") != std::string::npos ||
           toml.find("\n" + key + " = '" + value + "'\n") != std::string::npos;
  };
  EXPECT_TRUE(holds("layout", "manual")) << toml;
  for (const std::string set : pick["set"]) {
    const size_t dot = set.find('.'), eq = set.find('=');
    EXPECT_TRUE(holds(set.substr(dot + 1, eq - dot - 1), set.substr(eq + 1))) << set << " not in\n"
                                                                              << toml;
  }
  // a resume (the file still says auto) trains the run's own layout without planning again
  const Result again =
      tessel("train " + cfg + " --workers 2 --resume " + run + " --set train.max_steps=6");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(again.output.find("layout = auto: "), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("says layout = 'auto', but the run's 'manual' stays"),
            std::string::npos)
      << again.output;
  const json second = starts(run).at(1);
  EXPECT_EQ(second["layout"], first["layout"]);
  EXPECT_FALSE(second.contains("layout_auto"));
}

TEST_F(PlanAuto, ACapNoLayoutMeetsFailsAtStartNamingTheCategory) {
  std::ofstream(path("mlp.toml"))
      << "layout = \"auto\"\n[model]\nkind = \"mlp\"\nhidden = [512, 512]\n"
         "[data]\nkind = \"synthetic\"\nsamples = 64\nfeatures = 512\n"
         "[train]\nbatch = 8\nepochs = 1\n[runtime]\nmemory_limit_mb = 1\n";
  const Result r = tessel("train " + path("mlp.toml") + " --workers 2 --run-dir " + path("run"));
  expect_error(r, "layout = auto: no layout of 2 ranks is predicted to fit");
  EXPECT_NE(r.output.find("most of it "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("raise runtime.memory_limit_mb to "), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("run") + "/metrics.jsonl"));
}

TEST_F(PlanAuto, UnderMpiEveryRankTrainsRankZerosPick) {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "needs mpirun";
  const std::string run = path("run");
  const Result r =
      sh("XDG_CACHE_HOME=" + path("cache") + " mpirun --allow-run-as-root --oversubscribe -np 2 " +
         kTessel + " train " + gpt() + " --run-dir " + run + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json first = starts(run).at(0);
  ASSERT_TRUE(first.contains("layout_auto")) << first.dump(2);
  EXPECT_EQ(first["world_size"], 2);
  EXPECT_EQ(first["layout_auto"]["chosen"]["layout"].get<std::string>().rfind(first["layout"], 0),
            0u);
}

}  // namespace
}  // namespace tessel_cli
