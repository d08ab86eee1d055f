// `tessel predict` from a trained stack of text layers: the greedy text of the gpt it states
// (same seed, same steps, so the same parameters); Hugging Face export names what it takes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../infer/infer_testing.h"

namespace tessel::infer::testing {
namespace {

// The "text" of each line of predict's JSON lines.
std::vector<std::string> texts(const std::string& jsonl) {
  std::vector<std::string> out;
  std::istringstream in(jsonl);
  for (std::string line; std::getline(in, line);)
    out.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
  return out;
}

TEST(TextStackPredict, GeneratesTheGreedyTextOfTheEqualGpt) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessel_text_stack_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 30; ++i) text += "a stack of text layers generates as a gpt does. ";
  std::ofstream(dir / "text.txt") << text;
  std::ofstream(dir / "prompts.txt") << "a stack\ntext lay\n";
  const std::string rest = "[data]\nkind = \"text\"\npath = \"" + (dir / "text.txt").string() +
                           "\"\ncontext = 16\n[train]\nbatch = 4\nmax_steps = 150\n"
                           "[optim]\nkind = \"adamw\"\nlr = 0.01\n[infer]\nmax_new_tokens = 6\n";
  std::ofstream(dir / "gpt.toml") << "[model]\nkind = \"gpt\"\nlayers = 1\nheads = 2\nembed = 16\n"
                                  << rest;
  std::ofstream(dir / "stack.toml")
      << "[model]\nkind = \"sequential\"\nstack = [{type = \"embedding\", channels = 16}, "
         "{type = \"transformer\", heads = 2}, {type = \"lm_head\"}]\n"
      << rest;
  std::vector<std::string> outputs[2];
  for (int k = 0; k < 2; ++k) {
    const std::string name = k == 0 ? "gpt" : "stack";
    const std::string config = (dir / (name + ".toml")).string(),
                      run_dir = (dir / (name + "_run")).string();
    Result r = run("train " + config + " --quiet --run-dir " + run_dir);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run("predict " + config + " --checkpoint " + run_dir + " --input " +
            (dir / "prompts.txt").string() + " --output " + (dir / (name + ".jsonl")).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    outputs[k] = texts(slurp((dir / (name + ".jsonl")).string()));
  }
  ASSERT_EQ(outputs[1].size(), 2u);
  // Trained far enough to continue the text (" of te" when written), not only spaces.
  EXPECT_NE(outputs[1][0].find_first_not_of(' '), std::string::npos) << outputs[1][0];
  EXPECT_EQ(outputs[1], outputs[0]);
  const Result hf =
      run("ckpt export --format hf " + (dir / "stack_run").string() + " " + (dir / "hf").string());
  EXPECT_NE(hf.exit_code, 0);
  EXPECT_NE(hf.output.find("'sequential' model"), std::string::npos) << hf.output;
  EXPECT_NE(hf.output.find("model.kind = \"gpt\""), std::string::npos) << hf.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel::infer::testing
