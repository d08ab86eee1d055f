// StagedCollectives: the DeviceCollectives of ranks whose device buffers cannot go through
// NCCL (several ranks on one GPU with an NCCL that refuses them, or a build without NCCL). A
// call copies the buffer to host memory, runs the collective over the ranks' ordinary
// Communicator (threads or mpi, its algorithms, stamps and deadlines) and copies the result
// back, all before it returns: the host side is exactly what the CPU ranks run, so the sums
// are the CPU's bits. Costs two copies over the PCIe bus per call and hides nothing behind the
// backward pass; for tests and small machines, not for speed. Point to point (a pipeline's
// boundaries) the same way: a host copy sent with the ranks' own send. Owns nothing of the
// Communicator, which must outlive it; one thread at a time.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"
#include "tessel/tensor/device.h"

namespace tessel::comm {

class StagedCollectives final : public DeviceCollectives {
 public:
  // Buffers live on `device` (its runtime copies them) and are read after the work queued on
  // `stream`, the rank's compute stream (null: the device's default stream).
  StagedCollectives(Communicator& group, Device device, void* stream);

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  [[nodiscard]] NcclWork allreduce(void* buf, size_t count, ElemType elem, ReduceOp op,
                                   const CallOptions& call) override;
  [[nodiscard]] NcclWork reduce_scatter(const void* in, void* out,
                                        const std::vector<size_t>& counts, ElemType elem,
                                        ReduceOp op, const CallOptions& call) override;
  [[nodiscard]] NcclWork allgather(const void* in, void* out, const std::vector<size_t>& counts,
                                   ElemType elem, const CallOptions& call) override;
  // send copies buf to a host buffer of its own and sends that with the group's isend (its
  // work done at once: buf may be reused; the host send goes on behind it, so a pipeline's
  // sends never wait for their receiver). recv receives on the host and copies to buf.
  [[nodiscard]] NcclWork send(const void* buf, size_t count, ElemType elem, int peer,
                              const CallOptions& call) override;
  [[nodiscard]] NcclWork recv(void* buf, size_t count, ElemType elem, int peer,
                              const CallOptions& call) override;
  // Waits for the sends still going out (rethrowing a failed one); holds nothing of the peers.
  void close() override;
  void abort(const std::string& reason) noexcept override { group_.abort(reason); }

 private:
  struct Sending {  // a host send in progress and the bytes it reads
    Work work;
    std::vector<char> bytes;
  };
  // Drops the finished sends, oldest first (all of them, waiting, when `all`); rethrows a
  // failed one.
  void reap(bool all);

  // Copies count elements of device memory p into host_ (grown to hold `at` + count elements)
  // at element `at`, and returns host_; up() copies count elements of host to p.
  char* down(const void* p, size_t at, size_t count, ElemType elem);
  void up(void* p, const char* host, size_t count, ElemType elem);

  Communicator& group_;
  DeviceRuntime& runtime_;
  Device device_;
  void* stream_;
  std::vector<char> host_;                        // the staging buffer, grown to the largest call
  std::deque<std::unique_ptr<Sending>> sending_;  // oldest first
};

}  // namespace tessel::comm
