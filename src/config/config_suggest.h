// The message for an unknown config key: the valid key nearest to it, or, for a name other
// frameworks use (gradient_accumulation_steps, world_size, ...), tessel's key for the same thing
// and how the values relate (docs/config.md, "Coming from PyTorch or DeepSpeed").
#pragma once

#include <string>

namespace tessel::train {

// "config: unknown key '<path>'<where>; did you mean '<key>'? ..." for an unknown key `path`
// ("section.key" or "key"); where says where it was given (e.g. " in --set").
std::string unknown_key_message(const std::string& path, const std::string& where);

}  // namespace tessel::train
