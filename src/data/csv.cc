// CSV tables (kind csv): a header line of column names, then one row of numbers per line,
// separated by commas. A field may be quoted ("..."), spaces around a field are ignored, "\r\n"
// ends a line as "\n" does, and blank lines are skipped. Every cell must be a number (any form
// strtod reads: 3, -0.5, 1e-3, nan); the target column is chosen by name.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "datasets_internal.h"

namespace tessel::data::detail {
namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::vector<std::string> split_fields(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  for (std::string& f : out) f = trim(f);
  return out;
}

// The index of the target column: `target` by name, or the last column.
size_t target_column(const std::vector<std::string>& names, const std::string& target,
                     const std::string& path) {
  if (target.empty()) return names.size() - 1;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == target) return i;
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  throw InvalidArgument(str("data: ", path, " has no column '", target, "', got columns [", all,
                            "]; set data.target to one of them"));
}

}  // namespace

Table read_csv_table(const std::string& path, const std::string& target) {
  std::ifstream in(path);
  if (!in)
    throw IoError(str("data: cannot open ", path, ", got \"", std::strerror(errno),
                      "\"; set data.path to a CSV file"));
  std::string line;
  int64_t line_no = 0;
  auto next_line = [&]() {
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!trim(line).empty()) return true;
    }
    return false;
  };
  if (!next_line())
    throw IoError(str("data: ", path,
                      " is empty, got no header line; a CSV table starts with a "
                      "line of column names"));
  const std::vector<std::string> names = split_fields(line);
  if (names.size() < 2)
    throw InvalidArgument(str("data: ", path, " line ", line_no, " (the header) has ", names.size(),
                              " column; a table needs features and a target "
                              "column, separated by commas"));
  const size_t t = target_column(names, target, path);
  Table table;
  table.features = static_cast<int64_t>(names.size()) - 1;
  while (next_line()) {
    const std::vector<std::string> cells = split_fields(line);
    if (cells.size() != names.size())
      throw IoError(str("data: ", path, " line ", line_no, " has ", cells.size(),
                        " fields, got a ragged row: the header has ", names.size(),
                        "; give every row one value per column"));
    for (size_t c = 0; c < cells.size(); ++c) {
      char* end = nullptr;
      const double v = std::strtod(cells[c].c_str(), &end);
      if (cells[c].empty() || *end != '\0')
        throw IoError(str("data: ", path, " line ", line_no, " column '", names[c],
                          "' is not a number, got \"", cells[c],
                          "\"; every cell must be numeric (class labels as 0, 1, ...)"));
      (c == t ? table.y : table.x).push_back(static_cast<float>(v));
    }
    ++table.rows;
  }
  if (table.rows == 0)
    throw IoError(str("data: ", path, " has a header but no rows; add data rows below it"));
  return table;
}

}  // namespace tessel::data::detail
