// tessel serve: answers under concurrent load with each request's own rows, batched; gives each
// bad request a clear 4xx JSON error; and on SIGTERM mid-load answers every request it read
// (the tessel process under load from HTTP clients, Debian's cpp-httplib).
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "infer_testing.h"
#include "tessel/infer/server.h"

namespace tessel::infer::testing {
namespace {

using Serve = TrainedMlp;

std::string rows_body(int n, float value) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < n; ++i) rows.push_back(std::vector<float>(784, value + 0.01f * i));
  return nlohmann::json{{"inputs", rows}}.dump();
}

// A server on a free loopback port, running until the test ends.
struct Running {
  explicit Running(const std::vector<std::string>& overrides = {},
                   const std::string& config_path = TrainedMlp::config(),
                   const std::string& run_dir = TrainedMlp::run_dir())
      : config(train::load_config(config_path, overrides)),
        server(config, run_dir, 2),
        port(server.bind(0)),
        thread([this] { server.run(); }) {}
  ~Running() {
    server.stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30);
    return c;
  }
  train::Config config;
  Server server;
  int port;
  std::thread thread;
};

void expect_status(const httplib::Result& res, int status, const std::string& needle) {
  ASSERT_TRUE(res) << "no response: " << httplib::to_string(res.error());
  EXPECT_EQ(res->status, status) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const auto body = nlohmann::json::parse(res->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << res->body;
  EXPECT_EQ(body["error"]["code"], status) << res->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find(needle), std::string::npos)
      << "expected '" << needle << "' in " << res->body;
}

TEST_F(Serve, EachBadRequestGetsAClearClientError) {
  Running s({"serve.max_batch=4", "serve.max_body_kb=256"});
  httplib::Client c = s.client();
  const char* json = "application/json";
  expect_status(c.Post("/v1/predict", "{\"inputs\": [[1, 2", json), 400, "malformed JSON");
  expect_status(c.Post("/v1/predict", "[1, 2]", json), 400, "JSON object with \"inputs\"");
  expect_status(c.Post("/v1/predict", "{\"input\": []}", json), 400, "\"inputs\"");
  expect_status(c.Post("/v1/predict", "{\"inputs\": []}", json), 400, "1 to serve.max_batch = 4");
  expect_status(c.Post("/v1/predict", rows_body(5, 0), json), 400, "got 5");
  expect_status(c.Post("/v1/predict", "{\"inputs\": [[1, 2, 3]]}", json), 400,
                "inputs[0] must be a flat array of 784 numbers");
  std::string text_row = rows_body(1, 0);
  text_row.replace(text_row.find("0.0"), 3, "\"x\"");
  expect_status(c.Post("/v1/predict", text_row, json), 400, "inputs[0][0] must be a number");
  expect_status(c.Post("/v1/predict", std::string(300 << 10, ' '), json), 413, "serve.max_body_kb");
  expect_status(c.Get("/v2/predict"), 404, "no route GET /v2/predict");
  expect_status(c.Get("/v1/predict"), 405, "use POST");
  expect_status(c.Post("/healthz", "", json), 405, "use GET");
  // The server still answers well-formed requests.
  auto ok = c.Post("/v1/predict", rows_body(2, 0.5f), json);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(nlohmann::json::parse(ok->body)["outputs"].size(), 2u);
  auto health = c.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(nlohmann::json::parse(health->body)["status"], "ok");
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name : {"tessel_requests_total{route=\"/v1/predict\",code=\"400\"} 7",
                           "tessel_request_duration_seconds_bucket", "tessel_batch_rows_bucket",
                           "tessel_queue_requests"})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name << " in\n" << metrics->body;
}

