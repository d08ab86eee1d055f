// Checkpoint folders with crash-safe commits. The invariant: `latest` always names a complete,
// fsynced step folder. Writers build a private "<name>.tmp-<pid>" folder, make it durable, and
// only then rename it into place and move `latest`; readers never look at ".tmp-" names.
// Integrity: manifest.json records the size and SHA-256 of every other file in the folder and
// the SHA-256 of its own content, so a flipped bit anywhere in a step folder fails the load.
#include "tessel/ckpt/checkpoint.h"

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "posix_io.h"
#include "tessel/core/log.h"
#include "tessel/core/sha256.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // keeps fields in written order, which the self-hash needs

constexpr const char* kManifest = "manifest.json";
constexpr const char* kTrainer = "trainer.json";
constexpr const char* kFormat = "tessel-sharded";
constexpr const char* kSelfHash = "manifest_sha256";
constexpr size_t kChunkBytes = 4 << 20;  // buffer for hashing and exporting
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

// ---- writing ----

std::string shard_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "shard-%05d.safetensors", rank);
  return buf;
}

// A plain file name inside the step folder: no separators, no "." or "..".
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The SHA-256 of a manifest without its kSelfHash field, dumped compactly. The reader
// recomputes it from the parsed object, so any change of content fails the check.
std::string self_sha256(const Json& body) {
  const std::string text = body.dump();
  return sha256_hex(text.data(), text.size());
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

// The head (8-byte length, JSON padded with spaces to 8 bytes) of a safetensors file holding
// f32 tensors of these names and shapes back to back, in this order. Lets a writer stream data
// it never holds whole, which write_safetensors (given every tensor) cannot. Names are unique.
std::string f32_header(const std::vector<TensorSpec>& tensors, const Json& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(t.shape)) * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception&) {
    throw InvalidArgument("checkpoint: a tensor name is not valid UTF-8; use UTF-8 names");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{text.size()} >> (8 * i));
  return out + text;
}

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

Json parameters_json(const std::vector<TensorSpec>& parameters) {
  Json out = Json::array();
  std::set<std::string> names;
  for (const TensorSpec& p : parameters) {
    if (p.name.empty() || !names.insert(p.name).second)
      throw InvalidArgument(str("checkpoint: manifest parameter name '", p.name,
                                "' is empty or repeated; name each parameter once"));
    if (std::any_of(p.shape.begin(), p.shape.end(), [](int64_t d) { return d < 0; }))
      throw InvalidArgument(str("checkpoint: manifest parameter '", p.name, "' has shape ",
                                shape_str(p.shape), "; dimensions must be >= 0"));
    out.push_back({{"name", p.name}, {"shape", p.shape}});
  }
  return out;
}

// The manifest's shard list without the entries of writers that wrote nothing, after checking
// that every file is in `dir` with the size write_shard reported: a writer that wrote into a
// folder the committing rank does not see fails here, not at the next resume.
Json shards_json(const std::vector<ShardFile>& shards, const fs::path& dir) {
  Json out = Json::array();
  std::set<std::string> files = {kManifest, kTrainer};
  for (const ShardFile& s : shards) {
    if (s.file.empty()) continue;
    if (!plain_name(s.file) || !files.insert(s.file).second || !is_sha256_hex(s.sha256))
      throw InvalidArgument(str("checkpoint: manifest shard entry '", s.file, "' (sha256 '",
                                s.sha256, "') is not a unique plain file name with a SHA-256; ",
                                "pass the ShardFiles that write_shard returned"));
    std::error_code ec;
    const uintmax_t size = fs::file_size(dir / s.file, ec);
    if (ec || size != static_cast<uintmax_t>(s.bytes))
      throw IoError(str("checkpoint: shard file ", (dir / s.file).string(),
                        ec ? std::string(" is missing") : str(" has ", size, " bytes"),
                        ", expected ", s.bytes, " bytes; every writer must write_shard into ",
                        "the folder begin_checkpoint returned, on storage this rank sees"));
    out.push_back({{"file", s.file}, {"bytes", s.bytes}, {"sha256", s.sha256}});
  }
  return out;
}

