// tessel command line: train, eval, predict, serve, config, plan, ckpt export/import, bench comm,
// launch, tokenizer train, tokenize, report. Library errors (tessel::Error) become a one-line
// message on stderr and exit code 1; command-line misuse, and any error `tessel config` finds,
// exit 2 (command_line.h explains the misuse).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.h"
#include "infer_commands.h"
#include "launch.h"
#include "plan_command.h"
#include "report.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/bench.h"
#include "tessel/comm/mpi.h"
#include "tessel/comm/nccl_api.h"
#include "tessel/comm/threads.h"
#include "tessel/config/config.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"
#include "tessel/core/version.h"
#include "tessel/ops/cpu.h"
#include "tessel/ops/isa.h"
#include "tessel/parallel/composition.h"
#include "tessel/train/dry_run.h"
#include "tessel/train/evaluator.h"
#include "tessel/train/plan_auto.h"
#include "tessel/train/recovery.h"
#include "tessel/train/summary_text.h"
#include "tessel/train/trainer.h"
#ifdef TESSEL_WITH_CUDA
#include "tessel/ops/cuda/runtime.h"
#endif

namespace {

std::atomic<bool> g_interrupt{false};
std::atomic<int> g_signal{0};

// SIGINT (Ctrl-C), SIGTERM (mpirun's Ctrl-C, Slurm preemption), SIGUSR1/SIGUSR2 (forwarded by
// mpirun, Slurm's --signal): stop at the next step boundary with a checkpoint (docs/
// fault_tolerance.md). A second signal stops at once.
void on_stop_signal(int sig) {
  if (g_interrupt.exchange(true)) std::_Exit(128 + sig);
  g_signal.store(sig);
}

// The exit code of a run stopped by a signal: 130 after SIGINT, 143 after the others.
int stopped_exit_code() { return g_signal.load() == SIGINT ? 130 : 143; }

// The run's options with what layout = auto picked: said at the start, recorded in run.json.
tessel::train::RunOptions told(tessel::train::RunOptions opts,
                               const tessel::train::LayoutChoice& layout) {
  opts.notes.insert(opts.notes.end(), layout.notes.begin(), layout.notes.end());
  opts.layout_auto = layout.record;
  return opts;
}

// Runs one training job on the layout the config asks for (layout = auto: the plan's pick):
// one rank, ranks as threads of this process, or this process as one rank of an MPI job.
// Returns the summary; *main is false on the MPI ranks other than 0.
nlohmann::json train_job(const tessel::train::Config& cfg, const tessel::train::RunOptions& opts,
                         bool* main) {
  *main = true;
  namespace comm = tessel::comm;
  comm::CommOptions co;
  co.timeout_s = cfg.comm.timeout_s;
  co.algorithm = cfg.comm.algorithm;
  if (tessel::train::resolve_backend(cfg, comm::mpi_launched()) == comm::Backend::kMpi) {
    comm::Communicator world = comm::mpi_world(co);
    tessel::train::RunOptions rank_opts = opts;
    if (world.rank() != 0) rank_opts.progress = *main = false;
    std::unique_ptr<tessel::train::Trainer> trainer;
    try {
      const auto layout = tessel::train::resolve_layout(cfg, world.size(), &world);
      trainer =
          std::make_unique<tessel::train::Trainer>(layout.config, told(rank_opts, layout), &world);
      return trainer->run();
    } catch (const std::exception& e) {
      // Before the trainer's calls in flight wait out their deadlines: every rank stops now.
      world.abort(tessel::str("rank ", world.rank(), " failed: ", e.what()));
      // Hear the other ranks' aborts while the world is open, so that fail() knows whether
      // this error is a consequence of another rank's (the answer is remembered).
      comm::mpi_failed_elsewhere();
      throw;
    }
  }
  const auto layout = tessel::train::resolve_layout(cfg, cfg.runtime.workers, nullptr);
  return tessel::train::train_threads(layout.config, told(opts, layout), co);  // or one rank
}

// A float32 .npy file (NumPy format 1.0): magic, header dict padded to 64 bytes, data.
void write_npy(const std::string& path, const tessel::Tensor& t) {
  std::string shape = "(";
  for (int i = 0; i < t.ndim(); ++i)
    shape += std::to_string(t.dim(i)) + (t.ndim() == 1 || i + 1 < t.ndim() ? "," : "");
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(static_cast<const char*>(t.raw()), t.nbytes());
  tessel::ckpt::write_file_atomic(path, bytes);
}

// Reports an error that ends this process, once per job: under MPI a rank whose error is a
// consequence of another rank's failure stays quiet, and the failing rank ends the whole job.
int fail(const char* kind, const std::exception& e) {
  if (!tessel::comm::mpi_failed_elsewhere())
    std::fprintf(stderr, "tessel: %s: %s\n", kind, e.what());
  tessel::comm::mpi_end_failed_job(e.what(), 1);
  return 1;
}

// Everything the command line sets.
struct Args {
  std::string config_path, run_dir, resume, checkpoint, logits_path, backend, report_out, layout;
  std::string command;  // as typed, for run.json
  std::vector<std::string> overrides;
  int64_t stop_after = 0, logits_limit = 100;
  bool quiet = false, overwrite = false, trace = false, composition = false;
  int workers = 0, np = 0;
  tessel::comm::CommBenchOptions cb;
  std::string cb_algorithms, cb_sizes, cb_collectives, cb_dtype = "f32", cb_segment;
};

struct Commands {
  CLI::App *train, *eval, *config, *bench_comm, *launch, *report;
  InferCommand predict, serve, plan;
  TokenizerCommands tokenizer;
  CkptCommands ckpt;
};

void add_overrides(CLI::App* cmd, Args& a) {
  cmd->add_option("--set", a.overrides, "Override a config key: section.key=value (repeatable)");
}

CLI::App* add_train(CLI::App& app, Args& a) {
  CLI::App* train = app.add_subcommand("train", "Train a model from a config file");
  train->add_option("config", a.config_path, "Config file (TOML), e.g. examples/fashion_mlp.toml")
      ->required();
  train->add_option("--run-dir", a.run_dir, "Run folder (default: runs/<config name>)");
  CLI::Option* resume =
      train->add_option("--resume", a.resume,
                        "Continue from a run folder's latest checkpoint or a checkpoint folder");
  train
      ->add_flag("--overwrite", a.overwrite,
                 "Start over in a run folder that holds a run, removing the files tessel wrote")
      ->excludes(resume);
  add_overrides(train, a);
  train
      ->add_option("--stop-after", a.stop_after,
                   "Stop after N steps of this invocation, saving a checkpoint to resume from")
      ->check(tessel::cli::at_least(1, "steps"));
  train->add_flag("--quiet", a.quiet, "No progress output");
  train->add_flag("--trace", a.trace, "Write trace.json, a per-rank timeline (train.trace = true)");
  train->add_option("--workers", a.workers, "Ranks as threads of this process (runtime.workers)")
      ->check(tessel::cli::at_least(1, "ranks"));
  train->add_option("--backend", a.backend, "threads or mpi (runtime.backend; default: auto)");
  train->add_option("--layout", a.layout,
                    "auto: train the layout tessel plan predicts fastest within "
                    "runtime.memory_limit_mb (the layout key; docs/planning.md)");
  return train;
}

CLI::App* add_eval(CLI::App& app, Args& a) {
  CLI::App* eval = app.add_subcommand(
      "eval", "Evaluate a checkpoint on the test set in this process (any layout's checkpoint)");
  eval->add_option("config", a.config_path, "Config file the checkpoint was trained with")
      ->required();
  eval->add_option("--checkpoint", a.checkpoint, "Run folder or checkpoint folder")->required();
  add_overrides(eval, a);
  eval->add_option("--logits", a.logits_path,
                   "Also write the model's outputs for the first --limit test samples as .npy");
  eval->add_option("--limit", a.logits_limit, "Samples written by --logits")->capture_default_str();
  return eval;
}

CLI::App* add_bench_comm(CLI::App& app, Args& a) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* c = bench->add_subcommand(
      "comm", "Time collectives per algorithm and size (works under mpirun with --backend mpi)");
  c->add_option("--backend", a.cb.backend, "threads or mpi")->capture_default_str();
  c->add_option("--workers", a.cb.workers, "threads backend: world size")->capture_default_str();
  c->add_option("--algorithm", a.cb_algorithms,
                "comma list: ring, halving_doubling, tree, direct, native, auto");
  c->add_option("--sizes", a.cb_sizes, "sizes or ranges, e.g. 4KiB..64MiB or 4KiB,1MiB");
  c->add_option("--collective", a.cb_collectives, "allreduce, reduce_scatter, allgather");
  c->add_option("--dtype", a.cb_dtype, "f32, f64, f16, bf16, i32, i64")->capture_default_str();
  c->add_option("--repeats", a.cb.repeats, "timed repeats per point (0: by size)");
  c->add_option("--json", a.cb.json_path, "also write the results as JSON");
  c->add_option("--segment", a.cb_segment, "ring segment size, e.g. 1MiB (default: transport's)");
  c->add_option("--in-flight", a.cb.in_flight, "ring segments in flight (0: default)");
  return c;
}

