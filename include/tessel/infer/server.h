// Server: tessel serve's HTTP/JSON endpoint (Debian's cpp-httplib) in front of a Batcher whose
// workers each hold the whole model (a Replica), forward only.
//   POST /v1/predict  classifier: {"inputs": [[x, ...], ...]}, each row a flat array of the
//                     model's input size -> {"outputs": [{"class": 3, "top_k": [...]}, ...]}
//                     gpt: {"prompts": ["...", ...], "max_new_tokens": 16, "seed": 0}
//                     -> {"outputs": [{"text": "..."}, ...]}
//   GET  /healthz     {"status": "ok", ...}; 503 {"status": "draining"} while shutting down
//   GET  /metrics     Prometheus text (metrics.h)
// Every error is JSON {"error": {"code": C, "message": "..."}}: 400 malformed JSON or wrong
// shapes, 404 unknown route, 405 wrong method, 413 body over serve.max_body_kb, 503 queue full
// or shutting down, 504 no answer within serve.timeout_s, 500 a failed batch.
// stop() closes the listening socket; run() then returns once every request already read has
// been answered (connections finish their request in progress and close) and the batcher has
// drained. Listens on serve.host (loopback by default). Thread safe.
#pragma once

#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/infer/batcher.h"
#include "tessel/infer/metrics.h"
#include "tessel/infer/replica.h"
#include "tessel/train/config.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tessel::infer {

class Server {
 public:
  // Loads `workers` replicas of the checkpoint's model (pp.stages must be 1).
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
  int64_t accepted() const { return accepted_; }
  int64_t answered() const { return answered_; }
  const ServeMetrics& metrics() const { return metrics_; }

 private:
  using Handler = void (Server::*)(const httplib::Request&, httplib::Response&);
  void route(const std::string& path, Handler handler, httplib::Response& res,
             const httplib::Request& req);
  void predict(const httplib::Request& req, httplib::Response& res);
  void healthz(const httplib::Request& req, httplib::Response& res);
  void metrics_text(const httplib::Request& req, httplib::Response& res);
  Request parse(const nlohmann::json& body) const;
  std::vector<nlohmann::ordered_json> run_batch(int worker,
                                                const std::vector<const Request*>& batch);

  const train::Config config_;
  ModelInfo info_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  ServeMetrics metrics_;
  std::unique_ptr<Batcher> batcher_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> accepted_{0}, answered_{0};
};

}  // namespace tessel::infer
