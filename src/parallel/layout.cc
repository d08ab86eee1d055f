#include "tessel/parallel/layout.h"

#include "tessel/core/error.h"

namespace tessel::parallel {

Layout Layout::resolve(const ParallelSpec& spec, int world) {
  Layout l;
  l.world = world;
  if (spec.pp_stages < 1)
    throw InvalidArgument(tessel::str("config: pp.stages must be >= 1, got ", spec.pp_stages));
  if (spec.ps_servers < 0)
    throw InvalidArgument(tessel::str("config: ps.servers must be >= 0 (0 = no parameter server), got ",
                              spec.ps_servers));
  if (spec.ps_servers > 0 && spec.pp_stages > 1)
    throw InvalidArgument(tessel::str("config: ps.servers = ", spec.ps_servers, " and pp.stages = ",
                              spec.pp_stages, " cannot be combined; use one of them"));
  if (spec.ps_servers > 0 && spec.ps_servers >= world)
    throw InvalidArgument(tessel::str("config: ps.servers = ", spec.ps_servers, " leaves no worker among ",
                              world, " ranks; start more ranks (--workers / mpirun -np) than ",
                              "servers"));
  l.servers = static_cast<int>(spec.ps_servers);
  l.pp = static_cast<int>(spec.pp_stages);
  if (l.workers() % l.pp != 0)
    throw InvalidArgument(tessel::str("config: pp.stages = ", l.pp, " does not divide the ", l.workers(),
                              " ranks; the world size must be dp x pp, so start a multiple of ",
                              l.pp, " ranks"));
  l.dp = l.workers() / l.pp;
  return l;
}

std::string Layout::str() const {
  if (servers > 0)
    return tessel::str("ps: ", servers, servers == 1 ? " server x " : " servers x ", dp,
                       dp == 1 ? " worker" : " workers");
  if (pp == 1) return dp == 1 ? std::string("single") : tessel::str("dp=", dp);
  return dp == 1 ? tessel::str("pp=", pp) : tessel::str("dp=", dp, " pp=", pp);
}

Groups::Groups(comm::Communicator& world, const Layout& layout) {
  const int r = world.rank();
  const bool server = layout.is_server(r);
  // Every rank takes part in each split, in the same order.
  dp = world.split(server ? -1 : layout.stage(r), r);
  pp = world.split(server ? -1 : layout.replica(r), r);
  workers = world.split(server ? -1 : 0, r);
}

}  // namespace tessel::parallel
