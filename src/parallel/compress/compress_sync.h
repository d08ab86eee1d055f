// CompressSync: the gradient sync of compress.kind != none (zero.stage 0). Like ArenaSync it
// holds the full gradient of the local units in one arena and launches each unit's exchange
// once the backward pass is done with it; the exchange is its codecs' (codecs.h): f32 for the
// tensors compression would not shrink, the kind's codec for the rest, or f32 for everything
// during the compress.start_step warm-up steps.
// Pipelining (ddp.overlap on): a unit's first exchange is posted at launch; a codec with a
// second exchange (PowerSGD's Q) is advanced when the next unit launches, so unit k's Q
// all-reduce travels behind unit k+1's P. Every rank advances in the same order (a fixed rule,
// not whichever call finished first), so the collectives match.
// Results depend on the worker count (each rank compresses its own gradient); the state
// (residuals, Q, the step) is saved with checkpoints so a resumed run on the same worker count
// continues bit-identically. Internal to the parallel area; built by the Engine.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "../grad_syncs.h"
#include "codecs.h"
#include "tessel/parallel/compress.h"

namespace tessel::parallel {

class CompressSync final : public GradSync, public BlockHooks {
 public:
  CompressSync(nn::Model& model, const Units& units, comm::Communicator& dp,
               comm::Communicator* workers, bool async, const CompressSpec& spec, uint64_t seed);

  void on_block(nn::Phase phase, size_t block, bool last) override;
  void reduce() override;
  double sq_norm() override;
  float* grads(nn::Range r) override;
  void clear() override;
  void take_stats(RankStats& s) override;

  // This rank's compression state as one vector (its length, the step, then every codec's state
  // in unit order; exact as f32 up to 2^24 values and steps), and back; load throws IoError when
  // the size does not match this layout's.
  std::vector<float> save_state();
  void load_state(const std::vector<float>& state);

 private:
  struct Plan {
    std::vector<std::unique_ptr<compress::Codec>> codecs;  // f32 rest + the kind's codec
    std::unique_ptr<compress::Codec> warm;                 // the whole unit in f32 (warm-up)
  };
  struct Flight {
    int unit;
    compress::Codec* codec;
    int phase;  // exchanges completed
    comm::Work work;
  };
  Plan plan(const Unit& u, int unit, uint64_t seed) const;
  void launch(int unit);
  void post(Flight f, const compress::Exchange& ex);
  void advance(Flight& f);  // waits for f's exchange, then decodes or posts the next one

  nn::Model& model_;
  const Units& units_;
  comm::Communicator& dp_;
  comm::Communicator* workers_;
  bool async_;
  CompressSpec spec_;
  CompressKind kind_;
  uint64_t seed_;
  Tensor arena_;
  std::vector<Plan> plans_;
  std::vector<char> launched_;
  std::deque<Flight> flights_;
  int64_t step_ = 0;
  uint64_t sent_at_start_ = 0;  // the transport's counter when the step's first unit launched
  double exposed_s_ = 0, encode_s_ = 0, decode_s_ = 0;
  double sent_ = 0, formula_ = 0, f32_ = 0;
};

}  // namespace tessel::parallel
