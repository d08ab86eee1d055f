#include "tp_group.h"

#include "engine_device.h"
#include "tessel/comm/types.h"
#include "tessel/core/clock.h"

namespace tessel::parallel {

std::unique_ptr<nn::TensorParallel> make_tensor_parallel(comm::Communicator& tp, bool sequence) {
  return std::make_unique<TpGroup>(tp, sequence);
}

TpGroup::TpGroup(comm::Communicator& tp, bool sequence)
    : nn::TensorParallel(tp.rank(), tp.size(), sequence), comm_(tp) {}

template <typename F>
void TpGroup::run(Op op, int64_t bytes, F&& call) {
  const double t0 = now_seconds();
  call();
  time_s_ += now_seconds() - t0;
  bytes_ += static_cast<double>(bytes);
  Count& c = counts_[block_][where_][op];
  ++c.calls;
  c.bytes += static_cast<double>(bytes);
}

void TpGroup::use_device(std::unique_ptr<comm::DeviceCollectives> device) {
  device_ = std::move(device);
}

void TpGroup::release_device() noexcept {
  if (device_) release_device_collectives(*device_);
}

// 16-bit activations travel in 16 bits (Megatron reduces in bf16): half the bytes of f32, and
// with 2 ranks the same one rounding of the f32 sum as widening would give. On a device the
// layer's next kernel reads the sum, so each call waits for its work (within comm.timeout_s).
void TpGroup::all_reduce_sum(void* data, int64_t n, DType type) {
  run(kAllReduce, n * dtype_size(type), [&] { all_reduce(data, n, type, comm::ReduceOp::kSum); });
}

void TpGroup::all_reduce_max(float* data, int64_t n) {
  run(kAllReduce, n * 4, [&] { all_reduce(data, n, DType::kF32, comm::ReduceOp::kMax); });
}

// Sequence parallelism's gathers and scatters along T: every rank's block is n elements.
void TpGroup::all_gather(const void* in, void* out, int64_t n, DType type) {
  run(kAllGather, n * size() * dtype_size(type), [&] {
    const size_t count = static_cast<size_t>(n);
    if (device_)
      device_->allgather(in, out, blocks(count), comm::elem_type(type), {}).wait();
    else
      comm_.allgather(in, out, count, comm::elem_type(type));
  });
}

void TpGroup::reduce_scatter(const void* in, void* out, int64_t n, DType type) {
  run(kReduceScatter, n * size() * dtype_size(type), [&] {
    const size_t count = static_cast<size_t>(n);
    if (device_)
      device_
          ->reduce_scatter(in, out, blocks(count), comm::elem_type(type), comm::ReduceOp::kSum, {})
          .wait();
    else
      comm_.reduce_scatter(in, out, count, comm::elem_type(type));
  });
}

std::vector<size_t> TpGroup::blocks(size_t count) const {
  return std::vector<size_t>(static_cast<size_t>(size()), count);
}

void TpGroup::all_reduce(void* data, int64_t n, DType type, comm::ReduceOp op) {
  const size_t count = static_cast<size_t>(n);
  if (device_)
    device_->allreduce(data, count, comm::elem_type(type), op, {}).wait();
  else
    comm_.allreduce(data, count, comm::elem_type(type), op);
}

void TpGroup::set_call_site(nn::Phase phase, size_t block, bool training) {
  const bool before = phase == nn::Phase::kBeforeForward || phase == nn::Phase::kBeforeBackward;
  block_ = before ? static_cast<int64_t>(block) : kOutside;
  where_ = !training                             ? kEval
           : phase == nn::Phase::kBeforeBackward ? kBackward
           : phase == nn::Phase::kAfterBackward  ? kStep
                                                 : kForward;
}

nlohmann::json TpGroup::counters(const nn::Model& model) const {
  static const char* kOpNames[] = {"all_reduce", "all_gather", "reduce_scatter"};
  static const char* kWhereNames[] = {"forward", "backward", "step", "eval"};
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [block, wheres] : counts_) {
    nlohmann::json& b = out[block == kOutside ? std::string("outside")
                                              : model.block_name(static_cast<size_t>(block))];
    for (int w = 0; w < kWheres; ++w)
      for (int op = 0; op < kOps; ++op) {
        const Count& c = wheres[static_cast<size_t>(w)][static_cast<size_t>(op)];
        if (c.calls > 0) b[kWhereNames[w]][kOpNames[op]] = {{"calls", c.calls}, {"bytes", c.bytes}};
      }
  }
  return out;
}

void TpGroup::take_stats(RankStats& s) {
  s.tp_comm_s += time_s_;
  s.tp_bytes += bytes_;
  time_s_ = bytes_ = 0;
}

}  // namespace tessel::parallel
