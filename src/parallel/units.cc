#include "tessel/parallel/units.h"

#include <algorithm>

#include "tessel/core/error.h"
#include "tessel/optim/schedule.h"

namespace tessel::parallel {

namespace {
constexpr int64_t kLine = 16;  // floats per 64-byte line: shards never share a cache line
}

nn::Range Unit::shard(int r) const {
  int64_t lo = range.lo;
  for (int k = 0; k < r; ++k) lo += static_cast<int64_t>(counts[static_cast<size_t>(k)]);
  return {lo, lo + static_cast<int64_t>(counts[static_cast<size_t>(r)])};
}

std::vector<int> Units::completed_by(size_t b) const {
  std::vector<int> out;
  for (size_t u = 0; u < list.size(); ++u)
    if (list[u].first_user == b) out.push_back(static_cast<int>(u));
  return out;
}

std::string Units::describe(int unit, const nn::Model& model) const {
  const Unit& u = list[static_cast<size_t>(unit)];
  std::string blocks = model.block_name(u.first_block);
  if (u.last_block != u.first_block) blocks += ".." + model.block_name(u.last_block);
  return str("unit ", unit, " (blocks ", blocks, ")");
}

double sum_squares_counted(const Units& units, nn::Range r, const float* g) {
  double sq = 0;
  int64_t at = r.lo;  // summed up to here
  for (const nn::Range& rep : units.replicas) {
    const int64_t a = std::max(rep.lo, r.lo), b = std::min(rep.hi, r.hi);
    if (a >= b) continue;
    if (a > at) sq += optim::sum_squares(g + (at - r.lo), a - at);
    at = b;
  }
  if (r.hi > at) sq += optim::sum_squares(g + (at - r.lo), r.hi - at);
  return sq;
}

Units make_units(const nn::Model& model, double bucket_mb, const std::vector<bool>& local, int dp,
                 int dp_rank) {
  const int64_t limit = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20) / 4));
  auto is_local = [&](size_t b) { return local.empty() || local[b]; };
  Units units;
  units.dp = dp;
  units.dp_rank = dp_rank;
  // Backwards over the blocks: close a unit before a block that would overflow it, or at a
  // block this rank does not run, so the blocks already in it can reduce while this one runs.
  std::vector<Unit> rev;
  Unit cur;
  bool open = false;
  for (size_t b = model.num_blocks(); b-- > 0;) {
    const nn::Range r = model.block_range(b);
    if (!is_local(b) || (open && !r.empty() && cur.range.hi - r.lo > limit)) {
      if (open) rev.push_back(cur);
      open = false;
    }
    if (!is_local(b) || r.empty()) continue;
    if (!open) cur = Unit{r, b, b, b, b, {}, 0}, open = true;
    cur.range.lo = r.lo;
    cur.first_block = b;
  }
  if (open) rev.push_back(cur);
  units.list.assign(rev.rbegin(), rev.rend());

  units.used_by_block.assign(model.num_blocks(), {});
  for (size_t k = 0; k < units.list.size(); ++k) {
    Unit& u = units.list[k];
    u.first_user = u.first_block;
    u.last_user = u.last_block;
    for (size_t b = u.first_block; b <= u.last_block; ++b)
      for (size_t user : model.blocks_using(b)) {
        if (!is_local(user)) continue;
        u.first_user = std::min(u.first_user, user);
        u.last_user = std::max(u.last_user, user);
        auto& used = units.used_by_block[user];
        if (used.empty() || used.back() != static_cast<int>(k)) used.push_back(static_cast<int>(k));
      }
    // Shards: shard r starts at the line boundary at or below r/P of the unit.
    const int64_t len = u.range.size();
    int64_t prev = 0;
    for (int r = 1; r <= dp; ++r) {
      const int64_t cut = r == dp ? len : (len * r / dp) / kLine * kLine;
      u.counts.push_back(static_cast<size_t>(cut - prev));
      prev = cut;
    }
    u.shard_offset = units.shard_numel;
    units.shard_numel += units.own(u).size();
  }
  for (auto& used : units.used_by_block) std::sort(used.begin(), used.end());
  for (size_t k = 0; k < model.parameters().size(); ++k)
    if (model.parameters()[k]->split.replica) units.replicas.push_back(model.param_range(k));
  if (!units.list.empty()) units.span = {units.list.front().range.lo, units.list.back().range.hi};
  return units;
}

}  // namespace tessel::parallel
