#include "param_stores.h"

#include <algorithm>
#include <cstring>

#include "compress/codecs.h"
#include "offload.h"
#include "tessel/core/clock.h"
#include "tessel/core/error.h"
#include "tessel/ops/cpu.h"
#include "tessel/tensor/device.h"

namespace tessel::parallel {

namespace {

// The f32 master values: on the rank's device, or (host_masters: optimizer offload in bf16 |
// fp16) in pinned host memory, charged to optimizer_offloaded, where the optimizer steps them
// and from where checkpoints read them; the device then holds only a 16-bit copy.
Tensor master_memory(int64_t n, bool host_masters) {
  if (!host_masters) return flat_zeros(n, MemCategory::kParameters);
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float);
  auto pinned = std::make_shared<PinnedBuffer>(device_runtime(current_device()), bytes,
                                               MemCategory::kOptimizerOffloaded);
  Tensor values;
  {
    MemoryScope uncharged(nullptr, MemCategory::kOther);  // given back at once by rebind
    values = Tensor::empty({std::max<int64_t>(n, 1)});
  }
  values.storage().rebind(pinned->data(), pinned);
  return values;
}

// Values initialised on the host by init(float* host), then uploaded where they live on a device.
template <typename F>
void initialise(Tensor values, F&& init) {  // values shares the storage
  const Tensor host = values.device() == Device::kCpu ? values : Tensor::zeros({values.numel()});
  init(host.data<float>());
  if (host.raw() != values.raw()) values.copy_from(host);
}

std::vector<nn::Range> own_shards(const Units& units) {
  std::vector<nn::Range> out;
  for (const Unit& u : units.list)
    if (!units.own(u).empty()) out.push_back(units.own(u));
  return out;
}

// Whole units, adjacent ones merged.
std::vector<nn::Range> unit_ranges(const Units& units) {
  std::vector<nn::Range> out;
  for (const Unit& u : units.list) {
    if (!out.empty() && out.back().hi == u.range.lo)
      out.back().hi = u.range.hi;
    else
      out.push_back(u.range);
  }
  return out;
}

// Shards this rank writes to checkpoints: with shard groups, the first group's ranks only.
std::vector<nn::Range> written_shards(const Units& units, const comm::Communicator* across) {
  return across == nullptr || across->rank() == 0 ? own_shards(units) : std::vector<nn::Range>{};
}

// FNV-1a over the bytes, 8 at a time: cheap enough to run every few hundred steps, and any
// differing bit changes it.
int64_t checksum(const Tensor& t) {
  const auto* p = static_cast<const uint64_t*>(t.raw());
  const size_t words = t.nbytes() / 8;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < words; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

}  // namespace

// ---- ReplicatedStore ----

ReplicatedStore::ReplicatedStore(nn::Model& model, const Units& units, int stage,
                                 comm::Communicator& dp, comm::Communicator* across, uint64_t seed,
                                 int64_t check_every, comm::DeviceCollectives* device,
                                 bool host_masters)
    : units_(units),
      stage_(stage),
      check_every_(check_every),
      dp_(dp),
      across_(across),
      device_(device),
      values_(master_memory(units.span.size(), host_masters)) {
  host_masters_ = host_masters;
  initialise(values_, [&](float* host) {
    for (const Unit& u : units.list)
      model.init_values(host + (u.range.lo - units.span.lo), u.range, seed);
  });
  model.bind_values(units.span, values_);
  held_ = unit_ranges(units);
  owned_ = written_shards(units, across);
  update_ = stage == 0 ? held_ : own_shards(units);
}

float* ReplicatedStore::values(nn::Range r) {
  return values_.kernel_data<float>() + (r.lo - units_.span.lo);
}

void ReplicatedStore::update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
                             int64_t) {
  const double t0 = now_seconds();
  opt.step(segments(sync), lr, grad_scale);
  const double t1 = now_seconds();
  optimizer_s_ += t1 - t0;
  if (stage_ == 0 || dp_.size() == 1) return;
  // Every replica gets every rank's updated shard back, unit by unit, in place.
  for (size_t k = 0; k < units_.list.size(); ++k) {
    const Unit& u = units_.list[k];
    comm::CallOptions call;
    call.label = static_cast<uint32_t>(k + 1);
    float* unit = values(u.range);
    if (device_ && !host_masters_)
      device_->allgather(values(units_.own(u)), unit, u.counts, comm::ElemType::kF32, call).wait();
    else
      dp_.allgather(values(units_.own(u)), unit, u.counts, comm::ElemType::kF32, call);
    bytes_ += 4.0 * static_cast<double>(u.range.size());
  }
  refresh_working(false);
  gather_s_ += now_seconds() - t1;
}

