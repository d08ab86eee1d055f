// Server: tessel serve -- the KServe v2 / Open Inference Protocol (JSON tensors) in front of a
// Batcher whose workers each hold the whole model (a Replica), forward only, on the
// event-driven HttpServer (http.h). The model's name is the config's name (its file's stem).
//   GET  /v2/health/live               200 while the process serves
//   GET  /v2/health/ready              200; 503 while draining
//   GET  /v2                           server metadata
//   GET  /v2/models/{name}             model metadata: inputs and outputs (protocol.h)
//   GET  /v2/models/{name}/ready       200; 503 while draining
//   POST /v2/models/{name}/infer       {"inputs": [{"name", "shape", "datatype", "data"}]}
//   POST /v1/predict                   tessel's own rows ({"inputs": [[...]]} or {"prompts"})
//   GET  /metrics                      Prometheus text (metrics.h)
// and for a gpt model the OpenAI API (src/infer/openai.h), its generations continuously
// batched by a Scheduler on a model of its own over worker 0's parameter memory (no copy),
// streamed as server-sent events on request, cancelled (queued: before any prefill) when their
// client leaves or has had its 504:
//   GET  /v1/models                    the model
//   POST /v1/completions               {"model", "prompt", "max_tokens", "stream", ...}
//   POST /v1/chat/completions          {"model", "messages", "max_tokens", "stream", ...}
// Errors under /v1/ (but /v1/predict) are OpenAI's {"error": {"message", "type", "param",
// "code"}}, the transport's too; every other error is {"error": "message"}: 400 malformed JSON,
// wrong shape or datatype, 404 unknown route or model, 405 wrong method (with Allow), 408/413/431
// (the transport's limits), 503 + Retry-After queue full or shutting down, 504 no answer within
// serve.timeout_s, 500 a failed batch. Routes are a table of handlers that know nothing of the
// transport. stop() stops taking connections; run() returns once every request already read has
// been answered and the batcher has drained. Thread safe.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/config/config.h"
#include "tessel/infer/batcher.h"
#include "tessel/infer/http.h"
#include "tessel/infer/metrics.h"
#include "tessel/infer/replica.h"
#include "tessel/infer/scheduler.h"

namespace tessel::infer {

class Server {
 public:
  // Loads `workers` replicas of the checkpoint's model, each the whole model whatever the
  // config's pp.stages and tp.size (a training layout; the checkpoint is layout-free).
  Server(const train::Config& config, const std::string& checkpoint, int workers);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds serve.host:port (0: a free port) and returns the port. Throws IoError when it cannot.
  int bind(int port);
  // Serves until stop(), then answers what was accepted and returns.
  void run();
  void stop();
  // Requests read and requests answered so far (equal once run() has returned).
  int64_t accepted() const { return http_->accepted(); }
  int64_t answered() const { return http_->answered(); }
  const ServeMetrics& metrics() const { return metrics_; }

 private:
  using Handler = void (Server::*)(const HttpRequest&, Respond);
  struct Route {
    const char* method;
    const char* path;  // "{name}" matches the model's name
    Handler handler;
  };
  static const Route kRoutes[];

  void handle(HttpRequest req, Respond respond);
  void live(const HttpRequest& req, Respond respond);
  void ready(const HttpRequest& req, Respond respond);
  void server_metadata(const HttpRequest& req, Respond respond);
  void model_metadata(const HttpRequest& req, Respond respond);
  void infer(const HttpRequest& req, Respond respond);
  void predict(const HttpRequest& req, Respond respond);
  void metrics_text(const HttpRequest& req, Respond respond);
  void models(const HttpRequest& req, Respond respond);
  void completions(const HttpRequest& req, Respond respond);
  void chat_completions(const HttpRequest& req, Respond respond);
  void generate_text(const HttpRequest& req, Respond respond, bool chat);
  HttpResponse error_for(const std::string& path, int status, const std::string& message) const;
  void submit(Request request, Respond respond,
              std::function<HttpResponse(const BatchRows&)> answer);
  BatchOutput run_batch(int worker, const std::vector<const Request*>& batch);

  const train::Config config_;
  ModelInfo info_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  ServeMetrics metrics_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<Replica> generator_;  // gpt: the scheduler's model
  std::unique_ptr<Scheduler> scheduler_;
  std::atomic<int64_t> completions_{0};  // ids of OpenAI answers
  std::unique_ptr<HttpServer> http_;
  std::atomic<bool> draining_{false};
};

}  // namespace tessel::infer
