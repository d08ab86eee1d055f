#include "tessel/infer/http.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "tessel/core/error.h"

namespace tessel::infer {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Duration = std::chrono::steady_clock::duration;
// A connection's executor, named rather than type-erased (net::any_io_executor, what
// beast::tcp_stream and net::steady_timer hold): the erased one allocated a copy of itself on
// the heap for every asynchronous step, a third of a served request's mallocs.
using Strand = net::strand<net::io_context::executor_type>;
using Socket = tcp::socket::rebind_executor<Strand>::other;
using Stream = beast::basic_stream<tcp, Strand>;
using Timer = net::basic_waitable_timer<std::chrono::steady_clock,
                                        net::wait_traits<std::chrono::steady_clock>, Strand>;

class Session;
// One request's "its answer has no taker": set when its client leaves while the answer is awaited
// (watched) or streamed, or when the transport answered it (504). Its own, not the connection's:
// the connection's next request has another.
using GoneFlag = std::shared_ptr<std::atomic<bool>>;
std::shared_ptr<HttpStream> make_stream(std::shared_ptr<Session> session, GoneFlag gone);

// What the sessions share: options, handler, counters and the registry stop() drains.
struct Shared {
  HttpOptions options;
  HttpHandler handler;
  Duration timeout;
  std::atomic<int64_t> accepted{0}, answered{0}, open{0};
  std::atomic<bool> draining{false};
  std::mutex mu;
  std::set<Session*> sessions;
};

// One connection: reads a request, hands it to the handler, writes its answer, and again while
// the client keeps the connection alive. Every step runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Socket socket, Shared& shared, bool refuse)
      : stream_(std::move(socket)),
        timer_(stream_.get_executor()),
        shared_(shared),
        refuse_(refuse) {
    // Beast reads into the buffer's free capacity (at least 512 bytes): without room, a request
    // of a few KiB took 14 recvmsg calls.
    buffer_.reserve(64 << 10);
    std::lock_guard lock(shared_.mu);
    shared_.sessions.insert(this);
  }
  ~Session() {
    std::lock_guard lock(shared_.mu);
    shared_.sessions.erase(this);
    --shared_.open;
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_header(); });
  }
  // Closes the connection if it waits for a request or has not sent one whole (not accepted);
  // one being answered closes after.
  void drain() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->reading_) self->close();
    });
  }

 private:
  void read_header() {
    if (shared_.draining) return close();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(kMaxHeaderBytes));
    parser_->body_limit(static_cast<uint64_t>(shared_.options.max_body_bytes));
    reading_ = true;
    timed_out_ = false;
    // Not the stream's own expiry, which closes the socket: a request cut short gets its 408.
    stream_.expires_never();
    timer_.expires_after(shared_.timeout);
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;  // re-armed or cancelled
      self->timed_out_ = true;
      beast::error_code ignored;
      self->stream_.socket().cancel(ignored);
    });
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Whether close() has run. A read can complete (a request read whole) just before drain()
  // closes the socket and its handler run after drain's (queued behind it on the strand): that
  // request is dropped, as one drain() found unread, since its answer could be counted but never
  // sent (the cause of a SIGTERM test's 3068 answers sent to 3067 received).
  bool closed() const { return !stream_.socket().is_open(); }

  void on_header(beast::error_code ec) {
    if (closed()) return;
    if (ec) return on_read_error(ec);
    const auto& req = parser_->get();
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      continue_ = http::response<http::empty_body>(http::status::continue_, req.version());
      http::async_write(stream_, continue_,
                        [self = shared_from_this()](beast::error_code e, size_t) {
                          if (e) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (self->closed()) return;
                       if (ec) return self->on_read_error(ec);
                       self->on_request();
                     });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::body_limit)
      return fail(
          413, str("request body over serve.max_body_kb = ", shared_.options.max_body_bytes >> 10,
                   " KiB; send fewer rows per request"));
    if (ec == http::error::header_limit)
      return fail(431, str("request headers over ", kMaxHeaderBytes >> 10, " KiB"));
    // The client left or idled out, or drain() closed the connection: no request to answer.
    if (!parser_->got_some() || ec == http::error::end_of_stream ||
        ec == http::error::partial_message)
      return close();
    if (timed_out_)
      return fail(
          408,
          str("request not read whole within serve.timeout_s = ", shared_.options.timeout_s, " s"));
    if (ec.category() == beast::error_code(http::error::bad_target).category())
      return fail(400, str("malformed HTTP request: ", ec.message()));
    close();  // a socket error
  }

  // Answers a request the transport refuses, then closes the connection.
  void fail(int status, const std::string& message) {
    reading_ = false;
    ++shared_.accepted;
    keep_alive_ = false;
    write(shared_.options.error(status, request_path(), message));
  }

  // The path of the request being read, its query cut: from its request line once parsed (the
  // parser parses it before the fields), else from the bytes of it in the buffer (a request
  // line cut short); "" when not even the target has come.
  std::string request_path() const {
    const auto parsed = parser_->get().target();
    std::string_view target(parsed.data(), parsed.size());
    if (target.empty()) {
      std::string_view line(static_cast<const char*>(buffer_.data().data()), buffer_.size());
      line = line.substr(0, line.find("\r\n"));
      const size_t a = line.find(' '), b = line.find(' ', a + 1);
      if (a != std::string_view::npos && b != std::string_view::npos)
        target = line.substr(a + 1, b - a - 1);
    }
    return std::string(target.substr(0, target.find('?')));
  }

  void on_request() {
    reading_ = false;  // read whole: it gets an answer
    ++shared_.accepted;
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive() && !refuse_;
    if (refuse_)
      return write(
          shared_.options.error(503, request_path(),
                                str("serve.connections = ", shared_.options.max_connections,
                                    " connections are open; retry later")));
    const uint64_t seq = ++seq_;
    gone_ = std::make_shared<std::atomic<bool>>(false);
    watched_ = false;
    timer_.expires_after(shared_.timeout);
    timer_.async_wait(
        [self = shared_from_this(), seq, path = request_path()](beast::error_code ec) {
          if (ec || seq != self->seq_ || self->answered_) return;
          *self->gone_ = true;  // the handler's answer, when it comes, is dropped
          self->write(self->shared_.options.error(
              504, path,
              str("no answer within serve.timeout_s = ", self->shared_.options.timeout_s,
                  " s; the workers are overloaded")));
        });
    HttpRequest r{std::string(req.method_string()),
                  std::string(req.target()),
                  std::move(req.body()),
                  {},
                  {},
                  {}};
    for (const auto& f : req) r.headers.emplace_back(f.name_string(), f.value());
    // A stream or watch asked after the answer (504, or the client gone): its flag says gone.
    r.start_stream = [self = shared_from_this(), seq, gone = gone_](HttpResponse head) {
      net::post(self->stream_.get_executor(), [self, seq, head = std::move(head)]() mutable {
        if (seq == self->seq_ && !self->answered_) self->begin_stream(std::move(head));
      });
      return make_stream(self, gone);
    };
    r.watch = [self = shared_from_this(), seq, gone = gone_] {
      net::post(self->stream_.get_executor(), [self, seq] {
        if (seq == self->seq_ && !self->answered_) self->watch();
      });
      return std::function<bool()>([gone] { return gone->load(); });
    };
    if (const size_t q = r.path.find('?'); q != std::string::npos) r.path.resize(q);
    answered_ = false;
    shared_.handler(std::move(r), [self = shared_from_this(), seq](HttpResponse res) {
      net::post(self->stream_.get_executor(), [self, seq, res = std::move(res)]() mutable {
        if (seq == self->seq_ && !self->answered_) self->write(std::move(res));
      });
    });
  }

  void write(HttpResponse res) {
    answered_ = true;
    timer_.cancel();
    res_ = http::response<http::string_body>(static_cast<http::status>(res.status), 11);
    if (res.status == 503) res_.set(http::field::retry_after, "1");  // full or draining
    res_.set(http::field::content_type, res.content_type);
    for (auto& [k, v] : res.headers) res_.set(k, v);
    res_.body() = std::move(res.body);
    res_.keep_alive(keep_alive_ && !shared_.draining);
    res_.prepare_payload();
    stream_.expires_after(shared_.timeout);
    http::async_write(stream_, res_, [self = shared_from_this()](beast::error_code ec, size_t) {
      ++self->shared_.answered;
      if (ec || !self->res_.keep_alive()) return self->close();
      self->next_request();
    });
  }

  // The answer has gone out whole: the next request is read, once the watching read has ended.
  void next_request() {
    if (!watching_) return read_header();
    resume_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);  // the watching read ends, then read_header()
  }

  // Reads while the answer is awaited or streamed (once per request), so that a client that
  // closes or resets its connection is seen at once: lose(). Bytes that come instead (a
  // pipelined request's first) end the watch and stay in the buffer for their parser.
  void watch() {
    if (watched_) return;
    watched_ = watching_ = true;
    stream_.socket().async_read_some(buffer_.prepare(4096),
                                     [self = shared_from_this()](beast::error_code ec, size_t n) {
                                       self->watching_ = false;
                                       self->buffer_.commit(n);
                                       if (self->closed()) return;
                                       if (self->resume_) {  // cancelled by next_request()
                                         self->resume_ = false;
                                         return self->read_header();
                                       }
                                       if (ec && ec != net::error::operation_aborted) self->lose();
                                     });
  }

  // ---- A streamed answer: the head, then pieces as chunks one write at a time, then the last
  // chunk. A read waits meanwhile (watch) so that a client that leaves is seen at once.
 public:
  // Pieces and the end of stream `gone` (its flag names it): dropped unless it is the one
  // being written.
  void post_piece(const GoneFlag& gone, std::string piece) {
    net::post(stream_.get_executor(),
              [self = shared_from_this(), gone, p = std::move(piece)]() mutable {
                if (!self->streaming_ || gone != self->gone_) return;
                self->pieces_.push_back(std::move(p));
                self->flush();
              });
  }
  void post_end(const GoneFlag& gone) {
    net::post(stream_.get_executor(), [self = shared_from_this(), gone] {
      if (!self->streaming_ || gone != self->gone_) return;
      self->stream_ended_ = true;
      self->flush();
    });
  }

 private:
  void begin_stream(HttpResponse head) {
    answered_ = true;
    timer_.cancel();
    streaming_ = true;
    stream_ended_ = false;
    stream_head_.emplace(static_cast<http::status>(head.status), 11);
    stream_head_->set(http::field::content_type, head.content_type);
    for (auto& [k, v] : head.headers) stream_head_->set(k, v);
    stream_head_->chunked(true);
    stream_head_->keep_alive(keep_alive_ && !shared_.draining);
    serializer_.emplace(*stream_head_);
    writing_ = true;
    stream_.expires_after(shared_.timeout);
    http::async_write_header(stream_, *serializer_,
                             [self = shared_from_this()](beast::error_code ec, size_t) {
                               self->writing_ = false;
                               if (ec) return self->lose();
                               self->flush();
                             });
    watch();
  }

  void flush() {
    if (writing_ || !streaming_) return;
    if (pieces_.empty() && !stream_ended_) return;
    // Pieces that queued while the last write ran go out as one chunk (one system call).
    while (pieces_.size() > 1) {
      pieces_[pieces_.size() - 2] += pieces_.back();
      pieces_.pop_back();
    }
    writing_ = true;
    stream_.expires_after(shared_.timeout);
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      // The client left while this write ran (the watching read saw it first): lose() has
      // counted the stream and closed the connection. Going on would count it again and read
      // the next request on a closed socket, keeping the session for a whole timeout.
      if (*self->gone_) return;
      if (ec) return self->lose();
      if (!self->pieces_.empty()) {
        self->pieces_.pop_front();
        return self->flush();
      }
      self->streaming_ = false;  // the last chunk went out
      ++self->shared_.answered;
      if (!self->stream_head_->keep_alive()) return self->close();
      self->next_request();
    };
    if (!pieces_.empty())
      net::async_write(stream_, http::make_chunk(net::buffer(pieces_.front())), std::move(done));
    else
      net::async_write(stream_, http::make_chunk_last(), std::move(done));
  }

  // The client has gone while its answer was awaited or written: what is queued is dropped and
  // the connection closed. An answer awaited or streamed counts as given now (its handler's
  // answer, when it comes, is dropped); a plain one being written counts when its write ends.
  void lose() {
    *gone_ = true;
    if (!answered_ || streaming_) ++shared_.answered;
    answered_ = true;
    streaming_ = false;
    pieces_.clear();
    close();
  }

  void close() {
    timer_.cancel();  // its wait holds the session
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::empty_body> continue_;
  http::response<http::string_body> res_;
  Timer timer_;  // the deadline of the request being read, then of its answer
  Shared& shared_;
  const bool refuse_;
  bool reading_ = false;  // from waiting for a request until it is read whole
  bool timed_out_ = false, keep_alive_ = true, answered_ = true;
  uint64_t seq_ = 0;  // the request being answered (0: none)
  // A streamed answer's state.
  std::optional<http::response<http::empty_body>> stream_head_;
  std::optional<http::response_serializer<http::empty_body>> serializer_;
  std::deque<std::string> pieces_;  // the front one is being written
  bool streaming_ = false, stream_ended_ = false, writing_ = false;
  // The watching read: pending, started for this request, cancelled to read the next one.
  bool watching_ = false, watched_ = false, resume_ = false;
  GoneFlag gone_;  // the request being answered's
};

