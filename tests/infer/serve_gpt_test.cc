// tessel serve's generations (OpenAI completions, char_gpt trained one step) when nobody will
// take their answer: a request whose client leaves while it waits for a place in the running
// batch, streamed or not, leaves the queue before its prefill, the others unaffected; a stop
// under such load answers every request read; one that had its 504 is cancelled too, and its
// connection serves on.
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "serve_testing.h"
#include "socket_testing.h"

namespace tessel::infer::testing {
namespace {

// A checkpoint of examples/char_gpt.toml trained one step, once per test process.
class ServeGpt : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tessel_serve_gpt_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    const Result r =
        run("train " + config() + " --quiet --set train.max_steps=1 --run-dir " + run_dir());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static std::string config() { return TESSEL_SOURCE_DIR "/examples/char_gpt.toml"; }
  static std::string run_dir() { return (dir_ / "run").string(); }
  static inline fs::path dir_;
};

// The value of the unlabelled /metrics line `name` (-1: none).
int64_t metric(const Running& s, const std::string& name) {
  const auto res = s.client().Get("/metrics");
  const std::string line = "\n" + name + " ";
  const size_t at = res ? res->body.find(line) : std::string::npos;
  return at == std::string::npos ? -1 : std::stoll(res->body.substr(at + line.size()));
}

// Whether metric `name` reaches `want` within 10 s.
bool reaches(const Running& s, const std::string& name, int64_t want) {
  for (int i = 0; i < 1000; ++i) {
    if (metric(s, name) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A connection that has sent POST /v1/completions with `body`, its answer not read.
int send_completion(int port, const std::string& body) {
  const int fd = connect_to(port);
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  if (fd >= 0) (void)!write(fd, request.data(), request.size());
  return fd;
}

// Both places of the running batch taken by long generations (48 steps of at least 20 ms), two
// more wait, one to be streamed and one not, and their clients leave: both leave the queue while
// the long ones run, before any prefill (the prompt tokens read are the long ones' only); the
// long ones get their whole answers, equal to the same request's answer alone.
TEST_F(ServeGpt, GenerationsWhoseClientsLeaveWhileQueuedNeverReachTheModel) {
  Running s({"serve.max_sequences=2", "debug.slow_rank=0", "debug.delay_ms=20"}, config(),
            run_dir());
  const std::string ask =
      R"({"model": "char_gpt", "prompt": "The night", "max_tokens": 48, "temperature": 0})";
  const auto alone = s.client().Post("/v1/completions", ask, "application/json");
  ASSERT_TRUE(alone);
  ASSERT_EQ(alone->status, 200) << alone->body;
  const auto want = nlohmann::json::parse(alone->body);
  ASSERT_EQ(want["usage"]["completion_tokens"], 48) << alone->body;
  const int64_t prompt_tokens = metric(s, "tessel_generate_prompt_tokens");
  EXPECT_EQ(prompt_tokens, 9);  // "The night"
  std::vector<nlohmann::json> got(2);
  std::vector<std::thread> long_ones;
  for (size_t i = 0; i < 2; ++i)
    long_ones.emplace_back([&, i] {
      const auto res = s.client().Post("/v1/completions", ask, "application/json");
      if (res && res->status == 200) got[i] = nlohmann::json::parse(res->body);
    });
  const bool running = reaches(s, "tessel_generate_sequences", 2);
  const int left[] = {
      send_completion(s.port, R"({"model": "char_gpt", "prompt": "A", "max_tokens": 8})"),
      send_completion(s.port, R"({"model": "char_gpt", "prompt": "And I", "stream": true})")};
  const bool queued = reaches(s, "tessel_generate_waiting", 2);
  for (int fd : left) close(fd);
  const bool cancelled = reaches(s, "tessel_generate_cancelled_queued", 2);
  const int64_t still_running = metric(s, "tessel_generate_sequences");
  for (auto& t : long_ones) t.join();
  EXPECT_TRUE(running && queued) << "the long generations did not hold both places";
  EXPECT_TRUE(cancelled) << "the queued generations whose clients left were not cancelled";
  EXPECT_EQ(still_running, 2) << "the queued ones left only when the long ones ended";
  for (const auto& g : got) {
    EXPECT_EQ(g["choices"], want["choices"]) << g.dump();
    EXPECT_EQ(g["usage"], want["usage"]) << g.dump();
  }
  EXPECT_EQ(metric(s, "tessel_generate_prompt_tokens"), prompt_tokens + 2 * 9);
  EXPECT_EQ(metric(s, "tessel_generate_cancelled"), 2);
  const std::string m = s.client().Get("/metrics")->body;
  for (const char* line : {"tessel_requests_total{route=\"/v1/completions\",code=\"200\"} 3\n",
                           "tessel_requests_total{route=\"/v1/completions\",code=\"499\"} 2\n"})
    EXPECT_NE(m.find(line), std::string::npos) << line << " in\n" << m;
}

// Stopped (as SIGTERM stops it) under load from generations, streamed and not, beside clients
// that leave while theirs wait or run: every request read counts as answered (its client's
// leaving too), every answer a client got is whole, and run() returns within 10 s.
TEST_F(ServeGpt, StopUnderGenerationLoadAnswersEveryRequestRead) {
  Running s({"serve.max_sequences=2", "debug.slow_rank=0", "debug.delay_ms=5"}, config(),
            run_dir());
  std::atomic<bool> stop{false};
  std::atomic<int> whole{0}, refused{0}, broken{0}, left{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 6; ++t)
    clients.emplace_back([&, t] {
      const bool stream = t % 2 == 1;
      const std::string ask = std::string(R"({"model": "char_gpt", "prompt": "The night", )") +
                              R"("max_tokens": 16, "stream": )" + (stream ? "true}" : "false}");
      httplib::Client c = s.client();
      while (!stop) {
        const auto res = c.Post("/v1/completions", ask, "application/json");
        if (!res) {
          if (res.error() == httplib::Error::Connection) break;  // no longer listening
          continue;  // a connection closed by the drain before its request was read
        }
        if (res->status == 503) {
          ++refused;
          continue;
        }
        const auto body = nlohmann::json::parse(res->body, nullptr, false);
        const bool ok = res->status == 200 &&
                        (stream ? res->body.ends_with("data: [DONE]\n\n")
                                : !body.is_discarded() && body["usage"]["completion_tokens"] == 16);
        (ok ? whole : broken) += 1;
      }
    });
  for (int t = 0; t < 2; ++t)
    clients.emplace_back([&, t] {
      const std::string ask = R"({"model": "char_gpt", "prompt": "A", "max_tokens": 16})";
      for (int i = 0; !stop; ++i) {
        const int fd = send_completion(s.port, ask);
        if (fd < 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds((7 * i + 11 * t) % 40));
        close(fd);
        ++left;
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  s.server.stop();
  s.thread.join();
  const double stopping =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  for (auto& c : clients) c.join();
  std::printf("%d whole answers, %d refused (503), %d clients left; stopped in %.2f s\n",
              whole.load(), refused.load(), left.load(), stopping);
  EXPECT_LT(stopping, 10);
  EXPECT_GT(whole, 0);
  EXPECT_GT(left, 0);
  EXPECT_EQ(broken, 0);
  EXPECT_EQ(s.server.accepted(), s.server.answered());
}

// A generation that outlasts serve.timeout_s gets a 504 in OpenAI's shape under /v1/; it is
// cancelled before its prefill (its step comes 600 ms in), and the connection serves its next
// request.
TEST_F(ServeGpt, ALateGenerationGets504InOpenAisShape) {
  Running s({"serve.timeout_s=0.3", "debug.slow_rank=0", "debug.delay_ms=600"}, config(),
            run_dir());
  httplib::Client c = s.client();
  c.set_keep_alive(true);
  const auto res =
      c.Post("/v1/completions", R"({"model": "char_gpt", "prompt": "The", "max_tokens": 2})",
             "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 504) << res->body;
  const auto body = nlohmann::json::parse(res->body, nullptr, false);
  ASSERT_TRUE(body.contains("error") && body["error"].is_object()) << res->body;
  EXPECT_EQ(body["error"]["type"], "server_error") << res->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find("serve.timeout_s = 0.3"),
            std::string::npos)
      << res->body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the late answers come and go
  const auto next = c.Get("/v2/health/live");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(metric(s, "tessel_generate_cancelled"), 1);
  EXPECT_EQ(metric(s, "tessel_generate_prompt_tokens"), 0);
}

}  // namespace
}  // namespace tessel::infer::testing
