// `tessel report RUN_DIR`: one self-contained HTML file of a run folder (report.py, embedded
// in the binary at build time, run by Debian's python3 with matplotlib).
#pragma once

#include <string>

// Writes the report of run_dir to `out` (empty: run_dir/report.html) and returns its path.
// Throws tessel::IoError when run_dir holds no run or the report cannot be made.
std::string write_report(const std::string& run_dir, const std::string& out);
