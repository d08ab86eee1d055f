// Buckets: the gradient units of one step on their way through their exchanges. The one bucket
// implementation every gradient sync shares (ArenaSync, ShardSync), with a codec hook: each
// unit travels through its codecs (compress/codecs.h), planned once:
//   compress.kind none   one dense codec over the whole unit, f32 or train.precision's 16-bit
//                        type, all-reduced, or reduce-scattered (ZeRO) so that this rank gets
//                        the sum of its shard;
//   other kinds          a dense codec for the tensors the kind would not shrink, the kind's
//                        codec for the rest (all-reduced or all-gathered whole; under ZeRO each
//                        rank then keeps its shard), or one dense codec over everything during
//                        the compress.start_step warm-up steps.
// With zero.shard_size (hierarchical sharding) dp is this rank's shard group and `across` the
// ranks holding the same shard in the other groups: once a unit's exchanges in the group are
// done, this rank's shard is all-reduced across them (one dense message, train.precision's
// type), so that it holds the sum over every dp rank.
// A sync launches a unit as soon as the backward pass is done with it; with overlap the
// exchanges run on the communicator's progress thread while earlier blocks still compute, and
// a codec's second exchange (PowerSGD's Q) is started when the next unit launches, so unit k's
// Q travels behind unit k+1's P (every rank advances in the same fixed order, so the
// collectives match); without overlap the exchanges run right there on the compute thread.
// wait_all() at the step completes them all and splits the time into exposed (waited for) and
// overlapped (hidden behind the backward). A device rank's exchanges go through its
// DeviceCollectives (nccl.h): NCCL's run on their stream while the backward goes on, like the
// progress thread's; staged ones are done when they return.
// Compressed results depend on the worker count (each rank compresses its own gradient); the
// codecs' state (residuals, Q, the step) is saved with checkpoints so a resumed run on the same
// worker count continues bit-identically. Internal to the parallel area.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "compress/codecs.h"
#include "tessel/comm/communicator.h"
#include "tessel/comm/nccl.h"
#include "tessel/parallel/compress.h"
#include "tessel/parallel/stats.h"
#include "tessel/parallel/units.h"

namespace tessel::parallel {

int64_t largest_unit(const Units& units);

class Buckets {
 public:
  struct Spec {
    bool async = false;
    // Reduce-scatter (ZeRO): a unit's exchanges need only leave this rank's shard summed.
    bool scatter = false;
    DType message = DType::kF32;  // what an uncompressed unit travels as (train.precision)
    CompressSpec compress;        // kind none: every unit is one dense message
    uint64_t seed = 0;            // PowerSGD's first Q, int8's rounding
    // With scatter: the ranks holding this rank's shards in the other shard groups (null or
    // one rank: none).
    comm::Communicator* across = nullptr;
    // A device rank: dp's collectives on device memory (NCCL, or copies through the host),
    // which carry every exchange instead of dp itself (dense ones: all-reduces, or under ZeRO
    // reduce-scatters), and across's, which carry the shards' all-reduces across the groups.
    comm::DeviceCollectives* device = nullptr;
    comm::DeviceCollectives* across_device = nullptr;
  };
  // Runs once a unit's exchanges have completed (e.g. adds this rank's shard into its shard
  // buffer).
  using Done = std::function<void()>;

  // dp null or one rank: nothing to exchange (launch runs done at once).
  Buckets(const nn::Model& model, const Units& units, comm::Communicator* dp, const Spec& spec);

  // Starts unit's exchanges on g, its gradient (the unit's range.size() values); once they are
  // done, g holds the sum over dp (scatter: at least this rank's shard; with across, its sum
  // over every group) and `done` runs. With
  // `max_in_flight` > 0, first waits for the oldest exchanges until fewer units are in flight
  // (bounding the buffers they hold). A unit launched again in a step (a later pass) first
  // waits for its earlier exchanges.
  void launch(int unit, float* g, Done done = {}, size_t max_in_flight = 0);
  // Notes exchanges that finished in the background (call between blocks).
  void poll();
  // Completes every launched exchange (the step): their time after the backward pass is
  // exposed, before it overlapped.
  void wait_all();
  void take_stats(RankStats& s);
  // The codecs' state as one vector (its length, the step, then every codec's state in unit
  // order; exact as f32 up to 2^24 values and steps), empty without compression; load throws
  // IoError when the size does not match this layout's.
  std::vector<float> save_state();
  void load_state(const std::vector<float>& state);

 private:
  struct Plan {
    std::vector<std::unique_ptr<compress::Codec>> codecs;  // what the unit sends
    std::unique_ptr<compress::Codec> warm;    // compress.start_step: everything as one message
    std::unique_ptr<compress::Codec> across;  // this rank's shard over spec.across (or null)
  };
  struct Flight {
    int unit = 0;
    compress::Codec* codec = nullptr;
    comm::Communicator* group = nullptr;  // where its exchanges run: dp, or across
    float* g = nullptr;
    int phase = 0;  // exchanges completed
    comm::Work work;
    double launched = 0, finished = 0;  // finished: first seen complete (0: not yet)
    comm::NcclWork device_work;         // a device rank's exchange (spec.device)
  };
  Plan plan(const nn::Model& model, int unit);
  bool compressing() const { return kind_ != CompressKind::kNone; }
  // Encodes g with codec c and posts the first exchange on group.
  void start(int unit, compress::Codec* c, comm::Communicator* group, float* g);
  void post(Flight f, const compress::Exchange& ex);
  // Waits for f's exchange (its time up to `now` overlapped), then decodes or posts the next.
  void complete(Flight& f, double now);
  void wait(Flight& f);  // complete(), its wait exposed
  static bool done(const Flight& f) { return f.work.done() && f.device_work.done(); }
  void wait_front();  // wait() for the oldest flight

  const Units& units_;
  comm::Communicator* dp_;
  comm::Communicator* across_;
  Spec spec_;
  CompressKind kind_;
  compress::BufferPool pool_;
  std::vector<Plan> plans_;
  std::vector<int> pending_;  // per unit: codecs whose exchanges are not done
  std::vector<Done> done_;
  std::deque<Flight> in_flight_;
  bool started_ = false;  // a unit launched in this step
  int64_t step_ = 0;
  uint64_t sent_at_start_ = 0;  // the transport's counter when the step's first unit launched
  double exposed_s_ = 0, overlapped_s_ = 0, bytes_ = 0, across_bytes_ = 0;
  double encode_s_ = 0, decode_s_ = 0, sent_ = 0, formula_ = 0, f32_ = 0;  // compressing
};

}  // namespace tessel::parallel