// The handler's side of a streamed answer; the last reference ends the stream.
class SessionStream final : public HttpStream {
 public:
  SessionStream(std::shared_ptr<Session> s, GoneFlag gone)
      : s_(std::move(s)), gone_(std::move(gone)) {}
  ~SessionStream() override { end(); }
  bool write(std::string piece) override {
    if (ended_ || *gone_) return false;
    s_->post_piece(gone_, std::move(piece));
    return true;
  }
  void end() override {
    if (!ended_.exchange(true)) s_->post_end(gone_);
  }
  bool gone() const override { return *gone_; }

 private:
  std::shared_ptr<Session> s_;
  GoneFlag gone_;
  std::atomic<bool> ended_{false};
};

std::shared_ptr<HttpStream> make_stream(std::shared_ptr<Session> session, GoneFlag gone) {
  return std::make_shared<SessionStream>(std::move(session), std::move(gone));
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return v;
  return "";
}

struct HttpServer::Impl {
  // Before ioc, so destroyed after it: a handler still queued when the server goes (a stream's
  // end posted after run() returned) may hold the last reference to a session, whose destructor
  // leaves the registry in `shared`.
  Shared shared;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, Socket s) {
      if (ec) return;  // closed by stop()
      s.set_option(tcp::no_delay(true), ec);
      const bool refuse = ++shared.open > shared.options.max_connections;
      std::make_shared<Session>(std::move(s), shared, refuse)->start();
      accept();
    });
  }
};