void ReplicatedStore::copy_values(nn::Range r, float* dst) {
  const size_t bytes = static_cast<size_t>(r.size()) * sizeof(float);
  if (values_.device() == Device::kCpu)
    std::memcpy(dst, values(r), bytes);
  else  // the explicit read back of device values
    device_runtime(values_.device())
        .copy(dst, Device::kCpu, values(r), values_.device(), bytes, current_stream());
}

void ReplicatedStore::check_replicas(int64_t step) {
  if (dp_.size() == 1 && (across_ == nullptr || across_->size() == 1)) return;  // one replica
  // Within the group, then (shard groups) across them: together, every dp rank.
  const double mine = static_cast<double>(
      checksum(values_.device() == Device::kCpu ? values_ : values_.to_device(Device::kCpu)));
  for (comm::Communicator* group : {&dp_, across_}) {
    if (group == nullptr || group->size() == 1) continue;
    std::vector<double> sums(static_cast<size_t>(group->size()));
    group->allgather(&mine, sums.data(), 1, comm::ElemType::kF64);
    std::string differ;
    for (size_t r = 1; r < sums.size(); ++r)
      if (sums[r] != sums[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (!differ.empty())
      throw Error(str("data parallel: parameters differ across ranks at step ", step, ": ",
                      group == across_ ? "shard group(s) " : "data-parallel rank(s) ", differ,
                      " differ from ", group == across_ ? "group 0" : "rank 0",
                      "; every rank must start from the same seed and checkpoint (this is a bug "
                      "if they did)"));
  }
}

void ReplicatedStore::take_stats(RankStats& s) {
  s.optimizer_s += optimizer_s_;
  s.comm_exposed_s += gather_s_;
  s.comm_bytes += bytes_;
  optimizer_s_ = gather_s_ = bytes_ = 0;
}

// ---- ShardedStore ----

ShardedStore::ShardedStore(nn::Model& model, const Units& units, comm::Communicator& dp,
                           comm::Communicator* across, uint64_t seed, bool prefetch,
                           bool hold_for_step, DType type, comm::DeviceCollectives* device,
                           bool host_masters)
    : model_(model),
      units_(units),
      dp_(dp),
      device_(device),
      prefetch_(prefetch),
      hold_for_step_(hold_for_step),
      type_(type),
      shard_(master_memory(units.shard_numel, host_masters)),
      resident_(units.list.size()) {
  for (const Unit& u : units.list) buffer_numel_ = std::max(buffer_numel_, u.range.size());
  initialise(shard_, [&](float* host) {
    for (const Unit& u : units.list) model.init_values(host + u.shard_offset, units.own(u), seed);
  });
  if ((host_masters_ = host_masters)) {
    TESSEL_CHECK(type != DType::kF32, "zero: master values on the host need 16-bit gathers, got ",
                 dtype_name(type), " (this is a bug)");
    shard16_ = flat_zeros(units.shard_numel, MemCategory::kParameters, type);
    refresh_working(true);
  }
  update_ = held_ = own_shards(units);
  owned_ = written_shards(units, across);
}

ShardedStore::~ShardedStore() {
  for (Resident& r : resident_) {
    try {
      r.work.wait();
      r.device_work.wait();
    } catch (...) {  // the group failed; the error was reported where it happened
    }
  }
}

float* ShardedStore::values(nn::Range r) {
  for (const Unit& u : units_.list) {
    const nn::Range own = units_.own(u);
    if (!own.empty() && r.lo >= own.lo && r.hi <= own.hi)
      return shard_.kernel_data<float>() + u.shard_offset + (r.lo - own.lo);
  }
  throw Error(str("zero: range [", r.lo, ", ", r.hi, ") is not this rank's shard (this is a bug)"));
}

std::string ShardedStore::gather_name(int unit) const {
  return units_.describe(unit, model_) + str(" (label ", unit + 1, ")");
}

void ShardedStore::start_gather(int unit, bool async) {
  Resident& r = resident_[static_cast<size_t>(unit)];
  const Unit& u = units_.list[static_cast<size_t>(unit)];
  if (free_.empty()) {
    free_.push_back(flat_zeros(buffer_numel_, MemCategory::kComm, type_));
  }
  r.memory = std::move(free_.back());
  free_.pop_back();
  const float* shard = shard_.kernel_data<float>() + u.shard_offset;
  const void* in = shard;
  void* out = r.memory.raw();
  if (shard16_.defined()) {  // masters on the host: the device's 16-bit shard
    in = shard16_.view(u.shard_offset, {units_.own(u).size()}).raw();
  } else if (type_ !=
             DType::kF32) {  // this rank's shard rounded into its own block: gathered in place
    const nn::Range own = units_.own(u);
    void* block = r.memory.view(own.lo - u.range.lo, {own.size()}).raw();
    compress::convert_here(block, type_, shard, DType::kF32, own.size());
    in = block;
  }
  comm::CallOptions call;
  call.label = static_cast<uint32_t>(unit + 1);
  const comm::ElemType elem = comm::elem_type(type_);
  bytes_ += static_cast<double>(dtype_size(type_)) * static_cast<double>(u.range.size());
  if (async) {  // waited for in require() or release()
    if (device_)
      r.device_work = device_->allgather(in, out, u.counts, elem, call);
    else
      r.work = dp_.allgather_async(in, out, u.counts, elem, call);
  } else {
    const double t0 = now_seconds();
    if (device_)
      device_->allgather(in, out, u.counts, elem, call).wait();
    else
      dp_.allgather(in, out, u.counts, elem, call);
    wait_s_ += now_seconds() - t0;
  }
  model_.bind_values(u.range, r.memory);
}

void ShardedStore::release(int unit) {
  Resident& r = resident_[static_cast<size_t>(unit)];
  if (!r.memory.defined()) return;
  r.work.wait();
  r.device_work.wait();
  model_.bind_values(units_.list[static_cast<size_t>(unit)].range, Tensor());
  free_.push_back(std::move(r.memory));
  r.memory = Tensor();
  r.work = comm::Work();
  r.device_work = comm::NcclWork();
}

void ShardedStore::require(int unit, nn::Phase phase, size_t block) {
  Resident& r = resident_[static_cast<size_t>(unit)];
  if (!r.memory.defined()) {  // a gather now: the step's next one in the recorded order
    if (training_ && recorded_) {
      if (next_ >= order_.size() || order_[next_] != unit)
        throw Error(str("zero: rank ", dp_.rank(), " of the data-parallel group gathers ",
                        gather_name(unit), " for the ",
                        phase == nn::Phase::kBeforeForward ? "forward" : "backward", " of block '",
                        model_.block_name(block), "' as gather ", next_ + 1, " of step ",
                        steps_ + 1, ", but the first step's gather ", next_ + 1, " was ",
                        next_ < order_.size()
                            ? gather_name(order_[next_])
                            : std::string("none (it had ") + std::to_string(order_.size()) + ")",
                        "; every step must run the same blocks in the same order on every rank"));
      ++next_;
    } else if (training_) {
      order_.push_back(unit);
    }
    try {
      start_gather(unit, false);
    } catch (const CommError& e) {
      throw CommError(str("zero: rank ", dp_.rank(), " gathering ", gather_name(unit),
                          " for block '", model_.block_name(block), "': ", e.what()));
    }
  } else {
    const double t0 = now_seconds();
    r.work.wait();  // a prefetch may still be in flight
    r.device_work.wait();
    wait_s_ += now_seconds() - t0;
  }
  // Prefetch the order's next gather while this unit computes.
  if (training_ && recorded_ && prefetch_ && next_ < order_.size() &&
      !resident_[static_cast<size_t>(order_[next_])].memory.defined())
    start_gather(order_[next_++], true);
}

bool ShardedStore::used_by(int unit, size_t block) const {
  if (block >= units_.used_by_block.size()) return false;
  const auto& used = units_.used_by_block[block];
  return std::find(used.begin(), used.end(), unit) != used.end();
}

void ShardedStore::on_block(nn::Phase phase, size_t block, bool /*last*/) {
  const bool before = phase == nn::Phase::kBeforeForward || phase == nn::Phase::kBeforeBackward;
  for (int u : units_.used_by_block[block]) {
    if (before) {
      require(u, phase, block);
    } else if (!hold_for_step_) {
      // Forward runs blocks upwards, backward downwards: keep a unit the next block reads. The
      // backward of a training pass starts with the block the forward ended with.
      const bool last = block + 1 == units_.used_by_block.size();
      const bool keep = phase == nn::Phase::kAfterForward
                            ? used_by(u, block + 1) || (last && training_)
                            : block > 0 && used_by(u, block - 1);
      if (!keep) release(u);
    }
  }
}

void ShardedStore::begin_pass(bool training, int64_t) {
  if (training && !training_)
    for (size_t u = 0; u < resident_.size(); ++u) release(static_cast<int>(u));
  training_ = training;
}

void ShardedStore::end_step(int64_t) {
  for (size_t u = 0; u < resident_.size(); ++u) release(static_cast<int>(u));
  if (recorded_ && next_ != order_.size())
    throw Error(str("zero: rank ", dp_.rank(), " of the data-parallel group ran ", next_,
                    " gathers in step ", steps_ + 1, " but ", order_.size(),
                    " in the first step; every step must run the same blocks on every rank"));
  recorded_ = true;
  next_ = 0;
  ++steps_;
}

void ShardedStore::update(optim::Optimizer& opt, float lr, float grad_scale, GradSync& sync,
                          int64_t) {
  const double t0 = now_seconds();
  opt.step(segments(sync), lr, grad_scale);
  optimizer_s_ += now_seconds() - t0;
}

void ShardedStore::copy_values(nn::Range r, float* dst) {
  // Gather every unit that overlaps r (collective over the dp group), copy, release.
  for (size_t k = 0; k < units_.list.size(); ++k) {
    const nn::Range ur = units_.list[k].range;
    const int64_t lo = std::max(ur.lo, r.lo), hi = std::min(ur.hi, r.hi);
    if (lo >= hi) continue;
    const bool was_resident = resident_[k].memory.defined();
    if (!was_resident) start_gather(static_cast<int>(k), false);
    resident_[k].work.wait();
    resident_[k].device_work.wait();
    // The gathered values (16-bit ones widened; the f32 master shards live on their owners),
    // read back from a device first.
    Tensor part = resident_[k].memory.view(lo - ur.lo, {hi - lo});
    if (part.device() != Device::kCpu) part = part.to_device(Device::kCpu);
    ops::convert(dst + (lo - r.lo), DType::kF32, part.raw(), type_, hi - lo);
    if (!was_resident) release(static_cast<int>(k));
  }
}

std::pair<void*, DType> ShardedStore::working_at(nn::Range r) {
  if (!shard16_.defined()) return {nullptr, DType::kF32};
  const int64_t at = values(r) - shard_.kernel_data<float>();
  return {shard16_.view(at, {r.size()}).raw(), type_};
}

void ShardedStore::refresh_working(bool) {
  if (!shard16_.defined()) return;            // the gathers round the device's f32 shard
  std::vector<char> host(shard16_.nbytes());  // rounded on the host, where the masters live
  ops::convert(host.data(), type_, shard_.data<float>(), DType::kF32, shard16_.numel());
  device_runtime(shard16_.device())
      .copy(shard16_.raw(), shard16_.device(), host.data(), Device::kCpu, host.size(),
            current_stream());
}

void ShardedStore::take_stats(RankStats& s) {
  s.optimizer_s += optimizer_s_;
  s.comm_exposed_s += wait_s_;
  s.comm_bytes += bytes_;
  optimizer_s_ = wait_s_ = bytes_ = 0;
}

}  // namespace tessel::parallel
