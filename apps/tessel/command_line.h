// Command-line mistakes, explained: before CLI11 parses, the arguments are walked against the
// subcommands and flags the app declares, so a mistyped command or flag is named with the
// nearest valid one ("did you mean"), a flag without its value or with a value of the wrong
// type says which, and CLI11's own errors are prefixed with the subcommand they concern. The
// declarations stay the only list of what exists.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tessel::cli {

// The arguments after the program name, with "-np" (mpirun's spelling) as "--np".
std::vector<std::string> arguments(int argc, char** argv);

struct Walk {
  std::string command;  // "tessel train", the deepest subcommand named
  std::string error;    // what is wrong ("" when the walk found nothing), for "<command>: error: "
};
// Walks `args` through app's subcommands and flags.
Walk walk(const CLI::App& app, const std::vector<std::string>& args);
// CLI11's error as a message for the person, naming the subcommand.
std::string explain(const Walk& walk, const CLI::ParseError& e);

// A CLI11 check that an integer flag is at least `min`, saying what the flag counts.
CLI::Validator at_least(int64_t min, const std::string& what);

}  // namespace tessel::cli
