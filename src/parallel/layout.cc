#include "tessel/parallel/layout.h"

#include <iterator>

#include "tessel/core/error.h"

namespace tessel::parallel {

namespace {

// zero.shard_size: 0 (the whole dp group) or a divisor k of dp with 1 < k (composition.h
// refuses it with zero.stage = 0).
int resolve_shard(const ParallelSpec& spec, const Layout& l) {
  const int k = spec.zero_shard_size;
  if (k == 0) return l.dp;
  auto refuse = [&](const std::string& why) {
    throw InvalidArgument(tessel::str("config: zero.shard_size = ", k, " ", why,
                                      "; set zero.shard_size = 0 to shard over the whole dp "
                                      "group (docs/zero.md)"));
  };
  if (k < 0) refuse("must be >= 0 (a number of dp ranks per shard group)");
  if (k == 1)
    refuse(
        "leaves every rank a group of its own, which is plain data parallelism; set "
        "zero.stage = 0 for that, or a zero.shard_size above 1");
  if (l.dp % k != 0)
    refuse(tessel::str("does not divide the dp size ", l.dp, " (", l.workers(), " ranks / (pp ",
                       l.pp, " x tp ", l.tp, ")); use a divisor of ", l.dp,
                       " such as the ranks per host, or start a multiple of ", k * l.pp * l.tp,
                       " ranks"));
  return k;
}

}  // namespace

Layout Layout::resolve(const ParallelSpec& spec, int world) {
  Layout l;
  l.world = world;
  if (spec.ps_servers > 0 && spec.ps_servers >= world)
    throw InvalidArgument(
        tessel::str("config: ps.servers = ", spec.ps_servers, " leaves no worker among ", world,
                    " ranks; start more ranks (--workers / mpirun -np) than ", "servers"));
  if (spec.tp_sequence && spec.tp_size == 1)
    throw InvalidArgument("config: tp.sequence_parallel = true needs tp.size > 1");
  l.servers = static_cast<int>(spec.ps_servers);
  l.pp = static_cast<int>(spec.pp_stages);
  l.tp = static_cast<int>(spec.tp_size);
  if (l.workers() % (l.pp * l.tp) != 0)
    throw InvalidArgument(tessel::str("config: pp.stages = ", l.pp, " x tp.size = ", l.tp, " = ",
                                      l.pp * l.tp, " does not divide the ", l.workers(),
                                      " ranks; the world size must be dp x pp x tp, so start a "
                                      "multiple of ",
                                      l.pp * l.tp, " ranks (e.g. ",
                                      (l.workers() / (l.pp * l.tp) + 1) * l.pp * l.tp, ")"));
  l.dp = l.workers() / (l.pp * l.tp);
  l.shard = resolve_shard(spec, l);
  return l;
}

Coord Layout::coord(int rank) const { return {rank / (pp * tp), rank / tp % pp, rank % tp}; }

int Layout::rank_of(const Coord& c) const { return (c.dp * pp + c.pp) * tp + c.tp; }

std::string Layout::str() const {
  if (servers > 0)
    return tessel::str("ps: ", servers, servers == 1 ? " server x " : " servers x ", dp,
                       dp == 1 ? " worker" : " workers");
  std::string out;
  if (dp > 1) out += tessel::str("dp=", dp);
  if (pp > 1) out += tessel::str(out.empty() ? "" : " ", "pp=", pp);
  if (tp > 1) out += tessel::str(out.empty() ? "" : " ", "tp=", tp);
  if (shard < dp) out += tessel::str(" shard=", shard);
  return out.empty() ? std::string("single") : out;
}

Mesh::Mesh(comm::Communicator& world, const Layout& layout) : world_(world), layout_(layout) {
  const int r = world.rank();
  const bool server = layout.is_server(r);
  const Coord c = server ? Coord{} : layout.coord(r);
  const int stage = c.pp * layout.tp + c.tp, stages = layout.pp * layout.tp;
  // Per axis, in Axis order, the coordinates the axis leaves fixed: they key its group. Every
  // rank takes part in each split, in the same order.
  const int keys[] = {stage, c.dp * layout.tp + c.tp, c.dp * layout.pp + c.pp,
                      c.dp / layout.shard * stages + stage, c.dp % layout.shard * stages + stage};
  for (size_t a = 0; a < std::size(groups_); ++a)
    groups_[a] = world.split(server ? -1 : keys[a], r);
  workers_ = world.split(server ? -1 : 0, r);
}

comm::Communicator& Mesh::group(Axis axis) {
  TESSEL_CHECK(!is_server(), "mesh: a parameter-server rank belongs to no training axis");
  return groups_[static_cast<size_t>(axis)];
}

}  // namespace tessel::parallel
