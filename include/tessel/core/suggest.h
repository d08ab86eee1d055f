// "Did you mean": the nearest of a set of valid names to a mistyped one, for config keys and
// command-line subcommands and flags. Pure functions over strings.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessel {

// Edits (insert, delete, substitute, swap two neighbours) that turn a into b.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate nearest to `name`, or "" when even the nearest needs more than a third of the
// name's letters changed (at least 2): a suggestion only when it is plausibly what was meant.
std::string nearest(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace tessel