TEST_F(Serve, ConcurrentRequestsAreBatchedAndGetTheirOwnRows) {
  Running s;
  // The answer to each of 8 distinct requests, one at a time.
  std::vector<std::string> alone(8);
  for (int k = 0; k < 8; ++k) {
    auto res = s.client().Post("/v1/predict", rows_body(1 + k % 3, 0.1f * k), "application/json");
    ASSERT_TRUE(res && res->status == 200);
    alone[k] = res->body;
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 16; ++t)
    clients.emplace_back([&, t] {
      httplib::Client c = s.client();
      for (int i = 0; i < 15; ++i) {
        const int k = (t + i) % 8;
        auto res = c.Post("/v1/predict", rows_body(1 + k % 3, 0.1f * k), "application/json");
        if (!res || res->status != 200 || res->body != alone[k]) ++wrong;
      }
    });
  for (auto& c : clients) c.join();
  EXPECT_EQ(wrong, 0);
  const std::string m = s.server.metrics().prometheus();
  const size_t at = m.find("tessel_batch_rows_count ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stol(m.substr(at + 24)), 8 + 16 * 15) << "no two requests were batched";
}

TEST_F(Serve, GptPromptsAndTheirErrors) {
  const std::string gpt = std::string(TESSEL_SOURCE_DIR) + "/examples/char_gpt.toml";
  const Result trained =
      run("train " + gpt + " --quiet --set train.max_steps=1 --run-dir " + path("gpt"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  Running s({}, gpt, path("gpt"));
  httplib::Client c = s.client();
  const char* json = "application/json";
  const std::string ask = R"({"prompts": ["The night", "A"], "max_new_tokens": 12})";
  auto res = c.Post("/v1/predict", ask, json);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto out = nlohmann::json::parse(res->body)["outputs"];
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["text"].get<std::string>().size(), 12u);
  EXPECT_EQ(c.Post("/v1/predict", ask, json)->body, res->body);  // greedy: the same text
  expect_status(c.Post("/v1/predict", R"({"prompts": [3]})", json), 400,
                "prompts[0] must be a string");
  expect_status(c.Post("/v1/predict", R"({"prompts": [""]})", json), 400, "non-empty");
  expect_status(c.Post("/v1/predict", R"({"prompts": ["ok", "a~"]})", json), 400,
                "prompts[1]: generate: byte 1");
  expect_status(c.Post("/v1/predict", R"({"prompts": ["A"], "max_new_tokens": 64})", json), 400,
                "context of 64");
  expect_status(c.Post("/v1/predict", R"({"prompts": ["A"], "max_new_tokens": "9"})", json), 400,
                "\"max_new_tokens\" must be a non-negative integer");
  expect_status(c.Post("/v1/predict", R"({"inputs": [[1]]})", json), 400, "\"prompts\"");
}

// Starts `tessel serve` on a free port; returns its pid and port.
std::pair<pid_t, int> start_serve(const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    FILE* out = freopen(log.c_str(), "w", stdout);
    (void)out;
    dup2(fileno(stdout), 2);
    execl(kTessel.c_str(), kTessel.c_str(), "serve", TrainedMlp::config().c_str(), "--checkpoint",
          TrainedMlp::run_dir().c_str(), "--port", "0", "--workers", "2", nullptr);
    _exit(127);
  }
  for (int i = 0; i < 600; ++i) {  // 60 s for the port line
    const std::string text = slurp(log);
    const size_t at = text.find("http://127.0.0.1:");
    if (at != std::string::npos) return {pid, std::stoi(text.substr(at + 17))};
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  return {pid, -1};
}

TEST_F(Serve, SigtermMidLoadAnswersEveryRequestItRead) {
  const std::string log = path("serve.log");
  const auto [pid, port] = start_serve(log);
  ASSERT_GT(port, 0) << slurp(log);
  std::atomic<int64_t> answered{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int t = 0; t < 32; ++t)
    clients.emplace_back([&, t, port = port] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(30);
      while (!stop) {
        auto res = c.Post("/v1/predict", rows_body(1 + t % 4, 0.2f), "application/json");
        if (res)
          ++answered;  // 200, or 503 once draining
        else if (res.error() == httplib::Error::Connection)
          break;  // no longer listening
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const int64_t before = answered;
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  stop = true;
  for (auto& c : clients) c.join();
  const std::string text = slurp(log);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_GT(before, 0) << "no request answered before SIGTERM";
  // Every request the server read was answered, and every answer reached a client.
  const size_t at = text.find("stopped; ");
  ASSERT_NE(at, std::string::npos) << text;
  int64_t read = -1, sent = -1;
  ASSERT_EQ(sscanf(text.c_str() + at, "stopped; %ld requests read, %ld answered", &read, &sent), 2);
  std::printf("%ld answered before SIGTERM, %ld in all; the server read %ld\n",
              static_cast<long>(before), static_cast<long>(answered.load()),
              static_cast<long>(read));
  EXPECT_EQ(read, sent) << text;
  EXPECT_EQ(sent, answered.load()) << text;
}

}  // namespace
}  // namespace tessel::infer::testing
