// HttpServer: tessel serve's HTTP/1.1 transport, event-driven on Boost.Beast over Asio. A fixed
// pool of serve.io_threads I/O threads reads requests and writes answers on every connection
// (keep-alive, pipelined requests answered in order); what a request asks is the handler's
// business, which may answer at once or later from any thread (the model's workers), so no
// thread waits on a connection. The transport answers by itself, through the error callback
// (the protocol's error shape, which may depend on the request's path, is the caller's):
//   400 a malformed HTTP request, 408 a request not read whole within timeout_s, 413 a body over
//   max_body_bytes, 431 headers over kMaxHeaderBytes, 503 + Retry-After to a connection beyond
//   max_connections (then closed), 504 a handler that has not answered within timeout_s.
// A streamed answer (HttpStream) has no deadline but each piece's write (timeout_s).
// A connection idle for timeout_s is closed. stop() closes the listening socket and every
// connection that is idle or has not sent a request whole; a request already read is answered
// (its connection then closes); run() returns once no connection is left. Thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessel::infer {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more, e.g. Allow, Retry-After
};

// A response whose body goes out in pieces as they are made (chunked transfer encoding; e.g.
// server-sent events), from any thread. While it streams, the connection watches for its
// client leaving (HttpRequest::watch): then gone() turns true and write() refuses. end() (or
// the last reference dropped) sends the final chunk; the connection then serves its next
// request.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // Queues a piece of the body; false when the client has gone (the piece is dropped).
  virtual bool write(std::string piece) = 0;
  virtual void end() = 0;
  virtual bool gone() const = 0;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // The value of header `name` (any case), or "" when absent.
  std::string header(std::string_view name) const;
  // Answers with `head` (status, content type, headers; its body is ignored) and a body to
  // stream, instead of calling Respond; from any thread. Set by the server for each request.
  std::function<std::shared_ptr<HttpStream>(HttpResponse head)> start_stream;
  // Watches the connection for its client leaving until the answer has gone out whole (for an
  // answer that may wait long: a generation queued or running); from any thread. Returns what
  // says whether the client has gone: it closed or reset the connection, or the answer was
  // given already (504); its answer, plain or streamed, is then dropped and counts as given.
  // Bytes of a pipelined request end the watch (they stay for their parser). Unwatched, a
  // plain answer's connection is not read until the answer is out; a stream's is watched from
  // its head on. Set by the server for each request.
  std::function<std::function<bool()>()> watch;
};

// Answers one request, exactly once, from any thread.
using Respond = std::function<void(HttpResponse)>;
using HttpHandler = std::function<void(HttpRequest, Respond)>;

inline constexpr int64_t kMaxHeaderBytes = 16 << 10;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int io_threads = 1;
  int64_t max_connections = 128;
  int64_t max_body_bytes = 4 << 20;
  double timeout_s = 30;
  // The answer for a failure the transport answers itself: status, the request's path (its query
  // cut; "" when its request line has not come whole) and what went wrong.
  std::function<HttpResponse(int status, const std::string& path, const std::string& message)>
      error;
};

class HttpServer {
 public:
  HttpServer(HttpOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Listens on options.host:port (0: a free port) and returns the port. Throws IoError.
  int bind(int port);
  // Runs the I/O threads (this one among them) until stop() and the last connection's end.
  void run();
  void stop();
  // Requests read whole and answers written so far (equal once run() has returned).
  int64_t accepted() const;
  int64_t answered() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessel::infer