HttpServer::HttpServer(HttpOptions options, HttpHandler handler) : impl_(std::make_unique<Impl>()) {
  Shared& s = impl_->shared;
  s.timeout =
      std::chrono::duration_cast<Duration>(std::chrono::duration<double>(options.timeout_s));
  s.options = std::move(options);
  s.handler = std::move(handler);
}

HttpServer::~HttpServer() = default;

int HttpServer::bind(int port) {
  const std::string& host = impl_->shared.options.host;
  beast::error_code ec;
  const auto address = net::ip::make_address(host, ec);
  tcp::acceptor& a = impl_->acceptor;
  if (!ec) {
    const tcp::endpoint at(address, static_cast<uint16_t>(port));
    a.open(at.protocol(), ec);
    if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(at, ec);
    if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  }
  if (ec)
    throw IoError(str("serve: cannot listen on ", host, ":", port, ": ", ec.message(),
                      "; the port is taken or the address is not this machine's (serve.host)"));
  return a.local_endpoint().port();
}

void HttpServer::run() {
  impl_->accept();
  std::vector<std::thread> threads;
  for (int i = 1; i < impl_->shared.options.io_threads; ++i)
    threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (std::thread& t : threads) t.join();
}

void HttpServer::stop() {
  Impl& m = *impl_;
  if (m.shared.draining.exchange(true)) return;
  net::post(m.ioc, [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
    // The live sessions, drained outside the registry's lock: a session whose last reference
    // drops here unregisters itself under that lock (it deadlocked when the drain's own
    // reference was the last, with an I/O thread done with the session meanwhile).
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard lock(m.shared.mu);
      for (Session* s : m.shared.sessions)
        if (auto p = s->weak_from_this().lock()) live.push_back(std::move(p));  // none: ending
    }
    for (const auto& s : live) s->drain();
  });
}

int64_t HttpServer::accepted() const { return impl_->shared.accepted; }
int64_t HttpServer::answered() const { return impl_->shared.answered; }

}  // namespace tessel::infer
