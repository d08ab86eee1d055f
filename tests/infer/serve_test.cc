// tessel serve: answers under concurrent load with each request's own rows, batched; speaks the
// KServe v2 protocol; gives each bad request a clear 4xx/503 JSON error and stays up; and on
// SIGTERM mid-load answers every request it read (the tessel process under load from HTTP
// clients: Debian's cpp-httplib as the client, and raw sockets for what it cannot send).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve_testing.h"
#include "socket_testing.h"

namespace tessel::infer::testing {
namespace {

using Serve = TrainedMlp;

std::string rows_body(int n, float value) {
  nlohmann::json rows = nlohmann::json::array();
  for (int i = 0; i < n; ++i) rows.push_back(std::vector<float>(784, value + 0.01f * i));
  return nlohmann::json{{"inputs", rows}}.dump();
}

// A KServe v2 infer body of n rows of 784 `datatype` values (row i: value + 0.01 i).
nlohmann::json v2_body(int n, float value, const std::string& datatype = "FP32") {
  std::vector<float> data;
  for (int i = 0; i < n; ++i) data.insert(data.end(), 784, value + 0.01f * i);
  nlohmann::json in = {{"name", "input"}, {"shape", {n, 784}}, {"datatype", datatype}};
  in["data"] = data;
  return {{"id", "r1"}, {"inputs", {in}}};
}

// What the server sends back to `request` on a fresh connection, read until it closes the
// connection or `seconds` pass.
std::string raw_exchange(int port, const std::string& request, double seconds = 10) {
  const int fd = connect_to(port);
  if (fd < 0) return "no connection";
  timeval tv{static_cast<time_t>(seconds), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)!write(fd, request.data(), request.size());
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fd);
  return got;
}

void expect_status(const httplib::Result& res, int status, const std::string& needle) {
  ASSERT_TRUE(res) << "no response: " << httplib::to_string(res.error());
  EXPECT_EQ(res->status, status) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const auto body = nlohmann::json::parse(res->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << res->body;
  ASSERT_TRUE(body["error"].is_string()) << res->body;
  EXPECT_NE(body["error"].get<std::string>().find(needle), std::string::npos)
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
  expect_status(c.Post("/v2/health/ready", "", json), 405, "use GET");
  // The server still answers well-formed requests.
  auto ok = c.Post("/v1/predict", rows_body(2, 0.5f), json);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(nlohmann::json::parse(ok->body)["outputs"].size(), 2u);
  // curl -d's default content type on a JSON body over 8 KiB: read as JSON, within the limit.
  const std::string four = rows_body(4, 0.5f);
  ASSERT_GT(four.size(), 8192u);
  auto form = c.Post("/v1/predict", four, "application/x-www-form-urlencoded");
  ASSERT_TRUE(form);
  EXPECT_EQ(form->status, 200) << form->body;
  auto health = c.Get("/v2/health/ready");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find("code=\"-1\""), std::string::npos) << metrics->body;
  for (const char* name : {"tessel_requests_total{route=\"/v1/predict\",code=\"400\"} 7",
                           "tessel_request_duration_seconds_bucket", "tessel_batch_rows_bucket",
                           "tessel_queue_requests"})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name << " in\n" << metrics->body;
}

TEST_F(Serve, ConcurrentRequestsAreBatchedAndGetTheirOwnRows) {
  Running s({"serve.max_wait_ms=2"});
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
                "prompts[1]: tokenizer: the text holds 1 bytes outside");
  expect_status(c.Post("/v1/predict", R"({"prompts": ["A"], "max_new_tokens": 64})", json), 400,
                "context of 64");
  expect_status(c.Post("/v1/predict", R"({"prompts": ["A"], "max_new_tokens": "9"})", json), 400,
                "\"max_new_tokens\" must be a non-negative integer");
  expect_status(c.Post("/v1/predict", R"({"inputs": [[1]]})", json), 400, "\"prompts\"");
  // KServe v2: BYTES prompts, the same text as /v1/predict's.
  const std::string infer = "/v2/models/char_gpt/infer";
  const auto meta = nlohmann::json::parse(c.Get("/v2/models/char_gpt")->body);
  EXPECT_EQ(meta["inputs"][0].dump(), R"({"datatype":"BYTES","name":"prompt","shape":[-1]})");
  auto v2 = c.Post(infer,
                   R"({"inputs": [{"name": "prompt", "shape": [2], "datatype": "BYTES",
                       "data": ["The night", "A"]}], "parameters": {"max_new_tokens": 12}})",
                   json);
  ASSERT_EQ(v2->status, 200) << v2->body;
  const auto text = nlohmann::json::parse(v2->body)["outputs"][0];
  EXPECT_EQ(text["name"], "text");
  EXPECT_EQ(text["datatype"], "BYTES");
  EXPECT_EQ(text["data"][0], out[0]["text"]);
  EXPECT_EQ(text["data"][1], out[1]["text"]);
  // The prompts as binary BYTES (a 4-byte length, then the bytes), the text as bytes too.
  const std::string head =
      R"({"inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES", "parameters":
          {"binary_data_size": 13}}], "parameters": {"max_new_tokens": 12,
          "binary_data_output": true}})";
  const std::string length = std::to_string(head.size());
  auto bin = c.Post(infer, {{"Inference-Header-Content-Length", length}},
                    head + std::string("\x09\0\0\0The night", 13), "application/octet-stream");
  ASSERT_EQ(bin->status, 200) << bin->body;
  const size_t at = std::stoul(bin->get_header_value("Inference-Header-Content-Length"));
  EXPECT_EQ(bin->body.substr(at), std::string("\x0c\0\0\0", 4) + out[0]["text"].get<std::string>());
  expect_status(c.Post(infer, {{"Inference-Header-Content-Length", length}},
                       head + std::string("\x0a\0\0\0The night", 13), "application/octet-stream"),
                400, "is not BYTES elements");
  expect_status(c.Post(infer,
                       R"({"inputs": [{"name": "prompt", "shape": [1], "datatype": "FP32",
                           "data": [1]}]})",
                       json),
                400, "a gpt model takes BYTES");
  expect_status(c.Post(infer,
                       R"({"inputs": [{"name": "prompt", "shape": [1], "datatype": "BYTES",
                           "data": ["A"]}], "parameters": {"max_new_tokens": -1}})",
                       json),
                400, "parameters \"max_new_tokens\" must be a non-negative integer");
}

