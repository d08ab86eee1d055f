// A config's text before its keys are read: the bounds it keeps before the TOML parser reads it
// (docs/config.md: at most kMaxConfigBytes, nested at most kMaxConfigDepth levels), the file,
// and the parsed table with the --set overrides applied.
#pragma once

#include <toml++/toml.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::train {

// Throws InvalidArgument naming `name` (the file, or "--set key") and the line for text over
// either bound.
void check_bounds(std::string_view text, const std::string& name);

// The TOML of a config with the overrides ("section.key=value") applied, with `source` (the
// file, or the run name) in the messages; an override of a key `known` does not know is refused.
toml::table parse_table(const std::string& toml_text, const std::string& source,
                        const std::vector<std::string>& overrides,
                        const std::function<bool(const std::string&)>& known);

// The text of a config file (at most one byte over kMaxConfigBytes, which check_bounds refuses).
std::string read_config_file(const std::string& path);

}  // namespace tessel::train
