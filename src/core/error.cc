#include "tessel/core/error.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tessel {

std::string excerpt(const std::string& value) {
  if (value.size() <= 80) return value;
  return str(value.substr(0, 60), "... (", value.size(), " characters)");
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(const std::string& word, std::initializer_list<const char*> choices) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const char* c : choices)
    if (const size_t d = edit_distance(word, c); d < best_d) best_d = d, best = c;
  return best;
}

namespace detail {

std::string cut_message(const std::string& what) {
  if (what.size() <= kMaxMessage) return what;
  const size_t keep = kMaxMessage / 2 - 50;
  return str(what.substr(0, keep), " [... ", what.size() - 2 * keep, " characters cut ...] ",
             what.substr(what.size() - keep));
}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(str("internal check failed: ", cond, " at ", file, ":", line,
                  msg.empty() ? "" : ": ", msg));
}

}  // namespace detail
}  // namespace tessel