// manifest.json's text (see checkpoint.h), with the size and SHA-256 of trainer.json and the
// SHA-256 of the manifest itself.
std::string manifest_text(const Manifest& m, const std::string& trainer_json, const fs::path& dir) {
  if (m.optimizer_steps < 0)
    throw InvalidArgument(
        str("checkpoint: manifest optimizer_steps must be >= 0, got ", m.optimizer_steps));
  std::set<std::string> buffers;
  for (const std::string& b : m.state_buffers)
    if (b.empty() || !buffers.insert(b).second)
      throw InvalidArgument(str("checkpoint: manifest state buffer '", b,
                                "' is empty or repeated; name each buffer once"));
  Json body = {{"format", kFormat},
               {"version", Manifest::kVersion},
               {"model_kind", m.model_kind},
               {"parameters", parameters_json(m.parameters)},
               {"optimizer",
                {{"kind", m.optimizer_kind},
                 {"steps", m.optimizer_steps},
                 {"state_buffers", m.state_buffers}}},
               {"shards", shards_json(m.shards, dir)},
               {"trainer",
                {{"bytes", trainer_json.size()},
                 {"sha256", sha256_hex(trainer_json.data(), trainer_json.size())}}}};
  try {
    const std::string self = self_sha256(body);
    body[kSelfHash] = self;
    return body.dump(2) + "\n";
  } catch (const Json::exception&) {
    throw InvalidArgument(
        "checkpoint: a manifest name or kind is not valid UTF-8; use UTF-8 names");
  }
}

// ---- reading ----

[[noreturn]] void corrupt_file(const std::string& path, const std::string& defect) {
  throw IoError(str("checkpoint: ", path, " ", defect,
                    "; the file is corrupt: resume from an older checkpoint"));
}

// One value of manifest.json with its name there, e.g. "parameters[2].shape".
struct Field {
  const Json& v;
  std::string name;
};

// Typed access to manifest.json: any defect is an IoError naming the file and the field.
class Fields {
 public:
  explicit Fields(std::string path) : path_(std::move(path)) {}
  [[noreturn]] void bad(const std::string& field, const std::string& defect) const {
    corrupt_file(path_, str("has field \"", field, "\" ", defect));
  }
  Field at(const Field& obj, const char* key) const {
    const std::string name = obj.name.empty() ? key : obj.name + "." + key;
    if (!obj.v.is_object() && obj.name.empty()) corrupt_file(path_, "is not a JSON object");
    if (!obj.v.is_object()) bad(obj.name, "that is not a JSON object");
    const auto it = obj.v.find(key);
    if (it == obj.v.end()) bad(name, "missing");
    return {*it, name};
  }
  Field item(const Field& array, size_t i) const {
    return {array.v[i], str(array.name, "[", i, "]")};
  }
  size_t size(const Field& f) const {
    if (!f.v.is_array()) bad(f.name, "that is not an array");
    return f.v.size();
  }
  std::string text(const Field& f) const {
    if (!f.v.is_string()) bad(f.name, "that is not a string");
    return f.v.get<std::string>();
  }
  int64_t count(const Field& f) const {  // a non-negative integer
    if (f.v.is_number_unsigned() ? f.v.get<uint64_t>() > uint64_t{kMaxInt64}
                                 : !f.v.is_number_integer() || f.v.get<int64_t>() < 0)
      bad(f.name, str("that is not a non-negative integer, got ", f.v.dump()));
    return f.v.get<int64_t>();
  }

 private:
  std::string path_;
};

