#include "tessel/infer/server.h"

#include <charconv>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>

#include "inputs_json.h"
#include "openai.h"
#include "protocol.h"
#include "tessel/core/clock.h"
#include "tessel/core/log.h"
#include "tessel/core/memory.h"
#include "tessel/infer/output.h"

namespace tessel::infer {
namespace {

using ojson = nlohmann::ordered_json;

// An HTTP status for an exception thrown while answering.
struct HttpError : Error {
  HttpError(int status, const std::string& what) : Error(what), status(status) {}
  int status;
};

HttpResponse json_response(int status, const ojson& body) {
  return {status, "application/json", dump_json(body) + "\n", {}};
}

// The seconds serve worker `worker` sleeps before each batch or generation step: debug.delay_ms
// when it is debug.slow_rank (the generation scheduler counts as worker 0), to study timeouts.
double debug_delay_s(const train::Config& config, int worker) {
  return config.parallel.slow_rank == worker ? config.parallel.delay_ms / 1000.0 : 0.0;
}

HttpResponse error_response(int status, const std::string& message) {
  return json_response(status, {{"error", message}});
}

ModelLimits limits_of(const train::Config& c) {
  return {c.serve.max_batch, c.infer.max_new_tokens, c.infer.top_k};
}

nlohmann::json parse_json(std::string_view body) {
  try {
    return nlohmann::json::parse(body.begin(), body.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw HttpError(400, str("serve: malformed JSON body: ", e.what()));
  }
}

// Whether `path` has the route's shape; *model_ok: whether its {name} is `model`. Segment by
// segment over views of both (no copies: it runs for every route on every request).
bool matches(std::string_view route, std::string_view path, const std::string& model,
             bool* model_ok) {
  *model_ok = true;
  while (!route.empty() && !path.empty()) {
    const size_t r = std::min(route.find('/', 1), route.size());
    const size_t p = std::min(path.find('/', 1), path.size());
    const std::string_view rs = route.substr(0, r), ps = path.substr(0, p);
    if (rs == "/{name}")
      *model_ok = ps.size() == model.size() + 1 && ps[0] == '/' && ps.substr(1) == model;
    else if (rs != ps)
      return false;
    route.remove_prefix(r);
    path.remove_prefix(p);
  }
  return route.empty() && path.empty();
}

// An OpenAI answer in the making: the request, the text so far, and its stream once started.
struct OpenAiAnswer {
  OpenAiCall call;
  CompletionMeta meta;
  CompletionText text;
  std::function<std::shared_ptr<HttpStream>(HttpResponse)> start_stream;
  std::shared_ptr<HttpStream> stream;  // from the first token on
};

// Sets g's callbacks to answer through `st`: streamed, a chunk per piece of text from the first
// token on, the last with the finish reason (then usage, [DONE]); otherwise one body at the end.
// `gone`: whether the client has left (or had its 504): the generation is then cancelled, queued
// or running, and its answer (none goes out) counted as 499, nginx's "client closed request".
void answer_with(Generation& g, std::shared_ptr<OpenAiAnswer> st, Respond respond,
                 std::function<bool()> gone) {
  g.on_token = [st](int32_t token) {
    const bool more = st->text.add(token);
    if (!st->call.stream) return more;
    if (!st->stream)
      st->stream =
          st->start_stream({200, "text/event-stream", "", {{"Cache-Control", "no-cache"}}});
    // A client that has gone is cancelled (alive) before the next step.
    if (const std::string piece = st->text.take(false); !piece.empty())
      st->stream->write(completion_chunk(st->meta, piece, ""));
    return more;
  };
  g.on_done = [st, respond](const std::string& reason, std::exception_ptr error) {
    if (!st->stream) {  // not streamed, or it ended before a token
      if (reason == "cancelled")
        return respond(json_response(499, openai_error("serve: the client has gone", 499)));
      if (!error) return respond(json_response(200, completion_body(st->meta, st->text, reason)));
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        return respond(json_response(500, openai_error(str("serve: ", e.what()), 500)));
      }
    }
    HttpStream& out = *st->stream;
    if (const std::string rest = st->text.take(true); !rest.empty())
      out.write(completion_chunk(st->meta, rest, ""));
    out.write(completion_chunk(st->meta, "", error ? "error" : reason));
    if (st->call.include_usage) out.write(usage_chunk(st->meta, st->text.tokens()));
    out.write(kDoneEvent);
    out.end();
  };
  g.alive = [gone = std::move(gone)] { return !gone(); };
}

}  // namespace

const Server::Route Server::kRoutes[] = {
    {"GET", "/v2/health/live", &Server::live},
    {"GET", "/v2/health/ready", &Server::ready},
    {"GET", "/v2", &Server::server_metadata},
    {"GET", "/v2/models/{name}", &Server::model_metadata},
    {"GET", "/v2/models/{name}/ready", &Server::ready},
    {"POST", "/v2/models/{name}/infer", &Server::infer},
    {"POST", "/v1/predict", &Server::predict},
    {"GET", "/metrics", &Server::metrics_text},
    {"GET", "/v1/models", &Server::models},
    {"POST", "/v1/completions", &Server::completions},
    {"POST", "/v1/chat/completions", &Server::chat_completions},
};

Server::Server(const train::Config& config, const std::string& checkpoint, int workers)
    : config_(config),
      info_(model_info(config, checkpoint)),
      metrics_(config.serve.max_batch, workers) {
  retain_freed_memory();  // every batch allocates its layers' outputs afresh
  if (config.parallel.pp_stages > 1 || config.parallel.tp_size > 1)  // the training layout's
    log_info("serve: each worker holds the whole model (a checkpoint of any layout loads); ",
             "pp.stages = ", config.parallel.pp_stages, " and tp.size = ", config.parallel.tp_size,
             " apply to training only");
  for (int w = 0; w < workers; ++w)
    replicas_.push_back(std::make_unique<Replica>(config_, info_, nullptr, nullptr));
  BatchOptions bo{config.serve.max_batch, config.serve.max_wait_ms / 1000.0,
                  config.serve.max_queue};
  batcher_ = std::make_unique<Batcher>(
      bo, workers, [this](int w, const std::vector<const Request*>& b) { return run_batch(w, b); },
      metrics_);
  if (info_.generates()) {
    generator_ = std::make_unique<Replica>(config_, info_, *replicas_.front());  // no copy
    scheduler_ = std::make_unique<Scheduler>(
        generator_->model(),
        SchedulerOptions{config.serve.max_sequences, config.serve.max_step_tokens,
                         config.serve.max_queue, debug_delay_s(config, 0)});
  }
  HttpOptions ho;
  ho.host = config.serve.host;
  ho.io_threads = static_cast<int>(config.serve.io_threads);
  ho.max_connections = config.serve.connections;
  ho.max_body_bytes = config.serve.max_body_kb << 10;
  ho.timeout_s = config.serve.timeout_s;
  ho.error = [this](int status, const std::string& path, const std::string& message) {
    metrics_.request("other", status, 0);
    return error_for(path, status, "serve: " + message);
  };
  http_ = std::make_unique<HttpServer>(
      ho, [this](HttpRequest req, Respond respond) { handle(std::move(req), std::move(respond)); });
}

Server::~Server() {
  stop();
  batcher_->close();
  if (scheduler_) scheduler_->close();
}

int Server::bind(int port) { return http_->bind(port); }

void Server::run() {
  http_->run();  // returns after stop(), once every connection is done
  batcher_->close();
  if (scheduler_) scheduler_->close();
}

void Server::stop() {
  draining_ = true;
  http_->stop();
}

void Server::handle(HttpRequest req, Respond respond) {
  const Route* route = nullptr;
  bool model_ok = false, any = false;
  std::string allow;
  for (const Route& r : kRoutes) {
    bool ok = false;
    if (!matches(r.path, req.path, config_.name, &ok)) continue;
    any = true;
    model_ok = ok;
    allow = r.method;
    if (req.method == r.method) route = &r;
  }
  const double t0 = now_seconds();
  const char* label = route ? route->path : "other";  // a static string: no copy to carry
  Respond counted = [this, label, t0, respond = std::move(respond)](HttpResponse res) {
    metrics_.request(label, res.status, now_seconds() - t0);
    respond(std::move(res));
  };
  try {
    if (!any)
      throw HttpError(404, str("serve: no route ", req.method, " ", req.path,
                               "; routes: GET /v2/health/live, GET /v2/health/ready, GET "
                               "/v2/models/",
                               config_.name, "[/ready], POST /v2/models/", config_.name,
                               "/infer, POST /v1/predict, GET /metrics",
                               info_.generates() ? ", GET /v1/models, POST /v1/completions, "
                                                   "POST /v1/chat/completions"
                                                 : ""));
    if (!model_ok)
      throw HttpError(404, str("serve: unknown model in ", req.path, "; this server serves \"",
                               config_.name, "\""));
    if (!route) {
      HttpResponse res = error_for(
          req.path, 405, str("serve: ", req.method, " ", req.path, " is not allowed; use ", allow));
      res.headers.emplace_back("Allow", allow);
      return counted(std::move(res));
    }
    (this->*route->handler)(req, counted);
  } catch (const OpenAiError& e) {
    counted(json_response(e.status, openai_error(e.what(), e.status, e.param, e.code)));
  } catch (const HttpError& e) {
    counted(error_for(req.path, e.status, e.what()));
  } catch (const InvalidArgument& e) {
    counted(error_for(req.path, 400, e.what()));
  } catch (const std::exception& e) {
    counted(error_for(req.path, 500, str("serve: ", e.what())));
  }
}

// OpenAI's error shape under /v1/ (but /v1/predict), the server's own elsewhere.
HttpResponse Server::error_for(const std::string& path, int status,
                               const std::string& message) const {
  if (path.rfind("/v1/", 0) == 0 && path != "/v1/predict")
    return json_response(status, openai_error(message, status));
  return error_response(status, message);
}

void Server::live(const HttpRequest&, Respond respond) { respond(json_response(200, {})); }

void Server::ready(const HttpRequest&, Respond respond) {
  if (draining_) return respond(error_response(503, "serve: shutting down"));
  respond(json_response(200, {}));
}

void Server::server_metadata(const HttpRequest&, Respond respond) {
  respond(json_response(
      200, {{"name", "tessel"}, {"version", "1"}, {"extensions", {"binary_tensor_data"}}}));
}

void Server::model_metadata(const HttpRequest&, Respond respond) {
  respond(json_response(200, infer::model_metadata(config_.name, info_, limits_of(config_))));
}

void Server::infer(const HttpRequest& req, Respond respond) {
  // With binary tensors (the binary-tensor extension), the JSON is the body's first
  // Inference-Header-Content-Length bytes and the tensors' bytes follow.
  std::string_view json = req.body, binary;
  if (const std::string length = req.header("Inference-Header-Content-Length"); !length.empty()) {
    size_t n = 0;
    const auto got = std::from_chars(length.data(), length.data() + length.size(), n);
    if (got.ec != std::errc() || got.ptr != length.data() + length.size() || n > json.size())
      throw HttpError(400, str("serve: Inference-Header-Content-Length is \"", length,
                               "\"; it must be the byte length of the JSON that starts the "
                               "body, at most the body's ",
                               json.size(), " bytes"));
    binary = json.substr(n);
    json = json.substr(0, n);
  }
  // The common body read straight into a tensor (as /v1/predict's), any other in full.
  auto call = std::make_shared<InferCall>();
  if (!info_.generates() && binary.empty())
    call->request.x = read_v2_inputs(json, info_.spec.input_shape, config_.serve.max_batch);
  if (call->request.x.defined())
    call->outputs = output_names(info_);
  else
    *call = read_infer(parse_json(json), binary, info_, limits_of(config_));
  Request request = std::move(call->request);
  submit(std::move(request), std::move(respond), [this, call](const BatchRows& rows) {
    return infer_answer(config_.name, *call, rows, config_.infer.top_k, info_.spec.task);
  });
}

void Server::predict(const HttpRequest& req, Respond respond) {
  // The common body read straight into a tensor; any other through a JSON document, whose
  // checks say what is wrong.
  Request request;
  if (!info_.generates())
    request.x = read_inputs(req.body, info_.spec.input_shape, config_.serve.max_batch);
  if (!request.x.defined()) request = read_predict(parse_json(req.body), info_, limits_of(config_));
  submit(std::move(request), std::move(respond), [this](const BatchRows& rows) {
    ojson records = ojson::array();
    for (int64_t i = 0; i < rows.count; ++i)
      records.push_back(
          rows.batch->values.defined()
              ? output_record(rows.values(i), rows.width(), config_.infer.top_k, info_.spec.task)
              : ojson{{"text", rows.text(i)}});
    return json_response(200, ojson{{"outputs", std::move(records)}});
  });
}

// Queues a request for the workers; `answer` makes its 200 from its rows.
void Server::submit(Request request, Respond respond,
                    std::function<HttpResponse(const BatchRows&)> answer) {
  if (draining_) throw HttpError(503, "serve: shutting down; send the request elsewhere");
  auto done = [respond = std::move(respond), answer = std::move(answer)](const BatchRows& rows,
                                                                         std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
      respond(answer(rows));
    } catch (const std::exception& e) {
      respond(error_response(500, str("serve: ", e.what())));
    }
  };
  if (!batcher_->submit(std::move(request), std::move(done)))
    throw HttpError(503, str("serve: queue full (serve.max_queue = ", config_.serve.max_queue,
                             " rows waiting) or shutting down; retry later"));
}

