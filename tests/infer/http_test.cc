// HttpServer (the transport alone, a handler that answers at once or streams): stop() under load
// from raw socket clients answers every request it read, and every answer it counts reaches its
// client; a streamed answer whose client leaves counts once, however the leaving and the last
// write interleave; a stream started after its request's 504 touches no later stream; a stream
// ended after the server stopped ends safely with the server.
#include "tessel/infer/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "socket_testing.h"

namespace tessel::infer {
namespace {

using tessel::infer::testing::connect_to;

// Sends `request` on a fresh connection and reads until the server closes it: whether a whole
// answer came (its body "ok"); -1 when the server no longer listens.
int exchange(int port, const std::string& request) {
  const int fd = connect_to(port);
  if (fd < 0) return -1;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)!write(fd, request.data(), request.size());
  std::string got;
  char buf[1024];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(fd);
  return got.rfind("HTTP/1.1 200", 0) == 0 && got.size() >= 2 &&
         got.compare(got.size() - 2, 2, "ok") == 0;
}

// One round: 16 clients send request after request (a connection each, as cpp-httplib's client
// does) while the server is stopped after `ms` milliseconds.
void stop_under_load(int ms) {
  HttpOptions options;
  options.error = [](int status, const std::string&, const std::string& message) {
    return HttpResponse{status, "text/plain", message, {}};
  };
  HttpServer server(options, [](HttpRequest, Respond respond) {
    respond({200, "text/plain", "ok", {}});
  });
  const int port = server.bind(0);
  std::thread runner([&] { server.run(); });
  std::atomic<int64_t> received{0};
  std::vector<std::thread> clients;
  const std::string request =
      "POST /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}";
  for (int c = 0; c < 16; ++c)
    clients.emplace_back([&] {
      for (int got; (got = exchange(port, request)) >= 0;) received += got;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  server.stop();
  runner.join();
  for (auto& c : clients) c.join();
  EXPECT_EQ(server.accepted(), server.answered()) << "stopped after " << ms << " ms";
  EXPECT_EQ(server.answered(), received.load()) << "stopped after " << ms << " ms";
}

TEST(Http, StopUnderLoadAnswersEveryRequestReadAndEachAnswerArrives) {
  for (int round = 0; round < 40 && !HasFailure(); ++round) stop_under_load(20 + round % 7);
}

// Clients that close as soon as the stream's last piece ("end") has come, before or after the
// final chunk: the server sees them leave while its final chunk is written, or just after. Each
// stream is counted answered once: the count equals the requests read.
TEST(Http, StreamWhoseClientLeavesAtItsEndCountsAnsweredOnce) {
  HttpOptions options;
  options.io_threads = 2;
  options.error = [](int status, const std::string&, const std::string& message) {
    return HttpResponse{status, "text/plain", message, {}};
  };
  HttpServer server(options, [](HttpRequest req, Respond) {
    auto stream = req.start_stream({200, "text/plain", "", {}});
    for (int i = 0; i < 3; ++i) stream->write("piece ");
    stream->write("end");
    stream->end();
  });
  const int port = server.bind(0);
  std::thread runner([&] { server.run(); });
  const std::string request = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<std::thread> clients;
  std::atomic<int64_t> ended{0};
  for (int c = 0; c < 4; ++c)
    clients.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        const int fd = connect_to(port);
        ASSERT_GE(fd, 0);
        (void)!write(fd, request.data(), request.size());
        std::string got;
        char buf[256];
        for (ssize_t n;
             got.find("end") == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0;)
          got.append(buf, static_cast<size_t>(n));
        ended += got.find("end") != std::string::npos;
        close(fd);
      }
    });
  for (auto& c : clients) c.join();
  server.stop();
  runner.join();
  EXPECT_EQ(ended.load(), 800);
  EXPECT_EQ(server.accepted(), 800);
  EXPECT_EQ(server.answered(), server.accepted());
}

// A handler that starts its stream after the transport answered 504 sends nothing; the client's
// next request on that connection streams whole, untouched by the late one.
TEST(Http, StreamAfterA504OnTheSameConnectionStreamsWhole) {
  HttpOptions options;
  options.timeout_s = 0.3;
  options.error = [](int status, const std::string&, const std::string& message) {
    return HttpResponse{status, "text/plain", message, {}};
  };
  std::atomic<bool> got_504{false}, late_started{false};
  std::thread late;
  HttpServer server(options, [&](HttpRequest req, Respond) {
    if (req.path == "/late") {  // streams once its client has had the 504
      late = std::thread([&, start = req.start_stream] {
        while (!got_504) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        auto stream = start({200, "text/plain", "", {}});
        late_started = true;
        stream->write("late ");
      });
      return;
    }
    auto stream = req.start_stream({200, "text/plain", "", {}});
    stream->write("fresh ");
    stream->write("end");
  });
  const int port = server.bind(0);
  std::thread runner([&] { server.run(); });
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto exchange_on = [fd](const std::string& path, const std::string& until) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
    (void)!write(fd, request.data(), request.size());
    std::string got;
    char buf[1024];
    for (ssize_t n; got.find(until) == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0;)
      got.append(buf, static_cast<size_t>(n));
    return got;
  };
  EXPECT_EQ(exchange_on("/late", "overloaded").rfind("HTTP/1.1 504", 0), 0u);
  got_504 = true;
  while (!late_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // its head is refused meanwhile
  const std::string got = exchange_on("/now", "0\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
  EXPECT_NE(got.find("fresh end"), std::string::npos) << got;
  EXPECT_EQ(got.find("late"), std::string::npos) << got;
  close(fd);
  late.join();
  server.stop();
  runner.join();
  EXPECT_EQ(server.answered(), server.accepted());
}

// A stream that outlives the transport's run() (its client left; the handler ends it after the
// server stopped): the end queued to the stopped server holds the connection's session, which
// ends when the server is destroyed, safely.
TEST(Http, AStreamEndedAfterTheServerStoppedEndsWithIt) {
  HttpOptions options;
  options.error = [](int status, const std::string&, const std::string& message) {
    return HttpResponse{status, "text/plain", message, {}};
  };
  std::shared_ptr<HttpStream> kept;
  std::atomic<bool> started{false};
  auto server = std::make_unique<HttpServer>(options, [&](HttpRequest req, Respond) {
    kept = req.start_stream({200, "text/plain", "", {}});
    kept->write("first");
    started = true;
  });
  const int port = server->bind(0);
  std::thread runner([&] { server->run(); });
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  const std::string request = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  char buf[256];
  std::string got;
  for (ssize_t n; got.find("first") == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  close(fd);
  while (!kept->gone()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server->stop();
  runner.join();
  EXPECT_TRUE(started);
  kept->end();
  kept.reset();
  server.reset();
}

}  // namespace
}  // namespace tessel::infer