// Raw pixel values (0..255, as an IDX file holds them) answer as predict answers the image file:
// the server applies training's normalisation (stored in the checkpoint), the client none.
TEST_F(Serve, RawPixelsAnswerAsPredictOfTheImageFile) {
  const Result p = predict("raw.jsonl");
  ASSERT_EQ(p.exit_code, 0) << p.output;
  const std::string images = slurp(TrainedMlp::images()), lines = slurp(path("raw.jsonl"));
  constexpr int kRows = 3;
  nlohmann::json rows = nlohmann::json::array();
  for (int r = 0; r < kRows; ++r) {
    std::vector<int> row(784);
    for (int i = 0; i < 784; ++i) row[i] = static_cast<uint8_t>(images[16 + r * 784 + i]);
    rows.push_back(row);
  }
  Running s;
  httplib::Client c = s.client();
  auto res = c.Post("/v1/predict", nlohmann::json{{"inputs", rows}}.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto got = nlohmann::json::parse(res->body)["outputs"];
  size_t at = 0;
  for (int r = 0; r < kRows; ++r) {
    const size_t end = lines.find('\n', at);
    const auto want = nlohmann::json::parse(lines.substr(at, end - at));
    at = end + 1;
    EXPECT_EQ(got[r]["class"], want["class"]) << r;
    ASSERT_EQ(got[r]["top_k"].size(), want["top_k"].size()) << r;
    for (size_t k = 0; k < want["top_k"].size(); ++k) {  // batches of another size: the last digit
      EXPECT_EQ(got[r]["top_k"][k]["class"], want["top_k"][k]["class"]) << r;
      EXPECT_NEAR(got[r]["top_k"][k]["prob"].get<double>(), want["top_k"][k]["prob"].get<double>(),
                  2e-6)
          << r;
    }
  }
}

TEST_F(Serve, KserveV2MetadataAndInferAnswerAsPredictDoes) {
  Running s({"serve.max_batch=4", "serve.max_body_kb=256"});
  httplib::Client c = s.client();
  const std::string model = "/v2/models/" + s.config.name;
  for (const std::string& route :
       std::vector<std::string>{"/v2/health/live", "/v2/health/ready", model + "/ready"})
    EXPECT_EQ(c.Get(route)->status, 200) << route;
  const auto meta = nlohmann::json::parse(c.Get(model)->body);
  EXPECT_EQ(meta["name"], s.config.name);
  EXPECT_EQ(meta["inputs"][0].dump(), R"({"datatype":"FP32","name":"input","shape":[-1,784]})");
  EXPECT_EQ(meta["outputs"][2].dump(), R"({"datatype":"FP64","name":"top_k_prob","shape":[-1,5]})");
  // The answer of /v1/predict for the same rows, as tensors.
  auto v2 = c.Post(model + "/infer", v2_body(3, 0.3f).dump(), "application/json");
  ASSERT_EQ(v2->status, 200) << v2->body;
  const auto got = nlohmann::json::parse(v2->body);
  const auto v1 = nlohmann::json::parse(
      c.Post("/v1/predict", rows_body(3, 0.3f), "application/json")->body)["outputs"];
  EXPECT_EQ(got["model_name"], s.config.name);
  EXPECT_EQ(got["id"], "r1");
  ASSERT_EQ(got["outputs"].size(), 3u);
  EXPECT_EQ(got["outputs"][1]["shape"].dump(), "[3,5]");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got["outputs"][0]["data"][i], v1[i]["class"]);
    for (int j = 0; j < 5; ++j) {
      EXPECT_EQ(got["outputs"][1]["data"][i * 5 + j], v1[i]["top_k"][j]["class"]);
      EXPECT_EQ(got["outputs"][2]["data"][i * 5 + j], v1[i]["top_k"][j]["prob"]);
    }
  }
  // Nested data, integer datatypes and a chosen output.
  nlohmann::json ints = v2_body(1, 1, "UINT8");
  ints["inputs"][0]["data"] = std::vector<int>(784, 1);
  ints["outputs"] = {{{"name", "class"}}};
  auto one = c.Post(model + "/infer", ints.dump(), "application/json");
  ASSERT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(nlohmann::json::parse(one->body)["outputs"].size(), 1u);
  const char* json = "application/json";
  auto with = [](nlohmann::json b, const std::string& key, const nlohmann::json& v) {
    b["inputs"][0][key] = v;
    return b.dump();
  };
  const nlohmann::json b = v2_body(1, 0.5f);
  expect_status(c.Post("/v2/models/nope/infer", b.dump(), json), 404, "unknown model");
  expect_status(c.Get("/v2/models/nope"), 404, "this server serves");
  expect_status(c.Post(model + "/infer", "{\"inputs\": [", json), 400, "malformed JSON");
  expect_status(c.Post(model + "/infer", "{}", json), 400, "\"inputs\": [one tensor");
  expect_status(c.Post(model + "/infer", with(b, "shape", {1, 783}), json), 400,
                "has shape [1,783]; the model takes [-1, 784]");
  expect_status(c.Post(model + "/infer", with(b, "shape", {5, 784}), json), 400,
                "serve.max_batch = 4");
  expect_status(c.Post(model + "/infer", with(b, "data", {1, 2}), json), 400,
                "has 2 values; its shape holds 784");
  expect_status(c.Post(model + "/infer", with(b, "datatype", "BYTES"), json), 400,
                "has datatype BYTES");
  expect_status(c.Post(model + "/infer", with(b, "datatype", "INT32"), json), 400,
                "not an integer of INT32");
  expect_status(c.Post(model + "/infer", with(b, "name", "x"), json), 400, "unknown input");
  nlohmann::json bad_out = b;
  bad_out["outputs"] = {{{"name", "probs"}}};
  expect_status(c.Post(model + "/infer", bad_out.dump(), json), 400, "unknown output");
  expect_status(c.Post(model + "/infer", std::string(300 << 10, ' '), json), 413,
                "serve.max_body_kb = 256");
  expect_status(c.Get(model + "/infer"), 405, "use POST");
  EXPECT_EQ(c.Post(model + "/infer", b.dump(), json)->status, 200);  // still up
}