Commands add_commands(CLI::App& app, Args& a) {
  Commands c;
  c.train = add_train(app, a);
  c.eval = add_eval(app, a);
  c.predict = add_predict(app);
  c.serve = add_serve(app);
  c.tokenizer = add_tokenizer_commands(app);
  c.ckpt = add_ckpt_commands(app);
  c.config = app.add_subcommand(
      "config",
      "Check a config as train would (without training) and print it resolved, with "
      "the layout; exit 2 on any error");
  CLI::Option* file = c.config->add_option("config", a.config_path, "Config file (TOML)");
  c.config
      ->add_flag("--composition", a.composition,
                 "Print the decision table of which parts run with which (docs/composition.md) "
                 "instead")
      ->excludes(file);
  add_overrides(c.config, a);
  CLI::Option* workers =
      c.config->add_option("--workers", a.workers, "Check for N ranks as threads (runtime.workers)")
          ->check(tessel::cli::at_least(1, "ranks"));
  c.config
      ->add_option("--np", a.np, "Check for N ranks under mpirun (also -np, as mpirun spells it)")
      ->check(tessel::cli::at_least(1, "ranks"))
      ->excludes(workers);
  c.plan = add_plan(app);
  c.bench_comm = add_bench_comm(app, a);
  c.launch = app.add_subcommand(
      "launch",
      "Run `train` under mpirun and restart it from its newest checkpoint when it fails: "
      "tessel launch -np N [--min-np M] [--max-restarts K] [--hostfile FILE] "
      "[--mpirun 'mpirun ARGS'] -- train CONFIG [options] (docs/fault_tolerance.md)");
  c.launch->prefix_command();  // everything after `launch` is the launcher's to parse
  c.launch->footer(
      "Options (before --):\n"
      "  -np N                 ranks to start (also --np, -n)\n"
      "  --min-np M            with --hostfile: restart on fewer ranks, down to M (default N)\n"
      "  --max-restarts K      restarts after a failure, each from the newest checkpoint (0)\n"
      "  --hostfile FILE       OpenMPI hostfile, read again before every start\n"
      "  --mpirun 'CMD ARGS'   the mpirun command line (default mpirun), e.g. 'mpirun "
      "--oversubscribe'\n"
      "After --: train CONFIG [train options] (see tessel train --help).\n"
      "As root, OpenMPI's refusal is lifted for the job (OMPI_ALLOW_RUN_AS_ROOT). A start that "
      "never reached training (mpirun failed to launch) is not restarted. Exit code: the job's "
      "(130/143 after SIGINT/SIGTERM).");
  c.report = app.add_subcommand(
      "report", "Write RUN_DIR/report.html: curves, load balance, memory, pipeline, timeline");
  c.report->add_option("run_dir", a.run_dir, "Run folder (holds summary.json)")->required();
  c.report->add_option("--out", a.report_out, "Output file (default: RUN_DIR/report.html)");
  return c;
}

