// The bounds a config's text keeps before the TOML parser reads it (docs/config.md): at most
// kMaxConfigBytes, nested at most kMaxConfigDepth levels.
#pragma once

#include <string>
#include <string_view>

namespace tessel::train {

// Throws InvalidArgument naming `name` (the file, or "--set key") and the line for text over
// either bound.
void check_bounds(std::string_view text, const std::string& name);

}  // namespace tessel::train