// The binary-tensor extension (what tritonclient sends by default): an input's values as bytes
// after the JSON, outputs as bytes when asked; the answers of JSON tensors; and its errors.
TEST_F(Serve, BinaryTensorsAnswerAsJsonTensorsDo) {
  Running s({"serve.max_batch=4"});
  httplib::Client c = s.client();
  const std::string infer = "/v2/models/" + s.config.name + "/infer";
  const nlohmann::json plain = v2_body(3, 0.3f);
  const auto want = nlohmann::json::parse(c.Post(infer, plain.dump(), "application/json")->body);
  const std::vector<float> values = plain["inputs"][0]["data"];
  const std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  nlohmann::json head = plain;
  head["inputs"][0].erase("data");
  head["inputs"][0]["parameters"] = {{"binary_data_size", bytes.size()}};
  auto post = [&](const nlohmann::json& h, const std::string& b, std::string length = "") {
    const std::string j = h.dump();
    if (length.empty()) length = std::to_string(j.size());
    return c.Post(infer, {{"Inference-Header-Content-Length", length}}, j + b,
                  "application/octet-stream");
  };
  auto res = post(head, bytes);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(nlohmann::json::parse(res->body), want);
  // UINT8 and BF16 bytes (200 is 0x4348 in bf16) answer as the same integers in JSON.
  nlohmann::json ints = v2_body(1, 0, "UINT8"), ints_head = ints;
  ints["inputs"][0]["data"] = std::vector<int>(784, 200);
  const std::string by_json = c.Post(infer, ints.dump(), "application/json")->body;
  ints_head["inputs"][0].erase("data");
  ints_head["inputs"][0]["parameters"] = {{"binary_data_size", 784}};
  EXPECT_EQ(post(ints_head, std::string(784, static_cast<char>(200)))->body, by_json);
  ints_head["inputs"][0]["datatype"] = "BF16";
  ints_head["inputs"][0]["parameters"] = {{"binary_data_size", 2 * 784}};
  std::string bf16;
  for (int i = 0; i < 784; ++i) bf16 += "\x48\x43";
  EXPECT_EQ(post(ints_head, bf16)->body, by_json);
  // Every output as bytes: class and top_k_class INT64, top_k_prob FP64, after the JSON.
  head["parameters"] = {{"binary_data_output", true}};
  res = post(head, bytes);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/octet-stream");
  const size_t json_bytes = std::stoul(res->get_header_value("Inference-Header-Content-Length"));
  const auto got = nlohmann::json::parse(res->body.substr(0, json_bytes));
  size_t at = json_bytes;
  for (int o = 0; o < 3; ++o) {
    const auto& out = got["outputs"][o];
    const auto& expected = want["outputs"][o]["data"];
    EXPECT_FALSE(out.contains("data"));
    EXPECT_EQ(out["shape"], want["outputs"][o]["shape"]);
    ASSERT_EQ(out["parameters"]["binary_data_size"], 8 * expected.size());
    for (size_t i = 0; i < expected.size(); ++i, at += 8) {
      int64_t i64;
      double f64;
      std::memcpy(&i64, res->body.data() + at, 8);
      std::memcpy(&f64, res->body.data() + at, 8);
      EXPECT_EQ(o < 2 ? nlohmann::json(i64) : nlohmann::json(f64), expected[i]) << out;
    }
  }
  EXPECT_EQ(at, res->body.size());
  // An output's "binary_data" overrides the request's "binary_data_output".
  head["outputs"] = {{{"name", "class"}, {"parameters", {{"binary_data", false}}}}};
  res = post(head, bytes);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(nlohmann::json::parse(res->body)["outputs"][0]["data"], want["outputs"][0]["data"]);
  // Errors name what is wrong.
  expect_status(post(head, bytes, "x"), 400, "Inference-Header-Content-Length is \"x\"");
  expect_status(post(head, bytes, "99999"), 400, "at most the body's");
  expect_status(post(head, bytes.substr(4)), 400, "binary_data_size 9408 but 9404 bytes follow");
  nlohmann::json both = head, fewer = head, flag = head;
  both["inputs"][0]["data"] = values;
  expect_status(post(both, bytes), 400, "either \"data\"");
  fewer["inputs"][0]["shape"] = {2, 784};
  expect_status(post(fewer, bytes), 400, "9408 bytes of binary data; its shape holds 1568 FP32");
  expect_status(post(plain, "abc"), 400, "3 bytes after its JSON");
  flag["outputs"][0]["parameters"]["binary_data"] = "yes";
  expect_status(post(flag, bytes), 400, "\"binary_data\" must be true or false");
  EXPECT_EQ(post(head, bytes)->status, 200);  // still up
}