// The config to train: CONFIG with the overrides; when resuming, the run's own config
// (RUN/config.toml) with the overrides laid over it, each difference noted.
tessel::train::Config train_config(const Args& a, std::vector<std::string>& notes) {
  if (a.resume.empty()) return tessel::train::load_config(a.config_path, a.overrides);
  const std::filesystem::path run =
      std::filesystem::path(tessel::ckpt::resolve_checkpoint_dir(a.resume))
          .parent_path()
          .parent_path();
  const std::string own = (run / "config.toml").string();
  if (!std::filesystem::exists(own)) {
    notes.push_back(tessel::str("resuming: ", own, " is missing, so the run trains with ",
                                a.config_path, " as given"));
    return tessel::train::load_config(a.config_path, a.overrides);
  }
  std::vector<std::string> changed;
  tessel::train::Config c =
      tessel::train::load_resume_config(own, a.config_path, a.overrides, &changed);
  notes.push_back(tessel::str("resuming with the run's own config, ", own,
                              changed.empty() ? "; nothing overridden" : ":"));
  for (const std::string& line : changed) notes.push_back("  " + line);
  return c;
}

int run_train(Args& a) {
  tessel::train::RunOptions opts;
  opts.run_dir = a.run_dir;
  opts.resume = a.resume;
  opts.stop_after = a.stop_after;
  opts.overwrite = a.overwrite;
  opts.command = a.command;
  opts.progress = !a.quiet;
  opts.interrupt = &g_interrupt;
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) std::signal(sig, on_stop_signal);
  if (a.workers > 0) a.overrides.push_back("runtime.workers=" + std::to_string(a.workers));
  if (!a.backend.empty()) a.overrides.push_back("runtime.backend=" + a.backend);
  if (a.trace) a.overrides.push_back("train.trace=true");
  if (!a.layout.empty()) a.overrides.push_back("layout=" + a.layout);
  bool main = true;
  nlohmann::json summary = train_job(train_config(a, opts.notes), opts, &main);
  if (!main || summary.is_null())  // an MPI rank other than 0: rank 0 prints and reports
    return g_signal.load() != 0 ? stopped_exit_code() : 0;
  std::fputs(tessel::train::summary_text(summary).c_str(), stdout);
  return summary["completed"].get<bool>() || a.stop_after > 0 ? 0 : stopped_exit_code();
}

