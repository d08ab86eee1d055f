#include "tessel/infer/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>

#include "inputs_json.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/core/memory.h"
#include "tessel/infer/output.h"

namespace tessel::infer {
namespace {

const char* const kRoutes[] = {"/v1/predict", "/healthz", "/metrics"};

// An HTTP status for an exception thrown while answering.
struct HttpError : Error {
  HttpError(int status, const std::string& what) : Error(what), status(status) {}
  int status;
};

const char* reason(int status) {
  switch (status) {
    case 400:
      return "bad request";
    case 404:
      return "unknown route";
    case 405:
      return "method not allowed";
    case 413:
      return "request body too large";
    case 500:
      return "internal error";
    case 503:
      return "unavailable";
    case 504:
      return "timeout";
    default:
      return "error";
  }
}

void set_json(httplib::Response& res, int status, const nlohmann::ordered_json& body) {
  res.status = status;
  res.set_content(dump_json(body) + "\n", "application/json");
}

void set_error(httplib::Response& res, int status, const std::string& message) {
  set_json(res, status, {{"error", {{"code", status}, {"message", message}}}});
}

// The rows of a request body: a non-empty array of at most max_batch entries under `key`.
const nlohmann::json& rows_of(const nlohmann::json& body, const char* key, int64_t max_batch) {
  if (!body.is_object() || !body.contains(key) || !body[key].is_array())
    throw HttpError(400,
                    str("serve: the body must be a JSON object with \"", key, "\": [...], got ",
                        body.is_object() ? "no such array" : body.type_name()));
  const nlohmann::json& rows = body[key];
  if (rows.empty() || static_cast<int64_t>(rows.size()) > max_batch)
    throw HttpError(400, str("serve: \"", key, "\" must hold 1 to serve.max_batch = ", max_batch,
                             " rows, got ", rows.size(), "; split a larger request"));
  return rows;
}

}  // namespace

Server::Server(const train::Config& config, const std::string& checkpoint, int workers)
    : config_(config),
      info_(model_info(config, checkpoint)),
      metrics_(config.serve.max_batch, workers),
      http_(std::make_unique<httplib::Server>()) {
  retain_freed_memory();  // every batch allocates its layers' outputs afresh
  if (config.parallel.pp_stages > 1 || config.parallel.tp_size > 1)
    throw InvalidArgument(str("serve: each worker holds the whole model, got pp.stages = ",
                              config.parallel.pp_stages, " and tp.size = ", config.parallel.tp_size,
                              "; set both to 1 (a checkpoint of any layout loads)"));
  for (int w = 0; w < workers; ++w)
    replicas_.push_back(std::make_unique<Replica>(config_, info_, nullptr, nullptr));
  BatchOptions bo{config.serve.max_batch, config.serve.max_wait_ms / 1000.0,
                  config.serve.max_queue};
  batcher_ = std::make_unique<Batcher>(
      bo, workers, [this](int w, const std::vector<const Request*>& b) { return run_batch(w, b); },
      metrics_);
  httplib::Server& h = *http_;
  // One thread per connection (keep-alive connections hold theirs); never close a connection
  // for its request count.
  const size_t threads = static_cast<size_t>(config.serve.connections);
  h.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  h.set_keep_alive_max_count(SIZE_MAX);
  h.set_keep_alive_timeout(2);  // an idle connection delays shutdown by this much at most
  h.set_payload_max_length(static_cast<size_t>(config.serve.max_body_kb) << 10);
  h.set_tcp_nodelay(true);
  h.Post("/v1/predict",
         [this](const auto& req, auto& res) { route("/v1/predict", &Server::predict, res, req); });
  h.Get("/healthz",
        [this](const auto& req, auto& res) { route("/healthz", &Server::healthz, res, req); });
  h.Get("/metrics",
        [this](const auto& req, auto& res) { route("/metrics", &Server::metrics_text, res, req); });
  // Everything else: 405 on a known path, else 404 (also what httplib rejects itself: 400, 413).
  h.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a route's own error, counted there
    bool known = false;
    for (const char* r : kRoutes) known |= req.path == r;
    if (res.status == 404 && known) {
      res.set_header("Allow", req.path == "/v1/predict" ? "POST" : "GET");
      set_error(res, 405,
                str("serve: ", req.method, " ", req.path, " is not allowed; use ",
                    req.path == "/v1/predict" ? "POST" : "GET"));
    } else if (res.status == 404) {
      set_error(res, 404,
                str("serve: no route ", req.method, " ", req.path,
                    "; routes: POST /v1/predict, GET /healthz, GET /metrics"));
    } else if (res.status == 413) {
      set_error(res, 413,
                str("serve: request body over serve.max_body_kb = ", config_.serve.max_body_kb,
                    " KiB; send fewer rows per request"));
    } else {
      set_error(res, res.status, str("serve: ", reason(res.status)));
    }
    accepted_ += 1;
    answered_ += 1;
    metrics_.request("other", res.status, 0);
  });
}

