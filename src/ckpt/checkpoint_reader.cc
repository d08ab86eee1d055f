// Reading a committed checkpoint: CheckpointReader checks every file of the step folder against
// manifest.json before any tensor is read, indexes the slices of every shard file by tensor, and
// then serves any element range of any tensor from whichever shards hold it. export_model
// streams the parameters whole into one plain safetensors file.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "manifest.h"
#include "posix_io.h"
#include "safetensors_header.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/sha256.h"

namespace tessel::ckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;  // as the writer's, for a slice's {"name", "begin"}
using detail::corrupt_file;
using detail::kManifest;
using detail::kTrainer;

constexpr size_t kChunkBytes = 4 << 20;  // buffer for hashing and exporting
constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

// A file of the step folder, which must be there.
std::string read_part(const fs::path& dir, const char* name) {
  std::error_code ec;
  if (fs::is_regular_file(dir / name, ec)) return detail::read_text((dir / name).string());
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

struct CheckpointReader::Piece {
  int64_t begin, end;  // elements of the tensor
  size_t file;         // index into files_
  std::string key;     // the slice's name in that file
};

CheckpointReader::CheckpointReader(const std::string& path) : dir_(resolve_checkpoint_dir(path)) {
  const fs::path dir(dir_);
  ShardFile trainer;
  manifest_ =
      detail::parse_manifest((dir / kManifest).string(), read_part(dir, kManifest), &trainer);
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
    std::vector<TensorInfo> tensors;
    for (const TensorSpec& p : params) tensors.push_back({p.name, DType::kF32, p.shape});
    const std::string header = detail::safetensors_header(tensors, {{"format", "pt"}}, out_path);
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
