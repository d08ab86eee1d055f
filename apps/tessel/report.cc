#include "report.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "report_script.h"
#include "tessel/core/error.h"

namespace fs = std::filesystem;

namespace {

// Debian's python3 (the one python3-matplotlib installs into) unless TESSEL_PYTHON names another.
std::string python() {
  if (const char* p = std::getenv("TESSEL_PYTHON")) return p;
  return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string write_report(const std::string& run_dir, const std::string& out_arg) {
  if (!fs::exists(fs::path(run_dir) / "summary.json"))
    throw tessel::IoError(tessel::str("report: ", run_dir,
                                      " holds no summary.json; pass the run "
                                      "folder of a finished or stopped `tessel train`"));
  const std::string out = out_arg.empty() ? (fs::path(run_dir) / "report.html").string() : out_arg;
  // The script comes on stdin ("python3 -"); its messages go to stderr.
  const std::string cmd = python() + " - " + quoted(run_dir) + " " + quoted(out);
  FILE* p = popen(cmd.c_str(), "w");
  if (!p)
    throw tessel::IoError(
        tessel::str("report: cannot start ", python(), ": ", std::strerror(errno)));
  const size_t n = std::strlen(kReportScript);
  const bool sent = std::fwrite(kReportScript, 1, n, p) == n;
  const int status = pclose(p);
  if (!sent || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw tessel::IoError(
        tessel::str("report: ", python(),
                    " could not write the report (see its message above; it needs "
                    "python3-matplotlib: run scripts/setup.sh)"));
  return out;
}