Server::~Server() {
  stop();
  batcher_->close();
}

int Server::bind(int port) {
  const std::string& host = config_.serve.host;
  int fd = -1;
  http_->set_socket_options([&fd](int sock) {
    httplib::default_socket_options(sock);
    fd = sock;
  });
  const int got =
      port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (got < 0)
    throw IoError(str("serve: cannot listen on ", host, ":", port,
                      "; the port is taken or the address is not this machine's (serve.host)"));
  // Debian's build listens with a backlog of 5: a burst of new clients would have their
  // connections dropped and retried a second later. Listening again only raises the backlog.
  ::listen(fd, SOMAXCONN);
  return got;
}

void Server::run() {
  http_->listen_after_bind();  // returns after stop(), once every connection is done
  batcher_->close();
}

void Server::stop() {
  draining_ = true;
  http_->stop();
}

void Server::route(const std::string& path, Handler handler, httplib::Response& res,
                   const httplib::Request& req) {
  ++accepted_;
  const double t0 = now_seconds();
  try {
    (this->*handler)(req, res);
  } catch (const HttpError& e) {
    set_error(res, e.status, e.what());
  } catch (const InvalidArgument& e) {
    set_error(res, 400, e.what());
  } catch (const std::exception& e) {
    set_error(res, 500, str("serve: ", e.what()));
  }
  metrics_.request(path, res.status, now_seconds() - t0);
  ++answered_;
}

void Server::predict(const httplib::Request& req, httplib::Response& res) {
  if (draining_) throw HttpError(503, "serve: shutting down; send the request elsewhere");
  // The common body read straight into a tensor; any other through a JSON document, whose
  // checks say what is wrong.
  Request request;
  if (!info_.generates())
    request.x = read_inputs(req.body, info_.spec.input_shape, config_.serve.max_batch);
  if (!request.x.defined()) {
    nlohmann::json body;
    try {
      body = nlohmann::json::parse(req.body);
    } catch (const nlohmann::json::parse_error& e) {
      throw HttpError(400, str("serve: malformed JSON body: ", e.what()));
    }
    request = parse(body);
  }
  auto reply = batcher_->submit(std::move(request));
  if (!reply.valid())
    throw HttpError(503, str("serve: queue full (serve.max_queue = ", config_.serve.max_queue,
                             " rows waiting) or shutting down; retry later"));
  if (reply.wait_for(std::chrono::duration<double>(config_.serve.timeout_s)) !=
      std::future_status::ready)
    throw HttpError(504, str("serve: no answer within serve.timeout_s = ", config_.serve.timeout_s,
                             " s; the workers are overloaded"));
  nlohmann::ordered_json out = {{"outputs", reply.get()}};
  set_json(res, 200, out);
}