std::vector<TensorSpec> parse_parameters(const Fields& f, const Field& params) {
  std::vector<TensorSpec> out;
  std::set<std::string> names;
  for (size_t i = 0; i < f.size(params); ++i) {
    const Field p = f.item(params, i);
    TensorSpec spec{f.text(f.at(p, "name")), {}};
    if (spec.name.empty() || !names.insert(spec.name).second)
      f.bad(p.name + ".name", str("that is empty or repeated, got '", spec.name, "'"));
    const Field shape = f.at(p, "shape");
    int64_t numel = 1;
    for (size_t k = 0; k < f.size(shape); ++k) {
      spec.shape.push_back(f.count(f.item(shape, k)));
      if (__builtin_mul_overflow(numel, spec.shape.back(), &numel))
        f.bad(shape.name, "with more elements than fit in 64 bits");
    }
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<ShardFile> parse_shards(const Fields& f, const Field& shards) {
  std::vector<ShardFile> out;
  std::set<std::string> files = {kManifest, kTrainer};
  for (size_t i = 0; i < f.size(shards); ++i) {
    const Field s = f.item(shards, i);
    ShardFile file{f.text(f.at(s, "file")), f.count(f.at(s, "bytes")), f.text(f.at(s, "sha256"))};
    if (!plain_name(file.file) || !files.insert(file.file).second)
      f.bad(s.name + ".file",
            str("that is not a plain file name of its own, got '", file.file, "'"));
    if (!is_sha256_hex(file.sha256)) f.bad(s.name + ".sha256", "that is not 64 hex digits");
    out.push_back(std::move(file));
  }
  return out;
}

// Parses and checks manifest.json; `trainer` receives trainer.json's recorded size and hash.
Manifest parse_manifest(const std::string& path, const std::string& text, ShardFile* trainer) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    corrupt_file(path, str("is not valid JSON (error at byte ", e.byte, ")"));
  }
  const Fields f(path);
  const Field root{j, ""};
  const std::string format = f.text(f.at(root, "format"));
  if (format != kFormat) f.bad("format", str("that is '", format, "', not '", kFormat, "'"));
  const int64_t version = f.count(f.at(root, "version"));
  if (version > Manifest::kVersion)
    throw IoError(str("checkpoint: ", path, " has version ", version, ", newer than the ",
                      Manifest::kVersion, " this tessel reads; resume with a newer tessel"));
  if (version < 1) f.bad("version", str("that no tessel wrote, got ", version));
  // Checked before the other fields, so that a flipped bit reads as what it is.
  const std::string recorded = f.text(f.at(root, kSelfHash));
  Json body = j;
  body.erase(kSelfHash);
  if (self_sha256(body) != recorded)
    corrupt_file(path, "does not match the SHA-256 it records of its own content");

  Manifest m;
  m.model_kind = f.text(f.at(root, "model_kind"));
  m.parameters = parse_parameters(f, f.at(root, "parameters"));
  const Field opt = f.at(root, "optimizer");
  m.optimizer_kind = f.text(f.at(opt, "kind"));
  m.optimizer_steps = f.count(f.at(opt, "steps"));
  const Field buffers = f.at(opt, "state_buffers");
  for (size_t i = 0; i < f.size(buffers); ++i) {
    m.state_buffers.push_back(f.text(f.item(buffers, i)));
    if (m.state_buffers.back().empty() ||
        std::count(m.state_buffers.begin(), m.state_buffers.end(), m.state_buffers.back()) > 1)
      f.bad(f.item(buffers, i).name, "that is empty or repeated");
  }
  m.shards = parse_shards(f, f.at(root, "shards"));
  const Field t = f.at(root, "trainer");
  *trainer = {kTrainer, f.count(f.at(t, "bytes")), f.text(f.at(t, "sha256"))};
  return m;
}

// A file of the step folder, which must be there.
std::string read_part(const fs::path& dir, const char* name) {
  std::error_code ec;
  if (fs::is_regular_file(dir / name, ec)) return read_text(dir / name);
  if (fs::exists(dir / "model.safetensors", ec))
    throw IoError(str("checkpoint: ", dir.string(),
                      " holds a checkpoint of the format before sharded checkpoints "
                      "(model.safetensors, no manifest.json), which this tessel does not read; "
                      "resume it with the tessel that wrote it"));
  throw IoError(str("checkpoint: ", (dir / name).string(),
                    " is missing; the checkpoint is incomplete, pass another step folder"));
}

void expect_digest(const std::string& path, int64_t bytes, const std::string& sha256,
                   const ShardFile& recorded) {
  if (bytes != recorded.bytes)
    corrupt_file(path, str("has ", bytes, " bytes, manifest.json records ", recorded.bytes));
  if (sha256 != recorded.sha256)
    corrupt_file(path,
                 str("does not match the SHA-256 manifest.json records (got ", sha256.substr(0, 16),
                     "..., recorded ", recorded.sha256.substr(0, 16), "...)"));
}

