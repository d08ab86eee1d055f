// Token files as llm.c and nanoGPT-style pipelines write them (llm.c dev/data/data_common.py):
// a header of 256 little-endian int32 -- magic, version, token count, zeros -- then the tokens:
// uint16 (magic 20240520, version 1: GPT-2-sized vocabularies) or uint32 (magic 20240801,
// version 7: larger ones).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::data {

inline constexpr int32_t kTokenMagic16 = 20240520;
inline constexpr int32_t kTokenMagic32 = 20240801;

// The bytes of a token file of `tokens` (ids >= 0): uint16 when every id < 2^16, else uint32.
std::string token_file_bytes(const std::vector<int32_t>& tokens);
// Reads a token file. Throws IoError naming the file and what is wrong (magic, version, a
// count that disagrees with the file's size) and what to do.
std::vector<int32_t> read_token_file(const std::string& path);

}  // namespace tessel::data