Request Server::parse(const nlohmann::json& body) const {
  Request r;
  const int64_t max_batch = config_.serve.max_batch;
  if (!info_.generates()) {
    const nlohmann::json& rows = rows_of(body, "inputs", max_batch);
    const int64_t n = static_cast<int64_t>(rows.size()),
                  numel = shape_numel(info_.spec.input_shape);
    Shape shape = info_.spec.input_shape;
    shape.insert(shape.begin(), n);
    r.x = Tensor::empty(shape);
    float* dst = r.x.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const nlohmann::json& row = rows[i];
      if (!row.is_array() || static_cast<int64_t>(row.size()) != numel)
        throw HttpError(
            400, str("serve: inputs[", i, "] must be a flat array of ", numel,
                     " numbers (the model's input ", shape_str(info_.spec.input_shape), "), got ",
                     row.is_array() ? str(row.size(), " entries") : row.type_name()));
      for (int64_t j = 0; j < numel; ++j) {
        if (!row[j].is_number())
          throw HttpError(
              400, str("serve: inputs[", i, "][", j, "] must be a number, got ", row[j].dump()));
        *dst++ = row[j].get<float>();
      }
    }
    return r;
  }
  const nlohmann::json& prompts = rows_of(body, "prompts", max_batch);
  for (const char* key : {"max_new_tokens", "seed"})
    if (body.contains(key) && !body[key].is_number_unsigned())
      throw HttpError(
          400, str("serve: \"", key, "\" must be a non-negative integer, got ", body[key].dump()));
  const int64_t max_new = body.value("max_new_tokens", config_.infer.max_new_tokens);
  const uint64_t seed = body.value("seed", uint64_t{0});
  const int64_t context = info_.spec.input_shape[0];
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (!prompts[i].is_string())
      throw HttpError(
          400, str("serve: prompts[", i, "] must be a string, got ", prompts[i].type_name()));
    Prompt p{{}, max_new, seed + i};
    try {
      p.tokens = encode(prompts[i].get<std::string>(), info_.vocab);
    } catch (const InvalidArgument& e) {
      throw HttpError(400, str("serve: prompts[", i, "]: ", e.what()));
    }
    const int64_t len = static_cast<int64_t>(p.tokens.size());
    if (len == 0 || max_new < 1 || len + max_new > context)
      throw HttpError(
          400, str("serve: prompts[", i, "] has ", len, " tokens and max_new_tokens is ", max_new,
                   "; the prompt must be non-empty and prompt + max_new_tokens "
                   "at most the model's context of ",
                   context));
    r.prompts.push_back(std::move(p));
  }
  return r;
}

std::vector<nlohmann::ordered_json> Server::run_batch(int worker,
                                                      const std::vector<const Request*>& batch) {
  Replica& replica = *replicas_[static_cast<size_t>(worker)];
  std::vector<nlohmann::ordered_json> out;
  if (!info_.generates()) {
    int64_t rows = 0;
    for (const Request* r : batch) rows += r->rows();
    Shape shape = info_.spec.input_shape;
    shape.insert(shape.begin(), rows);
    Tensor x = Tensor::empty(shape);
    int64_t at = 0;
    for (const Request* r : batch) {
      std::memcpy(static_cast<char*>(x.raw()) + at, r->x.raw(), r->x.nbytes());
      at += static_cast<int64_t>(r->x.nbytes());
    }
    const Tensor logits = replica.forward(x, rows, 0);
    const int64_t C = logits.dim(1);
    for (int64_t i = 0; i < rows; ++i)
      out.push_back(class_record(logits.data<float>() + i * C, C, config_.infer.top_k));
    return out;
  }
  std::vector<Prompt> prompts;
  for (const Request* r : batch)
    prompts.insert(prompts.end(), r->prompts.begin(), r->prompts.end());
  const SampleOptions opts{config_.infer.temperature, config_.infer.sample_top_k, config_.seed,
                           config_.infer.kv_cache};
  for (const auto& tokens : generate(replica.model(), prompts, opts))
    out.push_back({{"text", decode(tokens, info_.vocab)}});
  return out;
}

void Server::healthz(const httplib::Request&, httplib::Response& res) {
  if (draining_) {
    set_json(res, 503, {{"status", "draining"}});
    return;
  }
  set_json(res, 200,
           {{"status", "ok"},
            {"model", config_.model.kind},
            {"workers", static_cast<int64_t>(replicas_.size())},
            {"max_batch", config_.serve.max_batch}});
}

void Server::metrics_text(const httplib::Request&, httplib::Response& res) {
  res.set_content(metrics_.prometheus(), "text/plain; version=0.0.4");
}

}  // namespace tessel::infer
