// Checkpoint folders with crash-safe commits. The invariant: `latest` always names a complete,
// fsynced step folder. Writers build a private "<name>.tmp-<pid>" folder, make it durable, and
// only then rename it into place and move `latest`; readers never look at ".tmp-" names.
// Integrity: manifest.json (manifest.cc) records the size and SHA-256 of every other file in
// the folder and the SHA-256 of its own content, so a flipped bit anywhere in a step folder
// fails the load (checkpoint_reader.cc).
#include "tessel/ckpt/checkpoint.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "manifest.h"
#include "posix_io.h"
#include "safetensors_header.h"
#include "tessel/core/log.h"
#include "tessel/core/sha256.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // writes a slice's {"name", "begin"} in that order
using detail::kManifest;
using detail::kTrainer;

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

// "step-<digits>" exactly; temporary folders ("step-5.tmp-12") do not match.
bool parse_step_dir(const std::string& name, int64_t* step) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return false;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
    v = v * 10 + (name[i] - '0');
  }
  *step = v;
  return true;
}

// The pid of a "<name>.tmp-<pid>" entry, or -1 for any other name.
long tmp_owner(const std::string& name) {
  const size_t at = name.rfind(".tmp-");
  if (at == std::string::npos || at + 5 == name.size()) return -1;
  long pid = 0;
  for (size_t i = at + 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || pid > (1L << 40)) return -1;
    pid = pid * 10 + (name[i] - '0');
  }
  return pid;
}

std::vector<std::pair<int64_t, std::string>> step_dirs(const fs::path& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    int64_t step = 0;
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (parse_step_dir(name, &step) && it->is_directory(type_ec)) out.emplace_back(step, name);
  }
  if (ec) detail::io_fail("listing", root.string(), ec.value());
  std::sort(out.begin(), out.end(), std::greater<>());  // newest first
  return out;
}

std::string latest_name(const fs::path& root) {
  std::string name = detail::read_text((root / "latest").string());
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  int64_t step = 0;
  if (!parse_step_dir(name, &step))
    throw IoError(
        str("checkpoint: ", (root / "latest").string(), " holds '", name.substr(0, 64),
            "', not a step folder name; delete it to fall back to the newest step folder"));
  return name;
}

// Picks the step folder inside a checkpoints folder: `latest`, else the newest step folder
// (a crash between renaming the folder and writing `latest` leaves a complete folder behind).
fs::path resolve_in_root(const fs::path& root) {
  std::error_code ec;
  if (fs::exists(root / "latest", ec)) {
    const fs::path dir = root / latest_name(root);
    if (!fs::is_directory(dir, ec))
      throw IoError(str("checkpoint: ", (root / "latest").string(), " names ",
                        dir.filename().string(),
                        ", which does not exist; pass one of the step "
                        "folders in ",
                        root.string(), " instead"));
    return dir;
  }
  auto dirs = step_dirs(root);
  if (dirs.empty())
    throw IoError(str("checkpoint: ", root.string(),
                      " holds no committed checkpoint (no `latest` "
                      "and no step-N folder); train with checkpointing on first"));
  return root / dirs.front().second;
}

// Renames the finished temporary folder to its final name. If that name is taken (the same
// step saved again), the two are swapped atomically so the name never points at nothing.
void commit_dir(const fs::path& tmp, const fs::path& final_dir) {
  std::error_code ec;
  if (!fs::exists(final_dir, ec)) {
    if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
      detail::io_fail("renaming into", final_dir.string(), errno);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now holds the replaced checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) detail::io_fail("replacing", final_dir.string(), errno);
  // No atomic exchange on this file system: a crash here loses only this step's old copy.
  fs::remove_all(final_dir, ec);
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    detail::io_fail("renaming into", final_dir.string(), errno);
}