BatchOutput Server::run_batch(int worker, const std::vector<const Request*>& batch) {
  if (const double delay = debug_delay_s(config_, worker); delay > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  Replica& replica = *replicas_[static_cast<size_t>(worker)];
  BatchOutput out;
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
    out.values = replica.forward(x, rows, 0);
    return out;
  }
  std::vector<Prompt> prompts;
  for (const Request* r : batch)
    prompts.insert(prompts.end(), r->prompts.begin(), r->prompts.end());
  const SampleOptions opts{config_.infer.temperature, config_.infer.sample_top_k, config_.seed,
                           config_.infer.kv_cache};
  for (const auto& tokens : generate(replica.model(), prompts, opts))
    out.texts.push_back(decode(tokens, info_.tokenizer.get()));
  return out;
}

void Server::metrics_text(const HttpRequest&, Respond respond) {
  std::string text = metrics_.prometheus();
  if (scheduler_) {
    const SchedulerStats st = scheduler_->stats();
    const std::pair<const char*, int64_t> gauges[] = {
        {"tessel_generate_sequences", st.sequences},
        {"tessel_generate_waiting", st.waiting},
        {"tessel_generate_positions", st.positions},
        {"tessel_kv_cache_bytes", st.kv_bytes},
        {"tessel_kv_cache_held_bytes", st.kv_held},
        {"tessel_generate_steps", st.steps},
        {"tessel_generate_tokens", st.tokens},
        {"tessel_generate_prompt_tokens", st.prompt_tokens},
        {"tessel_generate_cancelled", st.cancelled},
        {"tessel_generate_cancelled_queued", st.cancelled_queued}};
    for (const auto& [name, value] : gauges) text += str(name, " ", value, "\n");
  }
  respond({200, "text/plain; version=0.0.4", text, {}});
}

