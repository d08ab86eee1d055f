// Whole-file reads for text inputs (corpora, tokenizer files, token files).
#pragma once

#include <string>

namespace tessel::text {

// The bytes of the file at `path`. Throws IoError naming `key` (what set the path, e.g.
// "data.path") and the path when it is missing or unreadable.
std::string read_file(const std::string& path, const std::string& key);

}  // namespace tessel::text
