// Private to ckpt: manifest.json, the index of a step folder. manifest_text writes it (checking
// the Manifest it is given), parse_manifest reads it back (checking every field, and the
// SHA-256 the manifest records of its own content). Both are pure: no file is touched.
#pragma once

#include <filesystem>
#include <string>

#include "tessel/ckpt/checkpoint.h"

namespace tessel::ckpt::detail {

inline constexpr const char* kManifest = "manifest.json";
inline constexpr const char* kTrainer = "trainer.json";

// manifest.json's text (see checkpoint.h), with the size and SHA-256 of trainer_json and the
// SHA-256 of the manifest itself. Throws InvalidArgument for a malformed Manifest, and IoError
// when a shard file it lists is not in `dir` with the size write_shard reported.
std::string manifest_text(const Manifest& m, const std::string& trainer_json,
                          const std::filesystem::path& dir);

// Parses and checks manifest.json's `text` (read from `path`, which messages name); `trainer`
// receives trainer.json's recorded size and hash. Any defect is an IoError naming the field.
Manifest parse_manifest(const std::string& path, const std::string& text, ShardFile* trainer);

// Throws the IoError for a damaged file of a step folder: "checkpoint: <path> <defect>; ...".
[[noreturn]] void corrupt_file(const std::string& path, const std::string& defect);

}  // namespace tessel::ckpt::detail