// Checks a file's size, then streams it through SHA-256, against what manifest.json records.
void verify_file(const std::string& path, const ShardFile& recorded) {
  detail::Fd fd(path, O_RDONLY);
  if (!fd.ok())
    throw IoError(str("checkpoint: cannot open ", path, ": ", std::strerror(errno),
                      "; the checkpoint is incomplete: resume from an older checkpoint"));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) detail::io_fail("stat of", path, errno);
  if (st.st_size != recorded.bytes)
    corrupt_file(path, str("has ", st.st_size, " bytes, manifest.json records ", recorded.bytes));
  Sha256 sha;
  std::vector<char> buf(kChunkBytes);
  for (int64_t at = 0; at < recorded.bytes;) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(recorded.bytes - at, buf.size()));
    if (!detail::pread_all(fd, buf.data(), n, static_cast<off_t>(at)))
      corrupt_file(path, "shrank while being read");
    sha.update(buf.data(), n);
    at += static_cast<int64_t>(n);
  }
  expect_digest(path, recorded.bytes, sha.hex_digest(), recorded);
}

// One slice of a shard file as its metadata describes it (the key is never parsed).
struct SliceRef {
  std::string name, key;
  int64_t begin, end;
};

std::vector<SliceRef> shard_slices(const SafetensorsReader& f) {
  std::vector<SliceRef> out;
  for (const TensorInfo& t : f.tensors()) {
    const auto bad = [&](const char* defect) {
      corrupt_file(f.path(), str("has slice '", t.name, "' ", defect));
    };
    if (t.dtype != DType::kF32 || t.shape.size() != 1) bad("that is not 1-D F32");
    const auto meta = f.metadata().find(t.name);
    if (meta == f.metadata().end()) bad("without an entry in __metadata__");
    const Json m = Json::parse(meta->second, nullptr, /*allow_exceptions=*/false);
    const auto name = m.is_object() ? m.find("name") : m.end();
    const auto begin = m.is_object() ? m.find("begin") : m.end();
    if (name == m.end() || begin == m.end() || !name->is_string() ||
        name->get_ref<const std::string&>().empty() || !begin->is_number_integer() ||
        begin->get<int64_t>() < 0 || begin->get<int64_t>() > kMaxInt64 - t.shape[0])
      bad("whose __metadata__ entry is not {\"name\": tensor, \"begin\": element}");
    const int64_t first = begin->get<int64_t>();
    if (t.shape[0] > 0)
      out.push_back({name->get<std::string>(), t.name, first, first + t.shape[0]});
  }
  return out;
}