TEST_F(Serve, AFloodBeyondTheQueueGets503WithRetryAfterAndTheServerStaysUp) {
  Running s({"serve.max_batch=1", "serve.max_queue=1", "serve.max_wait_ms=0"});
  const std::string infer = "/v2/models/" + s.config.name + "/infer";
  const std::string body = v2_body(1, 0.2f).dump();
  std::atomic<int> ok{0}, full{0}, other{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 32; ++t)
    clients.emplace_back([&] {
      httplib::Client c = s.client();
      for (int i = 0; i < 20; ++i) {
        auto res = c.Post(infer, body, "application/json");
        if (res && res->status == 200)
          ++ok;
        else if (res && res->status == 503 && res->get_header_value("Retry-After") == "1" &&
                 res->body.find("queue full") != std::string::npos)
          ++full;
        else
          ++other;
      }
    });
  for (auto& c : clients) c.join();
  std::printf("flood of 640 requests: %d answered, %d queue full\n", ok.load(), full.load());
  EXPECT_GT(full, 0);
  EXPECT_GT(ok, 0);
  EXPECT_EQ(other, 0);
  EXPECT_EQ(s.client().Post(infer, body, "application/json")->status, 200);
}

TEST_F(Serve, TheTransportsLimitsAnswerInTheProtocolsShape) {
  Running s({"serve.connections=1", "serve.timeout_s=0.5"});
  const std::string post = "POST /v1/predict HTTP/1.1\r\nHost: x\r\n";
  // A connection beyond serve.connections while another is open.
  {
    httplib::Client held = s.client();
    held.set_keep_alive(true);
    ASSERT_EQ(held.Get("/v2/health/live")->status, 200);
    const std::string refused = raw_exchange(s.port, "GET /v2/health/live HTTP/1.1\r\n\r\n");
    EXPECT_NE(refused.find("503 Service Unavailable"), std::string::npos) << refused;
    EXPECT_NE(refused.find("Retry-After: 1"), std::string::npos) << refused;
    EXPECT_NE(refused.find("serve.connections = 1"), std::string::npos) << refused;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the held connection closes
  const std::string slow = raw_exchange(s.port, post + "Content-Length: 100\r\n\r\n{");
  EXPECT_NE(slow.find("408 Request Timeout"), std::string::npos) << slow;
  EXPECT_NE(slow.find("serve.timeout_s = 0.5"), std::string::npos) << slow;
  const std::string garbage = raw_exchange(s.port, "NOT HTTP\r\n\r\n");
  EXPECT_NE(garbage.find("400 Bad Request"), std::string::npos) << garbage;
  EXPECT_NE(garbage.find("malformed HTTP request"), std::string::npos) << garbage;
  const std::string headers =
      raw_exchange(s.port, post + "X-Big: " + std::string(20 << 10, 'a') + "\r\n\r\n");
  EXPECT_NE(headers.find("431"), std::string::npos) << headers;
  EXPECT_NE(headers.find("request headers over 16 KiB"), std::string::npos) << headers;
  // curl's Expect: 100-continue for larger bodies: told to go on, then answered.
  const std::string body = rows_body(1, 0.5f);
  const std::string expect =
      raw_exchange(s.port, post + "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(expect.rfind("HTTP/1.1 100 Continue\r\n", 0), 0u) << expect;
  EXPECT_NE(expect.find("HTTP/1.1 200 OK"), std::string::npos) << expect;
}

// The JSON body of a raw HTTP answer (discarded when it has none).
nlohmann::json body_of(const std::string& answer) {
  const size_t at = answer.find("\r\n\r\n");
  return nlohmann::json::parse(at == std::string::npos ? "" : answer.substr(at + 4), nullptr,
                               false);
}

// OpenAI's {"error": {"message", "type", ...}} whose message holds `needle`.
void expect_openai_error(const nlohmann::json& body, const std::string& needle) {
  ASSERT_TRUE(body.contains("error") && body["error"].is_object()) << body.dump();
  EXPECT_EQ(body["error"]["type"], "invalid_request_error") << body.dump();
  EXPECT_NE(body["error"]["message"].get<std::string>().find(needle), std::string::npos)
      << "expected '" << needle << "' in " << body.dump();
}

TEST_F(Serve, TheTransportsLimitsUnderV1AreOpenAiShaped) {
  Running s({"serve.connections=1", "serve.timeout_s=0.5", "serve.max_body_kb=256"});
  const std::string big(20 << 10, 'a');
  // Each transport limit under an OpenAI route, then the same under a v2 route.
  std::string headers = raw_exchange(
      s.port, "POST /v1/completions?x=1 HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n");
  EXPECT_NE(headers.find("431"), std::string::npos) << headers;
  expect_openai_error(body_of(headers), "request headers over 16 KiB");
  headers =
      raw_exchange(s.port, "POST /v2/models/config/infer HTTP/1.1\r\nX-Big: " + big + "\r\n\r\n");
  EXPECT_TRUE(body_of(headers)["error"].is_string()) << headers;
  const std::string cut_body = raw_exchange(
      s.port, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
  EXPECT_NE(cut_body.find("408 Request Timeout"), std::string::npos) << cut_body;
  expect_openai_error(body_of(cut_body), "serve.timeout_s = 0.5");
  const std::string cut_head = raw_exchange(s.port, "POST /v1/completions HT");  // request line
  EXPECT_NE(cut_head.find("408 Request Timeout"), std::string::npos) << cut_head;
  expect_openai_error(body_of(cut_head), "serve.timeout_s = 0.5");
  httplib::Client c = s.client();
  auto res = c.Post("/v1/completions", std::string(300 << 10, ' '), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 413);
  expect_openai_error(nlohmann::json::parse(res->body, nullptr, false), "serve.max_body_kb");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // c's connection closes
  {
    httplib::Client held = s.client();
    held.set_keep_alive(true);
    ASSERT_EQ(held.Get("/v2/health/live")->status, 200);
    const std::string refused = raw_exchange(s.port, "GET /v1/models HTTP/1.1\r\n\r\n");
    EXPECT_NE(refused.find("503 Service Unavailable"), std::string::npos) << refused;
    const nlohmann::json body = body_of(refused);
    ASSERT_TRUE(body["error"].is_object()) << refused;
    EXPECT_EQ(body["error"]["type"], "server_error") << refused;
  }
}

TEST_F(Serve, StopDoesNotWaitForARequestNotSentWhole) {
  auto s = std::make_unique<Running>();  // serve.timeout_s = 30
  const int fd = connect_to(s->port);
  ASSERT_GE(fd, 0);
  const std::string part = "POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{";
  ASSERT_EQ(write(fd, part.data(), part.size()), static_cast<ssize_t>(part.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // read by the server
  const auto t0 = std::chrono::steady_clock::now();
  s.reset();  // stop() and run()'s return
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
  close(fd);
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
  const auto sigterm = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const double stopping =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sigterm).count();
  EXPECT_LT(stopping, 10) << "seconds from SIGTERM to exit";
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
  std::printf("%ld answered before SIGTERM, %ld in all; the server read %ld; exit %.2f s after\n",
              static_cast<long>(before), static_cast<long>(answered.load()),
              static_cast<long>(read), stopping);
  EXPECT_EQ(read, sent) << text;
  EXPECT_EQ(sent, answered.load()) << text;
}

}  // namespace
}  // namespace tessel::infer::testing
