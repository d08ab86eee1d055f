// The Engine's view of the model's state for checkpoints and the parameter digest: who owns
// which elements, and moving them to disk or to rank 0 without any rank holding the model.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "tessel/core/log.h"
#include "tessel/core/sha256.h"
#include "tessel/core/trace.h"
#include "tessel/parallel/engine.h"

namespace tessel::parallel {

namespace {

constexpr int kDigestTag = 201;  // params_sha256: owned ranges on their way to rank 0

// Every rank's owned ranges, sorted by start, with their owner: gathered over `group`.
struct Owned {
  nn::Range range;
  int rank;
};
std::vector<Owned> all_owned(comm::Communicator& group, const std::vector<nn::Range>& mine) {
  std::vector<int64_t> words;
  for (const nn::Range& r : mine) words.insert(words.end(), {r.lo, r.hi});
  std::vector<int64_t> counts(static_cast<size_t>(group.size()));
  const int64_t n = static_cast<int64_t>(words.size());
  group.allgather(&n, counts.data(), 1, comm::ElemType::kI64);
  std::vector<size_t> sizes(counts.begin(), counts.end());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int64_t> all(static_cast<size_t>(total));
  group.allgather(words.data(), all.data(), sizes, comm::ElemType::kI64);
  std::vector<Owned> out;
  size_t at = 0;
  for (int r = 0; r < group.size(); ++r)
    for (int64_t k = 0; k < counts[static_cast<size_t>(r)]; k += 2, at += 2)
      out.push_back({{all[at], all[at + 1]}, r});
  std::sort(out.begin(), out.end(),
            [](const Owned& a, const Owned& b) { return a.range.lo < b.range.lo; });
  return out;
}

// The runs of arena range r that this rank writes and hashes: tensor-parallel replicas are
// left to their group's rank 0.
std::vector<nn::Run> counted_runs(const nn::Model& model, nn::Range r) {
  std::vector<nn::Run> runs = model.runs(r);
  std::erase_if(runs,
                [&](const nn::Run& run) { return model.parameters()[run.param]->split.replica; });
  return runs;
}

}  // namespace

std::vector<ckpt::ShardSlice> state_slices(const StateView& view, const nn::Model& model) {
  std::vector<ckpt::ShardSlice> slices;
  for (const nn::Range& r : view.owned)
    for (const nn::Run& run : counted_runs(model, r)) {
      const std::string& name = model.parameters()[run.param]->name;
      const nn::Range o{run.local, run.local + run.count};
      Tensor values = Tensor::empty({run.count});
      std::copy_n(view.values(o), run.count, values.data<float>());
      slices.push_back({name, run.logical, values});
      for (const optim::StateBuffer& buf : view.optimizer->state()) {
        Tensor state = buf.values.view(view.state_offset(o), {run.count});
        if (state.device() != Device::kCpu) state = state.to_device(Device::kCpu);  // read back
        slices.push_back({buf.name + "/" + name, run.logical, state});
      }
    }
  slices.insert(slices.end(), view.extra.begin(), view.extra.end());
  return slices;
}

ckpt::ShardFile write_state_shard(const std::string& dir, int rank, const StateView& view,
                                  const nn::Model& model) {
  TraceSpan span("write shard", "checkpoint");
  return ckpt::write_shard(dir, rank, state_slices(view, model));
}

namespace {
std::string compression_slice(int rank) { return str("compress/rank", rank); }
}  // namespace

std::vector<float> Engine::compression_state() {
  std::vector<float> state = sync_ ? sync_->save_state() : std::vector<float>{};
  return state.empty() ? store_->save_state() : state;
}

StateView Engine::state() {
  StateView view = store_->state(optimizer_.get());
  // Residuals differ per rank: every rank writes its own.
  if (const std::vector<float> s = compression_state(); !s.empty()) {
    Tensor t = Tensor::empty({static_cast<int64_t>(s.size())});
    std::copy(s.begin(), s.end(), t.data<float>());
    view.extra.push_back({compression_slice(rank()), 0, t});
  }
  return view;
}

void Engine::restore_compression(const ckpt::CheckpointSource& reader) {
  if (compression_state().empty()) return;
  const std::string name = compression_slice(rank());
  float n = 0;  // the state's first value is its length
  try {
    reader.read(name, 0, 1, &n);
  } catch (const IoError&) {
    log_warn("compress: ", reader.dir(), " holds no compression state for rank ", rank(),
             " (saved without compression or by fewer ranks); residuals start from zero");
    return;
  }
  std::vector<float> state(static_cast<size_t>(n));
  reader.read(name, 0, static_cast<int64_t>(state.size()), state.data());
  if (sync_ && !sync_->save_state().empty())
    sync_->load_state(state);
  else
    store_->load_state(state);
}

std::vector<ckpt::ShardFile> Engine::write_shards(const std::string& dir,
                                                  int64_t* optimizer_steps) {
  comm::Communicator& workers = mesh_.workers();
  std::string path = dir;
  int64_t n = static_cast<int64_t>(path.size());
  workers.broadcast(&n, 1, comm::ElemType::kI64, 0);
  path.resize(static_cast<size_t>(n));
  workers.broadcast(path.data(), path.size(), comm::ElemType::kU8, 0);
  const StateView view = state();
  const ckpt::ShardFile mine = write_state_shard(path, rank(), view, model_);
  // Rank 0 learns every shard's name, size and digest.
  const std::string text =
      nlohmann::json{{"file", mine.file}, {"bytes", mine.bytes}, {"sha256", mine.sha256}}.dump();
  std::vector<int64_t> lengths(static_cast<size_t>(workers.size()));
  const int64_t len = static_cast<int64_t>(text.size());
  workers.allgather(&len, lengths.data(), 1, comm::ElemType::kI64);
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::string all(total, ' ');
  workers.allgather(text.data(), all.data(), counts, comm::ElemType::kU8);
  double steps = view.optimizer ? static_cast<double>(view.optimizer->steps()) : -1;
  max(&steps, 1);
  *optimizer_steps = static_cast<int64_t>(steps);
  std::vector<ckpt::ShardFile> out;
  if (!is_main()) return out;
  size_t at = 0;
  for (size_t c : counts) {
    const nlohmann::json j = nlohmann::json::parse(all.substr(at, c));
    at += c;
    out.push_back({j.at("file").get<std::string>(), j.at("bytes").get<int64_t>(),
                   j.at("sha256").get<std::string>()});
  }
  for (ckpt::ShardFile& f : store_->write_remote(path, optimizer_steps))
    out.push_back(std::move(f));
  return out;
}

std::string Engine::params_sha256() {
  // The owners stream their runs to rank 0 in the order of the whole model's arena (every
  // parameter whole, logical_offset), which hashes them with zeros for the padding between:
  // the bytes of the whole arena, as one process would hold it.
  comm::Communicator& workers = mesh_.workers();
  Sha256 sha;
  int64_t at = 0;
  std::vector<float> buf;
  auto feed = [&](nn::Range r, const float* values) {
    buf.assign(static_cast<size_t>(std::max<int64_t>(r.lo - at, 0)), 0.0f);
    sha.update(buf.data(), buf.size() * sizeof(float));
    sha.update(values, static_cast<size_t>(r.size()) * sizeof(float));
    at = r.hi;
  };
  // This rank's runs as (place in the whole arena, first element in this rank's arena), in
  // the order all_owned lists them; then what lives outside the training ranks.
  const StateView view = state();
  std::vector<std::pair<nn::Range, int64_t>> mine;
  for (const nn::Range& r : view.owned)
    for (const nn::Run& run : counted_runs(model_, r)) {
      const int64_t lo = model_.logical_offset(run.param) + run.logical;
      mine.push_back({{lo, lo + run.count}, run.local});
    }
  std::sort(mine.begin(), mine.end(),
            [](const auto& a, const auto& b) { return a.first.lo < b.first.lo; });
  std::vector<nn::Range> logical;
  for (const auto& m : mine) logical.push_back(m.first);
  size_t next = 0;  // this rank's next run
  auto take = [&](nn::Range l) {
    const int64_t at_local = mine[next++].second;
    return view.values({at_local, at_local + l.size()});
  };
  for (const Owned& o : all_owned(workers, logical)) {
    if (o.rank == rank() && !is_main())
      workers.send(take(o.range), static_cast<size_t>(o.range.size()), comm::ElemType::kF32, 0,
                   kDigestTag);
    if (!is_main()) continue;
    std::vector<float> values(static_cast<size_t>(o.range.size()));
    if (o.rank == 0)
      std::copy_n(take(o.range), values.size(), values.data());
    else
      workers.recv(values.data(), values.size(), comm::ElemType::kF32, o.rank, kDigestTag);
    feed(o.range, values.data());
  }
  if (is_main()) store_->read_remote(feed);
  std::string hex(64, '0');
  if (is_main()) {
    const std::vector<float> tail(
        static_cast<size_t>(std::max<int64_t>(model_.logical_numel() - at, 0)), 0.0f);
    sha.update(tail.data(), tail.size() * sizeof(float));
    hex = sha.hex_digest();
  }
  workers.broadcast(hex.data(), hex.size(), comm::ElemType::kU8, 0);
  return hex;
}

}  // namespace tessel::parallel