// Element counts of the tensors the manifest describes: parameters and their state buffers.
std::map<std::string, int64_t> described_sizes(const Manifest& m) {
  std::map<std::string, int64_t> out;
  for (const TensorSpec& p : m.parameters) {
    out[p.name] = shape_numel(p.shape);
    for (const std::string& b : m.state_buffers) out[b + "/" + p.name] = shape_numel(p.shape);
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
  std::vector<TensorSpec> tensors;
  Json meta = Json::object();  // key -> {"name", "begin"}, so that readers never parse keys
  for (const ShardSlice* s : sorted) {
    const std::string key = str(s->name, "@", s->begin);
    tensors.push_back({key, {s->data.numel()}});
    meta[key] = Json{{"name", s->name}, {"begin", s->begin}}.dump();
  }
  const std::string name = shard_name(rank);
  const std::string path = (fs::path(dir) / name).string();
  try {
    HashedFile out(path);
    const std::string header = f32_header(tensors, meta);
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
    const std::string text = manifest_text(manifest, trainer_json, tmp);
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

struct CheckpointReader::Piece {
  int64_t begin, end;  // elements of the tensor
  size_t file;         // index into files_
  std::string key;     // the slice's name in that file
};

CheckpointReader::CheckpointReader(const std::string& path) : dir_(resolve_checkpoint_dir(path)) {
  const fs::path dir(dir_);
  ShardFile trainer;
  manifest_ = parse_manifest((dir / kManifest).string(), read_part(dir, kManifest), &trainer);
  trainer_json_ = read_part(dir, kTrainer);
  expect_digest((dir / kTrainer).string(), static_cast<int64_t>(trainer_json_.size()),
                sha256_hex(trainer_json_.data(), trainer_json_.size()), trainer);
  for (const ShardFile& s : manifest_.shards) {
    const std::string file = (dir / s.file).string();
    verify_file(file, s);
    files_.push_back(std::make_unique<SafetensorsReader>(file));
    for (SliceRef& r : shard_slices(*files_.back()))
      index_[r.name].push_back(Piece{r.begin, r.end, files_.size() - 1, std::move(r.key)});
  }
  const std::map<std::string, int64_t> sizes = described_sizes(manifest_);
  for (auto& [name, pieces] : index_) {
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < pieces.size(); ++i)
      if (pieces[i - 1].end > pieces[i].begin)
        corrupt_file(dir_, str("holds elements [", pieces[i].begin, ", ",
                               std::min(pieces[i - 1].end, pieces[i].end), ") of tensor '", name,
                               "' twice, in ", files_[pieces[i - 1].file]->path(), " and ",
                               files_[pieces[i].file]->path()));
    const auto size = sizes.find(name);
    if (size != sizes.end() && pieces.back().end > size->second)
      corrupt_file(files_[pieces.back().file]->path(),
                   str("holds elements of '", name, "' up to ", pieces.back().end, ", beyond the ",
                       size->second, " its shape in manifest.json has"));
  }
}

CheckpointReader::~CheckpointReader() = default;

bool CheckpointReader::has(const std::string& name) const { return index_.count(name) > 0; }

void CheckpointReader::read(const std::string& name, int64_t begin, int64_t count,
                            float* dst) const {
  if (begin < 0 || count < 0 || count > kMaxInt64 - begin)
    throw InvalidArgument(str("checkpoint: reading tensor '", name, "' needs begin >= 0 and ",
                              "count >= 0, got begin ", begin, ", count ", count));
  const int64_t end = begin + count;
  int64_t at = begin;  // the first element not copied yet
  const auto it = index_.find(name);
  if (it == index_.end()) {
    if (count == 0) return;
    throw IoError(str("checkpoint: ", dir_, " holds no tensor '", name, "' (asked for elements [",
                      begin, ", ", end, "), first missing element ", begin,
                      "); check the name against manifest.json"));
  }
  // Pieces are sorted and disjoint, so their ends are sorted too: start at the first that ends
  // after `begin`, and copy while each piece starts where the previous one left off.
  const std::vector<Piece>& pieces = it->second;
  auto p = std::partition_point(pieces.begin(), pieces.end(),
                                [&](const Piece& x) { return x.end <= begin; });
  for (; at < end && p != pieces.end() && p->begin <= at; ++p) {
    const int64_t stop = std::min(end, p->end);
    files_[p->file]->read(p->key, at - p->begin, stop - at, dst + (at - begin));
    at = stop;
  }
  if (at < end) {
    const int64_t gap_end = p != pieces.end() ? std::min(end, p->begin) : end;
    throw IoError(str("checkpoint: tensor '", name, "' in ", dir_, " lacks elements [", at, ", ",
                      gap_end, ") (asked for [", begin, ", ", end, "), first missing element ", at,
                      "); no writer saved them: resume from a checkpoint that has them"));
  }
}

void export_model(const std::string& path, const std::string& out_path) {
  const CheckpointReader reader(path);
  const std::vector<TensorSpec>& params = reader.manifest().parameters;
  const std::string tmp = str(out_path, ".tmp-", ::getpid());
  try {
    detail::Fd out(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    if (!out.ok()) detail::io_fail("creating", tmp, errno);
    const std::string header = f32_header(params, Json{{"format", "pt"}});
    detail::write_all(out, header.data(), header.size());
    // Chunk by chunk: no parameter, however large, is ever in memory whole.
    std::vector<float> buf(kChunkBytes / sizeof(float));
    for (const TensorSpec& p : params) {
      const int64_t numel = shape_numel(p.shape);
      for (int64_t at = 0; at < numel;) {
        const int64_t n = std::min<int64_t>(numel - at, static_cast<int64_t>(buf.size()));
        reader.read(p.name, at, n, buf.data());
        detail::write_all(out, buf.data(), static_cast<size_t>(n) * sizeof(float));
        at += n;
      }
    }
    detail::fsync_fd(out);
    out.close_checked();
    if (::rename(tmp.c_str(), out_path.c_str()) != 0)
      detail::io_fail("renaming into", out_path, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(fs::path(out_path).parent_path().string());
}

}  // namespace tessel::ckpt
