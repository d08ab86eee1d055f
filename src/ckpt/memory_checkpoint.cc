// MemoryCheckpoint: a checkpoint in memory, one full-size buffer per tensor, which writers fill
// with their slices; the in-memory snapshots of a run (train/snapshots.h) are made of these.
#include <algorithm>

#include "tessel/ckpt/checkpoint.h"

namespace tessel::ckpt {

MemoryCheckpoint::MemoryCheckpoint(std::string name, Manifest manifest)
    : name_(std::move(name)), manifest_(std::move(manifest)) {
  for (const TensorSpec& p : manifest_.parameters) {
    const size_t numel = static_cast<size_t>(shape_numel(p.shape));
    buffers_[p.name].values.resize(numel);
    for (const std::string& b : manifest_.state_buffers)
      buffers_[b + "/" + p.name].values.resize(numel);
  }
}

void MemoryCheckpoint::add(const std::vector<ShardSlice>& slices) {
  for (const ShardSlice& s : slices) {
    const auto it = buffers_.find(s.name);
    const int64_t n = s.data.numel();
    if (it == buffers_.end() || s.begin < 0 ||
        s.begin + n > static_cast<int64_t>(it->second.values.size()))
      throw InvalidArgument(str("checkpoint: slice '", s.name, "' [", s.begin, ", ", s.begin + n,
                                ") lies outside every tensor of ", name_,
                                "; slices must come from the model the snapshot describes"));
    std::copy_n(s.data.data<float>(), n, it->second.values.data() + s.begin);  // contiguous
    it->second.written.fetch_add(n, std::memory_order_acq_rel);
  }
}

void MemoryCheckpoint::read(const std::string& name, int64_t begin, int64_t count,
                            float* dst) const {
  const auto it = buffers_.find(name);
  const int64_t size = it == buffers_.end() ? 0 : static_cast<int64_t>(it->second.values.size());
  if (it == buffers_.end() || begin < 0 || count < 0 || begin > size - count)
    throw IoError(str("checkpoint: ", name_, " holds no elements [", begin, ", ", begin + count,
                      ") of tensor '", name, "'; resume with the model it was taken from"));
  if (it->second.written.load(std::memory_order_acquire) != size)
    throw IoError(str("checkpoint: ", name_, " lacks elements of tensor '", name, "' (",
                      it->second.written.load(), " of ", size,
                      " written); no writer saved them: resume from a complete checkpoint"));
  std::copy_n(it->second.values.data() + begin, count, dst);
}

}  // namespace tessel::ckpt
