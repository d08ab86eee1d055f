// TpGroup: the tensor-parallel collectives that cut layers call (nn/tensor_parallel.h), over
// this rank's tp communicator, each counted by where it came from: a block's forward or
// backward (the engine's hooks say which block runs) or outside every block (the loss, the
// step's sum of whole parameters' gradients under sequence parallelism). On device ranks the
// Engine hands it the tp group's DeviceCollectives (NCCL, or staged through the host): from
// then on every buffer the collectives get is device memory, and each call returns once its
// result is there. Internal to the parallel area; built by the Engine, and for inference
// replicas by make_tensor_parallel (layout.h).
#pragma once

#include <array>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"
#include "tessel/nn/model.h"
#include "tessel/nn/tensor_parallel.h"
#include "tessel/parallel/stats.h"

namespace tessel::parallel {

class TpGroup final : public nn::TensorParallel {
 public:
  TpGroup(comm::Communicator& tp, bool sequence);

  void all_reduce_sum(void* data, int64_t n, DType type) override;
  void all_reduce_max(float* data, int64_t n) override;
  void all_gather(const void* in, void* out, int64_t n, DType type) override;
  void reduce_scatter(const void* in, void* out, int64_t n, DType type) override;

  // Device ranks: the collectives run on `device` (over this group's ranks) from now on.
  void use_device(std::unique_ptr<comm::DeviceCollectives> device);
  // The Engine's destructor: closes the device collectives (aborts them while an exception
  // unwinds the rank); nothing without them.
  void release_device() noexcept;

  // Where the next calls come from: the block whose forward (backward) starts, or, after a
  // block, outside every block ("step" after a backward). `training` false: an evaluation.
  void set_call_site(nn::Phase phase, size_t block, bool training);
  // Calls and bytes per block ("block0": {"forward": {"all_reduce": {"calls", "bytes"}}}, the
  // rest under "outside"), since the start.
  nlohmann::json counters(const nn::Model& model) const;
  // Time in the group's collectives and bytes moved since the last call.
  void take_stats(RankStats& s);

 private:
  enum Op { kAllReduce, kAllGather, kReduceScatter, kOps };
  enum Where { kForward, kBackward, kStep, kEval, kWheres };
  struct Count {
    int64_t calls = 0;
    double bytes = 0;
  };
  template <typename F>
  void run(Op op, int64_t bytes, F&& call);
  void all_reduce(void* data, int64_t n, DType type, comm::ReduceOp op);
  std::vector<size_t> blocks(size_t count) const;  // size() blocks of count elements

  comm::Communicator& comm_;
  std::unique_ptr<comm::DeviceCollectives> device_;
  static constexpr int64_t kOutside = -1;
  int64_t block_ = kOutside;
  Where where_ = kForward;
  std::map<int64_t, std::array<std::array<Count, kOps>, kWheres>> counts_;
  double time_s_ = 0, bytes_ = 0;
};

}  // namespace tessel::parallel
