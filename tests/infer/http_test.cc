// HttpServer (the transport alone, a handler that answers at once or streams): stop() under load
// from raw socket clients answers every request it read, and every answer it counts reaches its
// client; a streamed answer whose client leaves counts once, however the leaving and the last
// write interleave; a stream started after its request's 504 touches no later stream; a stream
// ended after the server stopped ends safely with the server; a watched request sees its client
// leave before its answer, and watched requests on a keep-alive connection (pipelined or not)
// are each answered in order.
#include "tessel/infer/http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
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

HttpOptions text_errors() {
  HttpOptions options;
  options.error = [](int status, const std::string&, const std::string& message) {
    return HttpResponse{status, "text/plain", message, {}};
  };
  return options;
}

// Reads from `fd` until `until` has come (or the connection ends); what came.
std::string read_until(int fd, const std::string& until) {
  std::string got;
  char buf[1024];
  for (ssize_t n; got.find(until) == std::string::npos && (n = read(fd, buf, sizeof buf)) > 0;)
    got.append(buf, static_cast<size_t>(n));
  return got;
}

// A plain answer that waits (a queued generation's): with the connection watched, a client that
// leaves is seen before any answer: gone() turns true, the request counts as answered, and the
// late answer goes nowhere.
TEST(Http, AWatchedRequestSeesItsClientLeaveBeforeItsAnswer) {
  std::mutex mu;
  Respond kept;
  std::function<bool()> gone;
  HttpServer server(text_errors(), [&](HttpRequest req, Respond respond) {
    std::lock_guard lock(mu);
    gone = req.watch();
    kept = std::move(respond);
  });
  const int port = server.bind(0);
  std::thread runner([&] { server.run(); });
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  const std::string request = "GET /x HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  auto wait_for = [](const std::function<bool()>& done) {
    for (int i = 0; i < 5000 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  };
  ASSERT_TRUE(wait_for([&] {
    std::lock_guard lock(mu);
    return static_cast<bool>(kept);
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the watch begins
  EXPECT_FALSE(gone());
  close(fd);
  EXPECT_TRUE(wait_for(gone)) << "the client left unseen";
  EXPECT_TRUE(wait_for([&] { return server.answered() == 1; })) << "its leaving was not counted";
  kept({200, "text/plain", "late", {}});  // dropped
  kept = nullptr;                         // its session goes before the server
  server.stop();
  runner.join();
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(server.answered(), 1);
}

// Watched requests on one keep-alive connection, answered late from another thread: pipelined
// ones (sent in one write, read by the watch while the first waits) and then one after the
// other are each answered whole and in order; no client is taken as gone.
TEST(Http, WatchedRequestsOnAKeepAliveConnectionAreEachAnswered) {
  std::atomic<int> seen{0}, gone_seen{0};
  std::vector<std::thread> late;
  std::mutex mu;
  HttpServer server(text_errors(), [&](HttpRequest req, Respond respond) {
    auto gone = req.watch();
    std::lock_guard lock(mu);
    late.emplace_back([&, gone, path = req.path, respond = std::move(respond)] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      gone_seen += gone();
      ++seen;
      respond({200, "text/plain", "answer" + path, {}});
    });
  });
  const int port = server.bind(0);
  std::thread runner([&] { server.run(); });
  const int fd = connect_to(port);
  ASSERT_GE(fd, 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  auto get = [](int i) {  // GET /i
    std::string r = "GET /";
    r += std::to_string(i);
    return r + " HTTP/1.1\r\nHost: x\r\n\r\n";
  };
  auto answer = [](int i) {
    std::string a = "answer/";
    return a += std::to_string(i);
  };
  // The first request alone, then two more in one write while it waits.
  const std::string first = get(1), two = get(2) + get(3);
  ASSERT_EQ(write(fd, first.data(), first.size()), static_cast<ssize_t>(first.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // its watch reads them
  ASSERT_EQ(write(fd, two.data(), two.size()), static_cast<ssize_t>(two.size()));
  std::string got = read_until(fd, answer(3));
  for (int i = 4; i <= 6; ++i) {
    const std::string one = get(i);
    ASSERT_EQ(write(fd, one.data(), one.size()), static_cast<ssize_t>(one.size()));
    got += read_until(fd, answer(i));
  }
  size_t at = 0;
  for (int i = 1; i <= 6; ++i) {
    const size_t next = got.find(answer(i), at);
    ASSERT_NE(next, std::string::npos) << "answer " << i << " missing or out of order in\n" << got;
    at = next;
  }
  close(fd);
  server.stop();
  runner.join();
  for (auto& t : late) t.join();
  EXPECT_EQ(seen, 6);
  EXPECT_EQ(gone_seen, 0);
  EXPECT_EQ(server.accepted(), 6);
  EXPECT_EQ(server.answered(), 6);
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
