// What the serve tests share: a Server on a free loopback port, running until the test ends.
#pragma once

#include <httplib.h>

#include <string>
#include <thread>
#include <vector>

#include "infer_testing.h"
#include "tessel/infer/server.h"

namespace tessel::infer::testing {

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
    if (thread.joinable()) thread.join();  // a test may have stopped it
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

}  // namespace tessel::infer::testing
