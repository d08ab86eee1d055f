// Checkpoint folders with crash-safe commits. The invariant: `latest` always names a complete,
// fsynced step folder. Writers build a private "<name>.tmp-<pid>" folder, make it durable, and
// only then rename it into place and move `latest`; readers never look at ".tmp-" names.
#include "tessel/ckpt/checkpoint.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "posix_io.h"
#include "tessel/core/log.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "trainer.json"};

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

std::string read_text(const fs::path& path) {
  detail::Fd fd(path.string(), O_RDONLY);
  if (!fd.ok())
    throw IoError(str("checkpoint: cannot open ", path.string(), ": ", std::strerror(errno),
                      "; check the path"));
  std::string out;
  char buf[1 << 16];
  for (off_t at = 0;;) {
    ssize_t r = ::pread(fd.get(), buf, sizeof buf, at);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) detail::io_fail("reading", path.string(), errno);
    if (r == 0) return out;
    out.append(buf, static_cast<size_t>(r));
    at += r;
  }
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
  std::string name = read_text(root / "latest");
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

std::string save_checkpoint(const std::string& run_dir, int64_t step, const Checkpoint& ckpt,
                            int keep_last) {
  if (step < 0) throw InvalidArgument(str("checkpoint: step must be >= 0, got ", step));
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) detail::io_fail("creating folder", root.string(), ec.value());
  const std::string name = step_dir_name(step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / str(name, ".tmp-", ::getpid());

  fs::remove_all(tmp, ec);  // our own leftover from an earlier failed attempt
  if (!fs::create_directory(tmp, ec) || ec)
    detail::io_fail("creating folder", tmp.string(), ec.value());
  try {
    write_safetensors((tmp / kFiles[0]).string(), ckpt.model);
    write_safetensors((tmp / kFiles[1]).string(), ckpt.optimizer);
    detail::write_file_durable((tmp / kFiles[2]).string(), ckpt.trainer_json);
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
  for (const char* f : kFiles)
    if (fs::exists(p / f, ec)) return p.string();
  if (parse_step_dir(p.filename().string(), &step)) return p.string();
  if (fs::exists(p / "latest", ec) || !step_dirs(p).empty()) return resolve_in_root(p).string();
  throw IoError(str("checkpoint: ", path,
                    " holds no checkpoint (no checkpoints/, latest, "
                    "step-N folder or model.safetensors); pass the run folder that training "
                    "wrote or one of its step folders"));
}

Checkpoint load_checkpoint(const std::string& path) {
  const fs::path dir = resolve_checkpoint_dir(path);
  std::error_code ec;
  for (const char* f : kFiles)
    if (!fs::is_regular_file(dir / f, ec))
      throw IoError(str("checkpoint: ", (dir / f).string(),
                        " is missing; the checkpoint is "
                        "incomplete, pass another step folder"));
  Checkpoint out;
  out.model = read_safetensors((dir / kFiles[0]).string());
  out.optimizer = read_safetensors((dir / kFiles[1]).string());
  out.trainer_json = read_text(dir / kFiles[2]);
  return out;
}

}  // namespace tessel::ckpt
