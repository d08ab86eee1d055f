// tessel serve CONFIG --checkpoint RUN --port P [--workers N]: the HTTP endpoint until SIGTERM
// or Ctrl-C, then a graceful stop that answers every request already read.
#include <semaphore.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "infer_commands.h"
#include "tessel/config/config.h"
#include "tessel/infer/server.h"
#include "tessel/ops/cpu.h"

namespace {

struct ServeArgs {
  std::string config_path, checkpoint;
  std::vector<std::string> overrides;
  int port = 8080, workers = 0;
};

sem_t g_stop;  // posted by the signal handler (sem_post is async-signal-safe)
volatile sig_atomic_t g_signal = 0;

void on_stop_signal(int sig) {
  g_signal = sig;
  sem_post(&g_stop);
}

int run_serve(ServeArgs& a) {
  if (a.workers > 0) a.overrides.push_back("runtime.workers=" + std::to_string(a.workers));
  const tessel::train::Config config = tessel::train::load_config(a.config_path, a.overrides);
  tessel::ops::set_blas_threads(1);  // the workers are the parallelism
  tessel::infer::Server server(config, a.checkpoint, config.runtime.workers);
  const int port = server.bind(a.port);
  // SIGTERM or Ctrl-C: a thread that waits for the handler's post stops the server.
  sem_init(&g_stop, 0, 0);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    while (!done) {
      timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_nsec += 100'000'000;
      if (until.tv_nsec >= 1'000'000'000) until.tv_sec += 1, until.tv_nsec -= 1'000'000'000;
      if (sem_timedwait(&g_stop, &until) == 0) {
        std::fprintf(stderr, "serve: %s: stopping; answering the requests already read\n",
                     g_signal == SIGTERM ? "SIGTERM" : "SIGINT");
        server.stop();
        return;
      }
    }
  });
  std::printf(
      "serve: listening on http://%s:%d (%d workers, serve.max_batch %lld, "
      "serve.max_wait_ms %g)\n",
      config.serve.host.c_str(), port, config.runtime.workers,
      static_cast<long long>(config.serve.max_batch), config.serve.max_wait_ms);
  std::fflush(stdout);
  server.run();
  done = true;
  waiter.join();
  std::printf("serve: stopped; %lld requests read, %lld answered\n",
              static_cast<long long>(server.accepted()), static_cast<long long>(server.answered()));
  return server.accepted() == server.answered() ? 0 : 1;
}

}  // namespace

InferCommand add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a checkpoint's model over HTTP (KServe v2 protocol) with dynamic batching until "
      "SIGTERM");
  cmd->add_option("config", a->config_path, "Config file the checkpoint was trained with")
      ->required();
  cmd->add_option("--checkpoint", a->checkpoint, "Run folder or checkpoint folder")->required();
  cmd->add_option("--port", a->port, "TCP port (0: any free port, printed)")->capture_default_str();
  cmd->add_option("--set", a->overrides, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--workers", a->workers, "Worker ranks as threads, each running batches");
  return {cmd, [a] { return run_serve(*a); }};
}
