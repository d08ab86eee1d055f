// The everyday-use problems of issue 15, each reproduced through the tessel binary: run folders
// that mixed runs, resume after train.max_steps, command-line typos, `tessel config` passing
// configs that train rejects, GPT checkpoints without their vocabulary, float noise in printed
// defaults, and other frameworks' key names suggested as the wrong key.
#include <set>

#include "cli_testing.h"

namespace {

using namespace tessel_cli;

std::string slurp(const std::string& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

// What follows "error: " on the first line that has it.
std::string error_text(const Result& r) {
  const size_t at = r.output.find("error: ");
  if (at == std::string::npos) return "";
  return r.output.substr(at + 7, r.output.find('\n', at) - at - 7);
}

TEST_F(Cli, TrainRefusesAFolderThatHoldsARun) {
  const std::string train =
      "train " + kExamples + "/spiral.toml --quiet --set train.epochs=1 --run-dir " + path("run");
  ASSERT_EQ(run(train + " --set train.epochs=2").exit_code, 0);  // checkpoints at steps 10, 20
  std::ofstream(path("run/notes.txt")) << "mine";
  expect_error(run(train), "--resume");
  expect_error(run(train), "--overwrite");
  // --overwrite starts over (no step-000020 left) and removes only what tessel wrote.
  const Result over = run(train + " --overwrite");
  ASSERT_EQ(over.exit_code, 0) << over.output;
  EXPECT_EQ(slurp(path("run/notes.txt")), "mine");
  std::set<std::string> steps;
  for (const auto& e : fs::directory_iterator(path("run/checkpoints")))
    steps.insert(e.path().filename().string());
  EXPECT_EQ(steps, (std::set<std::string>{"latest", "step-000010"}));
  // run.json: one record per start, with the version, commit and command line.
  const auto record = read_json(path("run/run.json"));
  ASSERT_EQ(record["starts"].size(), 1u) << record;
  const auto& start = record["starts"][0];
  EXPECT_TRUE(start.contains("tessel_version") && start.contains("commit")) << record;
  EXPECT_EQ(start["how"], "overwrite");
  EXPECT_NE(start["command"].get<std::string>().find("--overwrite"), std::string::npos);
  // A folder holding only other files is free; --overwrite and --resume do not go together.
  fs::create_directories(path("other"));
  std::ofstream(path("other/data.csv")) << "1,2\n";
  EXPECT_EQ(run("train " + kExamples + "/spiral.toml --quiet --set train.epochs=1 --run-dir " +
                path("other"))
                .exit_code,
            0);
  EXPECT_EQ(run(train + " --overwrite --resume " + path("run")).exit_code, 2);
}

TEST_F(Cli, ResumeAfterMaxStepsAtFiveStopPointsMatchesOneRun) {
  // spiral: 10 steps an epoch. Stopped by train.max_steps at 5 points of the first epoch and
  // resumed with train.max_steps=17 (mid second epoch), each run ends with the parameters of
  // one run of 17 steps: data position, cosine schedule position and step counter restored.
  for (const char* workers : {"1", "2"}) {
    const std::string common =
        str_cat("train ", kExamples, "/spiral.toml --quiet --workers ", workers,
                " --set train.epochs=3 --set model.dropout=0.1 "
                "--set schedule.kind=cosine --set optim.momentum=0.9 ");
    const std::string full = path(std::string("full") + workers);
    ASSERT_EQ(run(common + "--set train.max_steps=17 --run-dir " + full).exit_code, 0);
    const auto want = read_json(full + "/summary.json");
    EXPECT_EQ(want["steps"], 17);
    for (int stop : {1, 3, 5, 8, 9}) {
      const std::string dir = path(str_cat("part", workers, "_", stop));
      const Result a = run(common + str_cat("--set train.max_steps=", stop, " --run-dir ", dir));
      ASSERT_EQ(a.exit_code, 0) << a.output;
      const Result b =
          run(common + "--set train.max_steps=17 --run-dir " + dir + " --resume " + dir);
      ASSERT_EQ(b.exit_code, 0) << b.output;
      const auto got = read_json(dir + "/summary.json");
      EXPECT_EQ(got["steps"], 17) << "stopped at " << stop;
      EXPECT_EQ(got["params_sha256"], want["params_sha256"])
          << workers << " workers, stop " << stop;
      EXPECT_LE(got["train_seconds"].get<double>(), got["wall_seconds"].get<double>());
    }
  }
}

TEST_F(Cli, CommandLineTyposAreNamed) {
  const Result cmd = run("trian " + kExamples + "/spiral.toml");
  EXPECT_EQ(cmd.exit_code, 2);
  EXPECT_NE(cmd.output.find("did you mean 'train'"), std::string::npos) << cmd.output;
  const Result flag = run("train " + kExamples + "/spiral.toml --worker 2");
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.output.find("did you mean '--workers'"), std::string::npos) << flag.output;
  for (const char* bad : {"0", "-1", "two"}) {
    const Result r = run("train " + kExamples + "/spiral.toml --workers " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.output.find("--workers"), std::string::npos) << r.output;
  }
  const Result missing = run("train " + kExamples + "/spiral.toml --run-dir");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("--run-dir needs a value"), std::string::npos) << missing.output;
  const Result sub = run("ckpt exprt a b");
  EXPECT_NE(sub.output.find("did you mean 'export'"), std::string::npos) << sub.output;
  // --help lists exactly the subcommands that exist.
  const Result help = run("--help");
  for (const char* c : {"train", "eval", "config", "plan", "ckpt", "bench"})
    EXPECT_NE(help.output.find(std::string("  ") + c), std::string::npos) << c;
}

