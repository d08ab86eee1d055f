// What the predict and serve tests share: running the tessel binary, and a Fashion-MNIST MLP
// checkpoint trained for a few steps once per test process.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace tessel::infer::testing {

namespace fs = std::filesystem;

inline const std::string kTessel = std::string(TESSEL_BINARY_DIR) + "/apps/tessel/tessel";
inline const std::string kTestImages =
    "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz";

struct Result {
  int exit_code = -1;  // -1: killed by a signal
  std::string output;  // stdout and stderr together
};

inline Result run(const std::string& args) {
  const std::string cmd = kTessel + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The first n test images as a plain IDX file.
inline void write_images(const std::string& path, int n) {
  gzFile in = gzopen(kTestImages.c_str(), "rb");
  ASSERT_NE(in, nullptr) << kTestImages << ": run make setup";
  std::string bytes(16 + static_cast<size_t>(n) * 784, '\0');
  ASSERT_EQ(gzread(in, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(in);
  for (int i = 0; i < 4; ++i) bytes[4 + i] = static_cast<char>((n >> (24 - 8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes;
}

// A 784-512-512-10 MLP (2.7 MB of parameters) trained 5 steps, and kRows test images to predict
// in chunks of 300 rows (the last one shorter).
class TrainedMlp : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tessel_infer_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    std::ofstream(config()) << "seed = 1\n[model]\nkind = \"mlp\"\nhidden = [512, 512]\n"
                               "[data]\nkind = \"fashion_mnist\"\n[optim]\nkind = \"sgd\"\n"
                               "lr = 0.05\n[train]\nbatch = 128\nmax_steps = 5\n"
                               "[infer]\nchunk_rows = 300\n";
    write_images(images(), kRows);
    const Result r = run("train " + config() + " --quiet --run-dir " + run_dir());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static std::string config() { return path("config.toml"); }
  static std::string run_dir() { return path("run"); }
  static std::string images() { return path("images.idx"); }
  static constexpr int kRows = 2000;
  // tessel predict of the test images with `args`, into `output`.
  static Result predict(const std::string& output, const std::string& args = "") {
    return run("predict " + config() + " --checkpoint " + run_dir() + " --input " + images() +
               " --output " + path(output) + " " + args);
  }
  static inline fs::path dir_;
};

inline void expect_error(const Result& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tessel: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n"
                                                      << r.output;
}

}  // namespace tessel::infer::testing
