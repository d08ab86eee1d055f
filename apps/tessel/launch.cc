#include "launch.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/config/config.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace tessel::app {
namespace {

namespace fs = std::filesystem;

constexpr const char* kUsage =
    "usage: tessel launch -np N [--min-np M] [--max-restarts K] [--hostfile FILE] "
    "[--mpirun 'mpirun ARGS'] -- train CONFIG [train options]";

struct LaunchOptions {
  int np = 0, min_np = 0, max_restarts = 0;
  std::string hostfile, mpirun = "mpirun";
  std::vector<std::string> command;  // "train", CONFIG, options
};

// What the launcher needs of the train command: its run folder and the arguments to keep on a
// restart (all but --run-dir, --resume and --overwrite, which a restart sets).
struct TrainCommand {
  std::string config, run_dir, resume;
  bool overwrite = false;
  std::vector<std::string> sets, kept;
};

int to_int(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(
      str("launch: ", flag, " needs an integer, got '", excerpt(value), "'; ", kUsage));
}

LaunchOptions parse_launch(const std::vector<std::string>& args) {
  LaunchOptions o;
  size_t i = 0;
  auto value = [&](const std::string& flag) {
    if (i + 1 >= args.size())
      throw InvalidArgument(str("launch: ", flag, " needs a value; ", kUsage));
    return args[++i];
  };
  for (; i < args.size() && args[i] != "--"; ++i) {
    const std::string& a = args[i];
    if (a == "-np" || a == "--np" || a == "-n")
      o.np = to_int(a, value(a));
    else if (a == "--min-np")
      o.min_np = to_int(a, value(a));
    else if (a == "--max-restarts")
      o.max_restarts = to_int(a, value(a));
    else if (a == "--hostfile")
      o.hostfile = value(a);
    else if (a == "--mpirun")
      o.mpirun = value(a);
    else
      throw InvalidArgument(str("launch: unknown option '", excerpt(a), "'; ", kUsage));
  }
  if (i < args.size()) o.command.assign(args.begin() + static_cast<long>(i) + 1, args.end());
  if (o.np < 1) throw InvalidArgument(str("launch: -np must be >= 1, got ", o.np, "; ", kUsage));
  if (o.min_np == 0) o.min_np = o.np;
  if (o.min_np < 1 || o.min_np > o.np)
    throw InvalidArgument(str("launch: --min-np must be in [1, ", o.np, "], got ", o.min_np));
  if (o.max_restarts < 0)
    throw InvalidArgument(str("launch: --max-restarts must be >= 0, got ", o.max_restarts));
  if (o.command.empty() || o.command[0] != "train")
    throw InvalidArgument(str("launch: the command after -- must be `train CONFIG ...`; ", kUsage));
  return o;
}

TrainCommand parse_train(const std::vector<std::string>& command) {
  TrainCommand t;
  t.kept.push_back(command[0]);
  static const char* kWithValue[] = {"--run-dir",    "--resume",  "--set",
                                     "--stop-after", "--workers", "--backend"};
  for (size_t i = 1; i < command.size(); ++i) {
    std::string a = command[i], v;
    const size_t eq = a.find('=');
    const bool joined = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (joined) v = a.substr(eq + 1), a = a.substr(0, eq);
    const bool takes = std::any_of(std::begin(kWithValue), std::end(kWithValue),
                                   [&](const char* f) { return a == f; });
    if (takes && !joined) {
      if (i + 1 >= command.size())
        throw InvalidArgument(str("launch: train ", a, " needs a value"));
      v = command[++i];
    }
    if (a == "--run-dir")
      t.run_dir = v;
    else if (a == "--resume")
      t.resume = v;
    else if (a == "--overwrite")
      t.overwrite = true;
    else {
      if (a == "--set") t.sets.push_back(v);
      if (!takes && a[0] != '-' && t.config.empty()) t.config = a;
      t.kept.push_back(a);
      if (takes) t.kept.push_back(v);
    }
  }
  if (t.config.empty()) throw InvalidArgument(str("launch: train needs a CONFIG; ", kUsage));
  // The run folder as the Trainer picks it: --run-dir, the folder resumed from, runs/<name>.
  if (t.run_dir.empty() && !t.resume.empty())
    t.run_dir = fs::path(ckpt::resolve_checkpoint_dir(t.resume)).parent_path().parent_path();
  // A config error ends the launch before any start.
  const train::Config config = train::load_config(t.config, t.sets);
  if (t.run_dir.empty()) t.run_dir = (fs::path("runs") / config.name).string();
  return t;
}

// Slots in an OpenMPI hostfile: "host slots=N" per line (1 without slots=), # comments.
int hostfile_slots(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(str("launch: cannot read --hostfile ", path));
  int slots = 0;
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string host, word;
    if (!(words >> host)) continue;
    int n = 1;
    while (words >> word)
      if (word.rfind("slots=", 0) == 0) n = to_int("slots", word.substr(6));
    slots += n;
  }
  return slots;
}

std::atomic<pid_t> g_child{0};
std::atomic<int> g_stop_signal{0};

