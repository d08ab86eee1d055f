#include "config_bounds.h"

#include <utility>
#include <vector>

#include "tessel/core/error.h"
#include "tessel/train/config.h"

namespace tessel::train {
namespace {

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

}  // namespace tessel::train