// One process evaluates the whole model: checkpoints do not depend on the layout, so any
// layout's checkpoint evaluates here, with no optimizer and no gradients.
// Under mpirun the ranks share the batches and rank 0 alone prints.
int run_eval(const Args& a) {
  const tessel::train::Config cfg = tessel::train::load_config(a.config_path, a.overrides);
  tessel::comm::Communicator world;
  if (tessel::comm::mpi_launched()) {
    tessel::comm::CommOptions co;
    co.timeout_s = cfg.comm.timeout_s;
    world = tessel::comm::mpi_world(co);
  }
  tessel::train::Evaluator evaluator(cfg, a.checkpoint);
  if (!evaluator.datasets().test)
    throw tessel::InvalidArgument("eval: the dataset has no test split");
  const tessel::data::Dataset& test = *evaluator.datasets().test;
  const tessel::train::EvalResult r = evaluator.evaluate(test, world.valid() ? &world : nullptr);
  if (world.valid() && world.rank() != 0) return 0;
  nlohmann::json out = {{"test_loss", r.loss},
                        {"test_accuracy", r.accuracy},
                        {"samples", r.samples},
                        {"params_sha256", evaluator.params_sha256()}};
  if (!a.logits_path.empty()) {
    write_npy(a.logits_path, evaluator.outputs(test, a.logits_limit));
    out["logits"] = a.logits_path;
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

// The plan of a dry run as TOML comments, so the output stays a config file.
std::string plan_comments(const nlohmann::json& p, int world, tessel::comm::Backend backend) {
  auto mib = [](const nlohmann::json& bytes) {
    std::string out;
    for (auto& [name, b] : bytes.items())
      if (b.get<int64_t>() > 0)
        out += tessel::str(out.empty() ? "" : ", ", name, " ",
                           std::round(b.get<double>() / (1 << 20) * 100) / 100, " MiB");
    return out.empty() ? std::string("none") : out;
  };
  std::string engine;
  for (auto& [part, v] : p["engine"].items())
    engine += tessel::str(engine.empty() ? "" : ", ", part, " ",
                          v.is_string() ? v.get<std::string>() : v.dump());
  std::string out = tessel::str(
      "\n# checked as `tessel train` would start it on ", world, world == 1 ? " rank" : " ranks",
      " (",
      backend == tessel::comm::Backend::kMpi ? "processes under mpirun" : "threads of one process",
      ")\n", "#   layout   ", p["layout"].get<std::string>(), "\n#   engine   ", engine, "\n",
      "#   model    ", p["model"].get<std::string>(), ", ", p["num_parameters"].get<int64_t>(),
      " parameters\n#   data     ", p["dataset"].get<std::string>(), ", ",
      p["train_samples"].get<int64_t>(), " training samples, global batch ",
      p["global_batch"].get<int64_t>(), "\n#   steps    ", p["steps_per_epoch"].get<int64_t>(),
      " per epoch, ", p["steps"].get<int64_t>(), " in this run; the LR schedule spans ",
      p["schedule_steps"].get<int64_t>(), "\n");
  if (p.contains("pipeline_chunks"))
    for (const auto& c : p["pipeline_chunks"])
      out += tessel::str("#   stage ", c["stage"].get<int>(), "  blocks [",
                         c["blocks"][0].get<int64_t>(), ", ", c["blocks"][1].get<int64_t>(), ")\n");
  if (p.contains("pipeline_orders"))
    for (size_t s = 0; s < p["pipeline_orders"].size(); ++s)
      out += tessel::str("#   stage ", s, "  order ", p["pipeline_orders"][s].get<std::string>(),
                         "\n");
  const auto& memory = p["memory_bytes_per_rank"];
  for (size_t r = 0; r < memory.size(); ++r)
    out += tessel::str("#   rank ", r, "   ", mib(memory[r]), "\n");
  return out;
}

// `tessel config`: the resolved config, then the run as train would set it up; any error
// exits 2.
int run_config(Args& a) {
  try {
    if (a.composition) {
      std::printf("%s", tessel::parallel::composition_markdown().c_str());
      return 0;
    }
    if (a.config_path.empty())
      throw tessel::InvalidArgument(
          "tessel config needs a config file (e.g. examples/fashion_mlp.toml), or --composition");
    if (a.workers > 0) a.overrides.push_back("runtime.workers=" + std::to_string(a.workers));
    const tessel::train::Config given = tessel::train::load_config(a.config_path, a.overrides);
    const tessel::comm::Backend backend =
        tessel::train::resolve_backend(given, a.np > 0 || tessel::comm::mpi_launched());
    const int world = a.np > 0 ? a.np : given.runtime.workers;
    const auto layout = tessel::train::resolve_layout(given, world, nullptr);  // layout = auto
    const tessel::train::Config& cfg = layout.config;
    const nlohmann::json plan = tessel::train::dry_run(cfg, world);
    std::string picked;
    for (const std::string& line : layout.notes) picked += "# " + line + "\n";
    std::printf("%s%s%s", tessel::train::to_toml(cfg).c_str(), picked.c_str(),
                plan_comments(plan, world, backend).c_str());
    return 0;
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "tessel: error: %s\n", e.what());
    return 2;
  }
}

int run_bench_comm(Args& a) {
  if (!a.cb_algorithms.empty()) a.cb.algorithms = tessel::comm::parse_algorithms(a.cb_algorithms);
  if (!a.cb_sizes.empty()) a.cb.sizes = tessel::comm::parse_size_list(a.cb_sizes);
  if (!a.cb_collectives.empty()) {
    a.cb.collectives.clear();
    std::stringstream ss(a.cb_collectives);
    for (std::string item; std::getline(ss, item, ',');) a.cb.collectives.push_back(item);
  }
  a.cb.elem = tessel::comm::elem_type_from_name(a.cb_dtype);
  if (!a.cb_segment.empty()) a.cb.segment_bytes = tessel::comm::parse_bytes(a.cb_segment);
  return tessel::comm::run_comm_bench(a.cb);
}

int run(const Commands& c, Args& a) {
  if (*c.train) return run_train(a);
  if (*c.eval) return run_eval(a);
  if (*c.predict.app) return c.predict.run();
  if (*c.serve.app) return c.serve.run();
  if (*c.plan.app) return c.plan.run();
  if (*c.tokenizer.train.app) return c.tokenizer.train.run();
  if (*c.tokenizer.tokenize.app) return c.tokenizer.tokenize.run();
  if (*c.ckpt.exp.app) return c.ckpt.exp.run();
  if (*c.ckpt.imp.app) return c.ckpt.imp.run();
  if (*c.bench_comm) return run_bench_comm(a);
  if (*c.launch) return tessel::app::run_launch(c.launch->remaining());
  if (*c.report) {
    const std::string out = write_report(a.run_dir, a.report_out);
    std::printf("wrote %s\n", out.c_str());
    return 0;
  }
  if (*c.config) return run_config(a);
  return 0;
}

// argv as one shell line (arguments with special characters single-quoted).
std::string command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.empty() || arg.find_first_of(" \t\n'\"\\$`*?[]{}()<>|&;!#~") != std::string::npos) {
      std::string q = "'";
      for (char ch : arg) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      arg = q + "'";
    }
    out += (i ? " " : "") + arg;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  restart_predict_on_huge_pages(argv);
