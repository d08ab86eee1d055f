// CSV tables (kind csv): a header line of column names, then one row of numbers per line,
// separated by commas. A field may be quoted ("..."), spaces around a field are ignored, "\r\n"
// ends a line as "\n" does, and blank lines are skipped. Every cell must be a number (any form
// strtod reads: 3, -0.5, 1e-3, nan); the target column (multilabel: columns) chosen by name.
#include "tessel/data/csv.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "datasets_internal.h"

namespace tessel::data {
namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

}  // namespace

std::vector<std::string> csv_fields(const std::string& line) {
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

std::optional<double> csv_number(const std::string& field) {
  char* end = nullptr;
  const double v = std::strtod(field.c_str(), &end);
  if (field.empty() || *end != '\0') return std::nullopt;
  return v;
}

namespace detail {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  return all;
}

// Which columns hold the targets: `target` by name (empty: the last column); multilabel: names
// separated by commas, "prefix*" for every column whose name starts with prefix.
std::vector<bool> target_columns(const std::vector<std::string>& names, const std::string& target,
                                 bool multilabel, const std::string& path) {
  std::vector<bool> chosen(names.size(), false);
  if (target.empty() && multilabel)
    throw InvalidArgument(str(
        "data: data.task = multilabel takes its label columns from "
        "data.target, got none for ",
        path, " (columns [", joined(names), "]); set e.g. data.target = \"a,b,c\" or \"label_*\""));
  if (target.empty()) {
    chosen.back() = true;
    return chosen;
  }
  for (const std::string& want : multilabel ? csv_fields(target) : std::vector{target}) {
    const bool prefix = multilabel && !want.empty() && want.back() == '*';
    const std::string stem = prefix ? want.substr(0, want.size() - 1) : want;
    bool found = false;
    for (size_t i = 0; i < names.size(); ++i)
      if (prefix ? names[i].rfind(stem, 0) == 0 : names[i] == want) chosen[i] = found = true;
    if (!found)
      throw InvalidArgument(str("data: ", path, " has no column ", prefix ? "starting with '" : "'",
                                stem, "', got columns [", joined(names), "]; set data.target to ",
                                multilabel ? "some of them" : "one of them"));
  }
  if (std::count(chosen.begin(), chosen.end(), true) == static_cast<long>(names.size()))
    throw InvalidArgument(str("data: data.target = '", target, "' takes every column of ", path,
                              ", leaving no features; name only the target columns"));
  return chosen;
}

}  // namespace

Table read_csv_table(const std::string& path, const std::string& target, bool multilabel) {
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
  const std::vector<std::string> names = csv_fields(line);
  if (names.size() < 2)
    throw InvalidArgument(str("data: ", path, " line ", line_no, " (the header) has ", names.size(),
                              " column; a table needs features and a target "
                              "column, separated by commas"));
  const std::vector<bool> is_target = target_columns(names, target, multilabel, path);
  Table table;
  for (size_t c = 0; c < names.size(); ++c)
    (is_target[c] ? table.target_names : table.feature_names).push_back(names[c]);
  table.features = static_cast<int64_t>(table.feature_names.size());
  table.targets = static_cast<int64_t>(table.target_names.size());
  while (next_line()) {
    const std::vector<std::string> cells = csv_fields(line);
    if (cells.size() != names.size())
      throw IoError(str("data: ", path, " line ", line_no, " has ", cells.size(),
                        " fields, got a ragged row: the header has ", names.size(),
                        "; give every row one value per column"));
    for (size_t c = 0; c < cells.size(); ++c) {
      const std::optional<double> v = csv_number(cells[c]);
      if (!v)
        throw IoError(str("data: ", path, " line ", line_no, " column '", names[c],
                          "' is not a number, got \"", cells[c],
                          "\"; every cell must be numeric (class labels as 0, 1, ...)"));
      (is_target[c] ? table.y : table.x).push_back(static_cast<float>(*v));
    }
    ++table.rows;
  }
  if (table.rows == 0)
    throw IoError(str("data: ", path, " has a header but no rows; add data rows below it"));
  return table;
}

}  // namespace detail
}  // namespace tessel::data
