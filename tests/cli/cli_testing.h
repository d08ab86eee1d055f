// Shared by the tests that run the tessel binary: run it, capture its output and exit code,
// and a fixture with a fresh temporary folder per test.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

namespace tessel_cli {

const std::string kTessel = std::string(TESSEL_BINARY_DIR) + "/apps/tessel/tessel";
const std::string kExamples = std::string(TESSEL_SOURCE_DIR) + "/examples";

struct Result {
  int exit_code = -1;  // -1: killed by a signal (a crash)
  std::string output;  // what the command printed (run: stdout and stderr together)
};

// A shell command line, its output as the line redirects it.
inline Result sh(const std::string& cmd) {
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// tessel with `args`, stdout and stderr together.
inline Result run(const std::string& args) { return sh(kTessel + " " + args + " 2>&1"); }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("tessel_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
            std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// Exit code `code` with an error message containing `needle`.
inline void expect_error_code(const Result& r, int code, const std::string& needle) {
  EXPECT_EQ(r.exit_code, code) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n"
                                                      << r.output;
}

// A library error: exit code 1 and "tessel: error: ...needle...".
inline void expect_error(const Result& r, const std::string& needle) {
  expect_error_code(r, 1, needle);
  EXPECT_NE(r.output.find("tessel: error: "), std::string::npos) << r.output;
}

// The arguments' text, concatenated.
template <typename... Parts>
std::string str_cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline nlohmann::json read_json(const std::string& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

}  // namespace tessel_cli