// Deletes step folders beyond the newest keep_last, never `keep` (the folder just written,
// which `latest` names by now), and the temporary leftovers of writers no longer alive.
void prune(const fs::path& root, int keep_last, const std::string& keep) {
  std::error_code ec;
  if (keep_last > 0) {
    auto dirs = step_dirs(root);
    for (size_t i = static_cast<size_t>(keep_last); i < dirs.size(); ++i) {
      const std::string& name = dirs[i].second;
      if (name == keep) continue;
      fs::remove_all(root / name, ec);
      if (ec) log_warn("checkpoint: could not delete ", (root / name).string(), ": ", ec.message());
    }
  }
  std::vector<fs::path> stale;  // collected first: deleting while listing may skip entries
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const long pid = tmp_owner(it->path().filename().string());
    if (pid <= 0 || pid == ::getpid()) continue;
    // kill(pid, 0) probes for existence; only a definite "no such process" marks it stale.
    // Linux pids never exceed 2^22, so larger numbers cannot belong to a live writer.
    if (pid > (1L << 22) || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH))
      stale.push_back(it->path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

// ---- writing ----

std::string shard_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "shard-%05d.safetensors", rank);
  return buf;
}

// A new file whose bytes are hashed as they are written: what write_shard reports.
class HashedFile {
 public:
  explicit HashedFile(const std::string& path) : fd_(path, O_WRONLY | O_CREAT | O_TRUNC) {
    if (!fd_.ok()) detail::io_fail("creating", path, errno);
  }
  void write(const void* data, size_t n) {
    detail::write_all(fd_, data, n);
    sha_.update(data, n);
    bytes_ += static_cast<int64_t>(n);
  }
  ShardFile finish(const std::string& name) {  // fsyncs and closes
    detail::fsync_fd(fd_);
    fd_.close_checked();
    return {name, bytes_, sha_.hex_digest()};
  }

 private:
  detail::Fd fd_;
  Sha256 sha_;
  int64_t bytes_ = 0;
};

// Writer `rank`'s non-empty slices ordered by tensor and begin, after checking each slice and
// that slices of one tensor do not overlap.
std::vector<const ShardSlice*> sorted_slices(const std::vector<ShardSlice>& slices, int rank) {
  std::vector<const ShardSlice*> out;
  for (const ShardSlice& s : slices) {
    const std::string who =
        str("checkpoint: slice '", s.name, "' at ", s.begin, " of writer ", rank);
    if (s.name.empty())
      throw InvalidArgument(str(who, " has an empty tensor name; name every slice"));
    if (!s.data.defined() || s.data.dtype() != DType::kF32 || s.data.ndim() != 1)
      throw InvalidArgument(
          str(who, " must hold 1-D f32 data, got ",
              s.data.defined() ? str(dtype_name(s.data.dtype()), " ", shape_str(s.data.shape()))
                               : std::string("an undefined tensor"),
              "; pass a flat f32 view (reshape({-1}))"));
    if (s.begin < 0 || s.data.numel() > kMaxInt64 - s.begin)
      throw InvalidArgument(str(who, " has an invalid begin, got ", s.begin,
                                "; pass the slice's offset in the flattened tensor"));
    if (s.data.numel() > 0) out.push_back(&s);
  }
  std::sort(out.begin(), out.end(), [](const ShardSlice* a, const ShardSlice* b) {
    return a->name != b->name ? a->name < b->name : a->begin < b->begin;
  });
  for (size_t i = 1; i < out.size(); ++i) {
    const ShardSlice& a = *out[i - 1];
    const ShardSlice& b = *out[i];
    if (a.name == b.name && a.begin + a.data.numel() > b.begin)
      throw InvalidArgument(str("checkpoint: slices of '", a.name, "' overlap in writer ", rank,
                                ", got [", a.begin, ", ", a.begin + a.data.numel(), ") and [",
                                b.begin, ", ", b.begin + b.data.numel(),
                                "); give each element of a tensor to one slice"));
  }
  return out;
}

}  // namespace