#ifdef TESSEL_WITH_CUDA
  tessel::ops::cuda::install();  // runtime.device = cuda finds the device through it
#endif
#ifdef TESSEL_WITH_NCCL
  tessel::comm::install_nccl_api(&tessel::comm::nccl_library());  // device ranks' collectives
#endif
  CLI::App app{"tessel: train and serve neural networks on many workers", "tessel"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] {
    return tessel::str("tessel ", tessel::version(), " (commit ", tessel::commit(),
                       ")\nisa: ", tessel::ops::isa_description());
  });
  Args args;
  args.command = command_line(argc, argv);
  const Commands commands = add_commands(app, args);
  std::vector<std::string> argl = tessel::cli::arguments(argc, argv);
  const tessel::cli::Walk walk = tessel::cli::walk(app, argl);
  if (!walk.error.empty()) {
    std::fprintf(stderr, "%s: error: %s\n", walk.command.c_str(), walk.error.c_str());
    return 2;
  }
  try {
    std::reverse(argl.begin(), argl.end());  // CLI11 takes them last first
    app.parse(argl);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\n", walk.command.c_str(),
                 tessel::cli::explain(walk, e).c_str());
    return 2;
  }
  try {
    return run(commands, args);
  } catch (const tessel::Error& e) {
    return fail("error", e);
  } catch (const std::exception& e) {
    return fail("internal error", e);
  }
}
