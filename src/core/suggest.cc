#include "tessel/core/suggest.h"

#include <algorithm>

namespace tessel {

size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment: Levenshtein plus the swap of two neighbouring letters ("trian").
  const size_t w = b.size() + 1;
  std::vector<size_t> d((a.size() + 1) * w);
  for (size_t i = 0; i <= a.size(); ++i) d[i * w] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t v = std::min({d[(i - 1) * w + j] + 1, d[i * w + j - 1] + 1,
                           d[(i - 1) * w + j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        v = std::min(v, d[(i - 2) * w + j - 2] + 1);
      d[i * w + j] = v;
    }
  return d.back();
}

std::string nearest(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace tessel
