// The inference subcommands of the tessel command line, each in its own file: `predict`
// (predict.cc) and `serve` (serve.cc). add_* declares the subcommand and its options; run()
// runs it once parsed and returns the exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

struct InferCommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

InferCommand add_predict(CLI::App& app);
InferCommand add_serve(CLI::App& app);
