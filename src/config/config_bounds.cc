#include "config_bounds.h"

#include <charconv>
#include <fstream>
#include <utility>
#include <vector>

#include "config_suggest.h"
#include "tessel/config/config.h"
#include "tessel/core/error.h"

namespace tessel::train {
namespace {

// Applies "section.key=value" to the parsed table before the keys are read.
void apply_override(toml::table& root, const std::string& assignment,
                    const std::function<bool(const std::string&)>& known) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InvalidArgument(str("config: --set expects section.key=value, got '", assignment, "'"));
  std::string path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  if (!known(path)) throw InvalidArgument(unknown_key_message(path, " in --set"));
  toml::table parsed;
  check_bounds("v = " + text, "--set " + path);
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", text);  // a bare word: take it as a string
  }
  size_t dot = path.find('.');
  toml::table* target = &root;
  if (dot != std::string::npos) {
    std::string section = path.substr(0, dot);
    if (!root[section].is_table()) root.insert_or_assign(section, toml::table{});
    target = root[section].as_table();
    path = path.substr(dot + 1);
  }
  target->insert_or_assign(path, *parsed.get("v"));
}

// The index of the quote that closes the string opening at text[i] (basic "...", literal '...'
// or multi-line """...""" / '''...'''), counting its newlines into `line`; text.size() if none.
size_t string_end(std::string_view text, size_t i, int& line) {
  const char q = text[i];
  const bool multi = text.substr(i, 3) == std::string(3, q);
  for (size_t j = i + (multi ? 3 : 1); j < text.size(); ++j) {
    if (text[j] == '\n') ++line;
    if (text[j] == '\\' && q == '"') {
      ++j;  // an escaped character, a quote or a backslash included
      if (j < text.size() && text[j] == '\n') ++line;
    } else if (text[j] == q && (!multi || text.substr(j, 3) == std::string(3, q))) {
      return multi ? j + 2 : j;
    }
  }
  return text.size();
}

}  // namespace

// Refuses text the TOML parser should not see: more than kMaxConfigBytes, or nested deeper than
// kMaxConfigDepth levels (toml++ recurses per level: a header 70,000 keys deep overflowed its
// stack). A level is a part of a table header or of a dotted key (the header's parts carry
// over to its keys) or an [ or { of a value. One pass that skips strings and comments.
void check_bounds(std::string_view text, const std::string& name) {
  if (text.size() > kMaxConfigBytes)
    throw InvalidArgument(str("config: ", name, " is larger than the ", kMaxConfigBytes,
                              " bytes (1 MiB) a config may have; a tessel config is a few "
                              "kilobytes: check that this is the file you meant"));
  int line = 1;
  std::vector<std::pair<int, char>> open;  // each [ or { of a value, with the level before it
  bool key = true, header = false, fresh = true;  // reading a key; a [table] header; line start
  int header_levels = 0, level = 0, parts = 1;    // parts: of the key being read
  auto close = [&] {
    level = open.back().first;
    open.pop_back();
    key = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (ch == '\n') {
      ++line;
      if (!open.empty()) continue;  // an array goes on over lines
      if (header) header_levels = parts;
      key = fresh = true, header = false, level = header_levels, parts = 1;
      continue;
    }
    if (ch == ' ' || ch == '\t' || ch == '\r') continue;
    if (ch == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
      continue;
    }
    if (fresh && ch == '[') header = true, level = 0;
    fresh = false;
    if (ch == '"' || ch == '\'') {
      i = string_end(text, i, line);
    } else if (key) {
      if (ch == '.') ++parts;
      if (ch == '=' && !header) key = false, level += parts;
      if (ch == '}' && !open.empty()) close();  // an empty inline table
    } else if (ch == '[' || ch == '{') {
      open.emplace_back(level++, ch);
      if (ch == '{') key = true, parts = 1;
    } else if ((ch == ']' || ch == '}') && !open.empty()) {
      close();
    } else if (ch == ',' && !open.empty()) {  // the next value, or key of an inline table
      level = open.back().first + 1;
      if (open.back().second == '{') key = true, parts = 1;
    }
    if ((key ? level + parts : level) > kMaxConfigDepth)
      throw InvalidArgument(str(
          "config: ", name, ":", line, ": tables, keys and arrays nest more than ", kMaxConfigDepth,
          " levels deep; a tessel config needs 3 ([section], key = [values])"));
  }
}

// The TOML of a config with the overrides applied, with `source` (the file, or the run name)
// in the messages.
toml::table parse_table(const std::string& toml_text, const std::string& source,
                        const std::vector<std::string>& overrides,
                        const std::function<bool(const std::string&)>& known) {
  check_bounds(toml_text, source);
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    throw InvalidArgument(str("config: ", source, ":", e.source().begin.line, ":",
                              e.source().begin.column, ": ", e.description()));
  }
  for (const std::string& o : overrides) apply_override(root, o, known);
  return root;
}

std::string read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw IoError(str("config: cannot read '", path, "'; check the path (examples/ has configs)"));
  std::string text(kMaxConfigBytes + 1, '\0');  // one byte more tells a file over the limit
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

std::pair<int64_t, int64_t> parse_step_window(const std::string& text) {
  auto parse_int = [](const std::string& s, int64_t& out) {
    const char* end = s.data() + s.size();
    auto [p, ec] = std::from_chars(s.data(), end, out);
    return ec == std::errc() && p == end;
  };
  const size_t colon = text.find(':');
  int64_t first = 0, end = 0;
  if (colon == std::string::npos || !parse_int(text.substr(0, colon), first) ||
      !parse_int(text.substr(colon + 1), end) || first < 0 || end <= first)
    throw InvalidArgument(
        str("config: trace.steps must be \"A:B\" with 0 <= A < B (steps A to B - 1 "
            "are traced), got '",
            text, "'"));
  return {first, end};
}

}  // namespace tessel::train