// A stop request reaches the ranks as SIGUSR1, which mpirun forwards without killing them a
// second later (as it does after SIGTERM); a second request kills the job.
void on_signal(int sig) {
  const pid_t child = g_child.load();
  if (g_stop_signal.exchange(sig) != 0) {
    if (child > 0) ::kill(child, SIGTERM);
    return;
  }
  if (child > 0) ::kill(child, SIGUSR1);
}

// Runs argv and returns its exit code (128 + signal when a signal ended it).
int run_child(const std::vector<std::string>& argv) {
  std::vector<char*> c;
  for (const std::string& a : argv) c.push_back(const_cast<char*>(a.c_str()));
  c.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(str("launch: fork failed: ", std::strerror(errno)));
  if (pid == 0) {
    ::execvp(c[0], c.data());
    std::fprintf(stderr, "tessel launch: cannot run %s: %s\n", c[0], std::strerror(errno));
    std::_Exit(127);
  }
  g_child.store(pid);
  if (g_stop_signal.load() != 0) ::kill(pid, SIGUSR1);  // a request that came before the fork
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  g_child.store(0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string joined(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

std::string self_path() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("tessel") : p.string();
}

// The command of one start: mpirun, its ranks, this tessel and the train command, which on a
// restart resumes from the run folder's newest checkpoint (if any) without the injected fault.
std::vector<std::string> start_command(const LaunchOptions& o, const TrainCommand& t, int np,
                                       bool restart, std::string* from) {
  std::vector<std::string> argv;
  std::istringstream words(o.mpirun);
  for (std::string w; words >> w;) argv.push_back(w);
  argv.insert(argv.end(), {"-np", std::to_string(np)});
  if (!o.hostfile.empty()) argv.insert(argv.end(), {"--hostfile", o.hostfile});
  argv.push_back(self_path());
  argv.insert(argv.end(), t.kept.begin(), t.kept.end());
  argv.insert(argv.end(), {"--run-dir", t.run_dir});
  std::string resume = t.resume;
  if (restart) {
    try {
      resume = ckpt::resolve_checkpoint_dir(t.run_dir);
    } catch (const IoError&) {  // no checkpoint yet: start over (or from the original resume)
    }
    argv.insert(argv.end(), {"--set", "debug.fail_rank=-1"});
  }
  if (!resume.empty())
    argv.insert(argv.end(), {"--resume", resume});
  else if (t.overwrite || restart)
    argv.push_back("--overwrite");  // restart: clear the failed try
  *from = resume.empty() ? "the start" : resume;
  return argv;
}

// run.json's identity (inode, modification time): rank 0 rewrites it once the ranks have formed
// their world and checked the run folder, so an unchanged one means no start got that far.
std::pair<uint64_t, int64_t> run_record_stamp(const std::string& run_dir) {
  struct stat st {};
  if (::stat((fs::path(run_dir) / "run.json").c_str(), &st) != 0) return {0, 0};
  return {st.st_ino, st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
}

}  // namespace

int run_launch(const std::vector<std::string>& args) {
  const LaunchOptions o = parse_launch(args);
  const TrainCommand t = parse_train(o.command);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) std::signal(sig, on_signal);
  if (::geteuid() == 0) {  // most containers: OpenMPI refuses root unless told so twice
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  for (int restarts = 0;; ++restarts) {
    const int slots = o.hostfile.empty() ? o.np : hostfile_slots(o.hostfile);
    const int np = std::min(o.np, slots);
    if (np < o.min_np)
      throw Error(str("launch: ", o.hostfile, " has ", slots, " slots left, fewer than --min-np ",
                      o.min_np, "; add hosts to it or lower --min-np"));
    std::string from;
    const std::vector<std::string> argv = start_command(o, t, np, restarts > 0, &from);
    log_info("tessel launch: start ", restarts + 1, " on ", np, " ranks from ", from, ": ",
             joined(argv));
    const double t0 = now_seconds();
    const std::pair<uint64_t, int64_t> record = run_record_stamp(t.run_dir);
    const int rc = run_child(argv);
    const int stop = g_stop_signal.load();
    if (stop != 0) return rc == 0 ? 0 : (stop == SIGINT ? 130 : 143);
    if (rc == 0 || rc == 130 || rc == 143) return rc;  // done, or stopped by a signal
    if (run_record_stamp(t.run_dir) == record) {
      log_warn("tessel launch: the job exited with code ", rc, " before its ranks started (",
               t.run_dir,
               "/run.json was not written): the launcher failed, see its message "
               "above; not restarting");
      return rc;
    }
    if (restarts >= o.max_restarts) {
      log_warn("tessel launch: the job failed (exit ", rc, ") after ", now_seconds() - t0,
               " s and no restarts are left (--max-restarts ", o.max_restarts, ")");
      return rc;
    }
    log_warn("tessel launch: the job failed (exit ", rc, ") after ", now_seconds() - t0,
             " s; restart ", restarts + 1, " of ", o.max_restarts);
  }
}

}  // namespace tessel::app