// `tessel plan` says what it lacks: a model, a known GPT size, a link for several hosts.
TEST_F(Cli, PlanNamesWhatIsMissing) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --workers 2", "which model?"},
      {"plan --gpt 7b --workers 8", "use 1.5b, 2.7b, 6.7b, 13b or 175b"},
      {"plan " + kExamples + "/spiral.toml --workers 4 --hosts 2", "needs --bandwidth"},
      {"plan " + kExamples + "/spiral.toml", "--workers is required"}};
  for (const auto& [args, says] : cases) {
    const Result r = run(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << ": " << r.output;
  }
  const Result ok = run("plan --gpt 1.5b --workers 8 --json");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("\"samples_per_second\""), std::string::npos);
}

TEST_F(Cli, ConfigFailsExactlyAsTrainDoes) {
  std::ofstream(path("typo.toml")) << "[train]\nepoch = 3\n";
  std::ofstream(path("gpt.toml")) << "[model]\nkind = \"gpt\"\n[data]\nkind = \"spiral\"\n";
  const std::string spiral = kExamples + "/spiral.toml";
  const std::vector<std::string> bad = {
      path("typo.toml"),
      path("gpt.toml"),  // a GPT needs text
      path("missing.toml"),
      spiral + " --set model.kind=transformer",
      spiral + " --set optim.lr=-1",
      spiral + " --set train.batch=0",
      spiral + " --set train.grad_accum=2",
      spiral + " --workers 3 --set pp.stages=2",  // stages do not divide the ranks
      spiral + " --workers 4 --set pp.stages=4",  // more stages than blocks
      spiral + " --workers 2 --set pp.stages=2 --set pp.microbatches=7",  // 30 rows in 7
      kExamples + "/spiral_ps.toml",                                      // a server and no worker
      kExamples + "/char_gpt.toml --set model.kind=mlp",                  // an MLP needs features
      kExamples + "/fashion_mlp.toml --set data.path=" + path("nowhere"),
      spiral + " --workers 2 --set ps.servers=1 --set zero.stage=1",
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::string& args = bad[i];
    const std::string run_dir = path("run" + std::to_string(i));
    const Result train = run("train " + args + " --quiet --run-dir " + run_dir);
    const Result check = run("config " + args);
    EXPECT_EQ(train.exit_code, 1) << args << "\n" << train.output;
    EXPECT_EQ(check.exit_code, 2) << args << "\n" << check.output;
    EXPECT_FALSE(error_text(check).empty()) << args << "\n" << check.output;
    EXPECT_EQ(error_text(check), error_text(train)) << args;
    EXPECT_FALSE(fs::exists(run_dir + "/summary.json")) << args;
  }
  // A good config prints itself resolved, then the layout, and exits 0.
  const Result ok = run("config " + spiral + " --workers 2 --set pp.stages=2");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("layout   pp=2"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("stage 1  order F0 B0\n"), std::string::npos) << ok.output;
  // ... with no float noise in what it prints.
  EXPECT_EQ(ok.output.find("0000000"), std::string::npos) << ok.output;
  EXPECT_EQ(ok.output.find("9999999"), std::string::npos) << ok.output;
}

TEST_F(Cli, OtherFrameworksNamesPointToTheRightKey) {
  const std::string spiral = "config " + kExamples + "/spiral.toml --set ";
  expect_error_code(run(spiral + "train.grad_accum=2"), 2, "train.accumulate");
  expect_error_code(run(spiral + "train.gradient_accumulation_steps=2"), 2, "train.accumulate");
  expect_error_code(run(spiral + "runtime.world_size=2"), 2, "runtime.workers");
  expect_error_code(run(spiral + "zero.zero_stage=2"), 2, "zero.stage");
}

// A tiny char GPT on `text`, 4 steps.
std::string gpt_args(const std::string& text) {
  return "--set model.kind=gpt --set model.layers=1 --set model.heads=2 --set model.embed=16 "
         "--set data.kind=text --set data.context=8 --set data.test_fraction=0.25 "
         "--set data.path=" +
         text + " --set train.batch=4 --set train.max_steps=4 ";
}

TEST_F(Cli, GptCheckpointsCarryTheirVocabulary) {
  std::ofstream(path("abc.txt")) << std::string(200, 'a') + "bcabcabc cab bac\n" +
                                        std::string(100, 'c');
  std::ofstream(path("ab.txt")) << std::string(100, 'a') + "ba ab b a\n" + std::string(100, 'b');
  std::ofstream(path("xyz.txt")) << "abc abc abx abc " + std::string(100, 'a');
  const std::string spiral = kExamples + "/spiral.toml ";
  const Result t =
      run("train " + spiral + gpt_args(path("abc.txt")) + "--quiet --run-dir " + path("run"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  std::string latest;
  std::ifstream(path("run/checkpoints/latest")) >> latest;
  const auto manifest = read_json(path("run/checkpoints/") + latest + "/manifest.json");
  EXPECT_EQ(manifest["tokenizer"]["kind"], "bytes");
  EXPECT_EQ(manifest["tokenizer"]["vocabulary"], nlohmann::json({'\n', ' ', 'a', 'b', 'c'}));
  // Text with fewer characters reads with the checkpoint's ids (before: its own 4 ids).
  const Result sub =
      run("eval " + spiral + gpt_args(path("ab.txt")) + "--checkpoint " + path("run"));
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  // A character the model never saw is an error naming it.
  expect_error(run("eval " + spiral + gpt_args(path("xyz.txt")) + "--checkpoint " + path("run")),
               "'x' at byte 10");
  // Resuming on other text is refused.
  expect_error(run("train " + spiral + gpt_args(path("ab.txt")) +
                   "--set train.max_steps=6 --quiet "
                   "--run-dir " +
                   path("run") + " --resume " + path("run")),
               "vocabulary");
}

}  // namespace