void Server::models(const HttpRequest&, Respond respond) {
  if (!scheduler_)
    throw OpenAiError(404, str("serve: the OpenAI API serves gpt models; \"", config_.name,
                               "\" is a classifier (use /v2/models/", config_.name, "/infer)"));
  respond(json_response(200, models_list(config_.name)));
}

void Server::completions(const HttpRequest& req, Respond respond) {
  generate_text(req, std::move(respond), false);
}

void Server::chat_completions(const HttpRequest& req, Respond respond) {
  generate_text(req, std::move(respond), true);
}

// An OpenAI generation on the scheduler. Streamed, the answer's head goes out with the first
// token. The connection is watched from here on: its client leaving cancels the generation,
// still queued (no prefill) or at its next step.
void Server::generate_text(const HttpRequest& req, Respond respond, bool chat) {
  if (!scheduler_) return models(req, std::move(respond));  // the classifier's 404
  const SampleOptions defaults{config_.infer.temperature, config_.infer.sample_top_k, config_.seed,
                               true};
  const OpenAiCall call =
      read_openai(req.body, chat, config_.name, config_.infer.max_new_tokens, defaults);
  if (draining_) throw OpenAiError(503, "serve: shutting down; send the request elsewhere");
  Generation g;
  g.prompt = {encode(call.prompt, info_.tokenizer.get()), call.max_tokens, 0};
  if (g.prompt.tokens.size() + static_cast<size_t>(call.max_tokens) >
      static_cast<size_t>(scheduler_->context()))
    throw OpenAiError(400,
                      str("this model's context is ", scheduler_->context(), " tokens; the ",
                          g.prompt.tokens.size(), "-token prompt and max_tokens ", call.max_tokens,
                          " pass it: shorten the prompt or lower max_tokens"),
                      "max_tokens", "context_length_exceeded");
  g.sample = call.sample;
  const CompletionMeta meta{str(chat ? "chatcmpl-" : "cmpl-", ++completions_), config_.name,
                            static_cast<int64_t>(std::time(nullptr)),
                            static_cast<int64_t>(g.prompt.tokens.size()), chat};
  answer_with(
      g,
      std::make_shared<OpenAiAnswer>(OpenAiAnswer{
          call, meta, CompletionText(info_.tokenizer, call.stop), req.start_stream, nullptr}),
      std::move(respond), req.watch());
  if (!scheduler_->submit(std::move(g)))
    throw OpenAiError(503, str("serve: serve.max_queue = ", config_.serve.max_queue,
                               " generations wait already, or shutting down; retry later"));
}

}  // namespace tessel::infer