void fsync_dir(const std::string& dir) {
  detail::Fd fd(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) detail::io_fail("opening folder", dir, errno);
  detail::fsync_fd(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  const std::string tmp = str(path, ".tmp-", ::getpid());
  try {
    detail::write_file_durable(tmp, bytes);
    if (::rename(tmp.c_str(), path.c_str()) != 0) detail::io_fail("renaming into", path, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(fs::path(path).parent_path().string());
}

std::string begin_checkpoint(const std::string& run_dir, int64_t step) {
  if (step < 0) throw InvalidArgument(str("checkpoint: step must be >= 0, got ", step));
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) detail::io_fail("creating folder", root.string(), ec.value());
  const fs::path tmp = root / str(step_dir_name(step), ".tmp-", ::getpid());
  fs::remove_all(tmp, ec);  // our own leftover from an earlier failed attempt
  if (!fs::create_directory(tmp, ec) || ec)
    detail::io_fail("creating folder", tmp.string(), ec.value());
  return tmp.string();
}

ShardFile write_shard(const std::string& dir, int rank, const std::vector<ShardSlice>& slices) {
  if (rank < 0) throw InvalidArgument(str("checkpoint: writer rank must be >= 0, got ", rank));
  const std::vector<const ShardSlice*> sorted = sorted_slices(slices, rank);
  if (sorted.empty()) return {};  // nothing to save: no file, and commit skips the entry
  std::vector<TensorInfo> tensors;
  // key -> {"name", "begin"}, so that readers never parse keys
  std::vector<std::pair<std::string, std::string>> meta;
  for (const ShardSlice* s : sorted) {
    const std::string key = str(s->name, "@", s->begin);
    tensors.push_back({key, DType::kF32, {s->data.numel()}});
    meta.emplace_back(key, Json{{"name", s->name}, {"begin", s->begin}}.dump());
  }
  const std::string name = shard_name(rank);
  const std::string path = (fs::path(dir) / name).string();
  try {
    HashedFile out(path);
    const std::string header = detail::safetensors_header(tensors, meta, path);
    out.write(header.data(), header.size());
    for (const ShardSlice* s : sorted) out.write(s->data.raw(), s->data.nbytes());
    return out.finish(name);
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
}

std::string commit_checkpoint(const std::string& run_dir, const std::string& dir, int64_t step,
                              const Manifest& manifest, const std::string& trainer_json,
                              int keep_last) {
  if (step < 0) throw InvalidArgument(str("checkpoint: step must be >= 0, got ", step));
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const std::string name = step_dir_name(step);
  fs::path tmp(dir);
  if (!tmp.has_filename()) tmp = tmp.parent_path();  // "…/step-N.tmp-1/"
  std::error_code ec;
  if (!fs::is_directory(tmp, ec))
    throw IoError(str("checkpoint: ", dir, " is not a folder; commit the folder that ",
                      "begin_checkpoint returned, before anything removes it"));
  if (tmp.filename().string().rfind(name + ".tmp-", 0) != 0 ||
      !fs::equivalent(tmp.parent_path(), root, ec))
    throw InvalidArgument(str("checkpoint: commit of step ", step, " needs the folder ",
                              "begin_checkpoint(run_dir, ", step, ") returned, ",
                              (root / name).string(), ".tmp-<pid>, got ", dir));
  const fs::path final_dir = root / name;
  try {
    const std::string text = detail::manifest_text(manifest, trainer_json, tmp);
    detail::write_file_durable((tmp / kTrainer).string(), trainer_json);
    detail::write_file_durable((tmp / kManifest).string(), text);
    fsync_dir(tmp.string());
    commit_dir(tmp, final_dir);
    fsync_dir(root.string());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  write_file_atomic((root / "latest").string(), name + "\n");
  prune(root, keep_last, name);
  return final_dir.string();
}

std::string resolve_checkpoint_dir(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec))
    throw IoError(str("checkpoint: ", path,
                      " does not exist; pass a run folder, its "
                      "checkpoints folder or one step folder"));
  if (!fs::is_directory(p, ec))
    throw IoError(str("checkpoint: ", path,
                      " is not a folder; pass a run folder, its "
                      "checkpoints folder or one step folder"));
  if (fs::is_directory(p / "checkpoints", ec)) return resolve_in_root(p / "checkpoints").string();
  int64_t step = 0;
  if (fs::exists(p / kManifest, ec)) return p.string();
  if (parse_step_dir(p.filename().string(), &step)) return p.string();
  if (fs::exists(p / "latest", ec) || !step_dirs(p).empty()) return resolve_in_root(p).string();
  throw IoError(str("checkpoint: ", path,
                    " holds no checkpoint (no checkpoints/, latest, "
                    "step-N folder or manifest.json); pass the run folder that training "
                    "wrote or one of its step folders"));
}

std::vector<std::string> checkpoint_candidates(const std::string& path) {
  const std::string first = resolve_checkpoint_dir(path);
  std::vector<std::string> out = {first};
  if (first == path) return out;  // a step folder: resolved to itself
  const fs::path root = fs::path(first).parent_path();
  for (const auto& [step, name] : step_dirs(root))
    if ((root / name).string() != first) out.push_back((root / name).string());
  return out;
}

}  // namespace tessel::ckpt
