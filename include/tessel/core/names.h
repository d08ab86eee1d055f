// The names a config gives the values of an enum: a header that declares an enum specializes
// Names<E> with one name per value, in the order of the values (0, 1, ...). The config reads a
// name into its value once (value_of), and everything after works with the enum; name_of
// gives the name back for messages, summaries and resolved configs. TESSEL_NAMES(E, "a", "b")
// writes the specialization (inside namespace tessel).
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>
#include <string>

namespace tessel {

template <typename E>
struct Names;  // static constexpr const char* values[]: one per value of E, in order

#define TESSEL_NAMES(E, ...)                               \
  template <>                                              \
  struct Names<E> {                                        \
    static constexpr const char* values[] = {__VA_ARGS__}; \
  }

template <typename E>
const char* name_of(E value) {
  return Names<E>::values[static_cast<size_t>(value)];
}

// The value named `name`; nullopt when E has no such name.
template <typename E>
std::optional<E> value_of(const std::string& name) {
  for (size_t i = 0; i < std::size(Names<E>::values); ++i)
    if (name == Names<E>::values[i]) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace tessel
