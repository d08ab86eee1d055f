// Generation from a tensor-parallel (or pipeline) run's own config: predict and serve run the
// whole GPT on each worker and take the checkpoint as it is, whatever layout trained it, instead
// of refusing the config's tp.size / pp.stages; the server's continuously batched OpenAI
// completions give predict's greedy tokens, and its scheduler reads the worker's parameters
// (one copy of them in the process).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "infer_testing.h"
#include "tessel/config/config.h"
#include "tessel/core/memory.h"
#include "tessel/infer/server.h"

namespace tessel::infer::testing {
namespace {

TEST(GenerateLayout, PredictAndServeTakeATensorParallelRunsOwnConfig) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessel_gen_layout_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 30; ++i) text += "a tensor-parallel run generates as any other. ";
  std::ofstream(dir / "text.txt") << text;
  const std::string config = (dir / "tp.toml").string(), run_dir = (dir / "run").string();
  std::ofstream(config) << "[model]\nkind = \"gpt\"\nlayers = 1\nheads = 2\nembed = 16\n"
                           "[data]\nkind = \"text\"\npath = \""
                        << (dir / "text.txt").string()
                        << "\"\ncontext = 16\n[train]\nbatch = 4\nmax_steps = 2\n"
                           "[runtime]\nworkers = 2\n[tp]\nsize = 2\n[infer]\nmax_new_tokens = 6\n";
  std::ofstream(dir / "prompts.txt") << "a tensor\nrun gen\n";
  Result r = run("train " + config + " --quiet --run-dir " + run_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string predict = "predict " + config + " --checkpoint " + run_dir + " --input " +
                              (dir / "prompts.txt").string() + " --output ";
  r = run(predict + (dir / "own.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tp.size = 2"), std::string::npos) << r.output;  // says what it does
  r = run(predict + (dir / "one.jsonl").string() + " --set tp.size=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string own = slurp((dir / "own.jsonl").string());
  EXPECT_NE(own.find("\"text\""), std::string::npos) << own;
  EXPECT_EQ(own, slurp((dir / "one.jsonl").string()));
  const std::string first = nlohmann::json::parse(own.substr(0, own.find('\n')))["text"];
  // The run's own config, and a pipeline's: served by the scheduler, the greedy completion of
  // prompt 0 is predict's text.
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"tp.size=1", "pp.stages=2"}}) {
    const train::Config c = train::load_config(config, layout);
    const int64_t model_bytes =
        Replica(c, model_info(c, run_dir), nullptr, nullptr).parameter_bytes();
    auto ledger = std::make_shared<MemoryLedger>();
    std::unique_ptr<Server> server;
    {
      MemoryScope scope(ledger, MemCategory::kOther);
      server = std::make_unique<Server>(c, run_dir, 1);
    }
    // One copy of the parameters: the scheduler's model reads the worker's.
    EXPECT_EQ(ledger->current(MemCategory::kParameters), model_bytes);
    const int port = server->bind(0);
    std::thread serving([&] { server->run(); });
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(30);
    const auto res =
        client.Post("/v1/completions",
                    R"({"model": "tp", "prompt": "a tensor", "max_tokens": 6, "temperature": 0})",
                    "application/json");
    server->stop();
    serving.join();
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(nlohmann::json::parse(res->body)["choices"][0]["text"], first) << res->body;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel::infer::testing
