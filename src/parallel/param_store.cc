#include "tessel/parallel/param_store.h"

#include <cmath>

#include "tessel/core/error.h"
#include "tessel/optim/schedule.h"

namespace tessel::parallel {

int64_t ParamStore::update_numel() const {
  int64_t n = 0;
  for (const nn::Range& r : update_) n += r.size();
  return n;
}

int64_t ParamStore::state_offset(nn::Range r) const {
  int64_t offset = 0;
  for (const nn::Range& u : update_) {
    if (r.lo >= u.lo && r.hi <= u.hi) return offset + (r.lo - u.lo);
    offset += u.size();
  }
  throw Error(str("parallel: range [", r.lo, ", ", r.hi, ") is not updated by this rank (this is a bug)"));
}

std::vector<optim::Segment> ParamStore::segments(GradSync& sync) {
  std::vector<optim::Segment> out;
  for (const nn::Range& r : update_) out.push_back({values(r), sync.grads(r), r.size(), state_offset(r)});
  return out;
}

float ParamStore::grad_scale(GradSync& sync, float clip_norm) {
  if (!(clip_norm > 0)) return 1.0f;
  return optim::clip_factor(std::sqrt(sync.sq_norm()), clip_norm);
}

}  // namespace tessel::parallel
