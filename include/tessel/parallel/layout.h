// Layout: how the world's ranks are arranged. The training ranks form a grid dp x pp (tp later):
// rank r (r < dp * pp) is stage r % pp of data-parallel replica r / pp, so one pipeline's stages
// are neighbours. With a parameter server, the last ps.servers ranks are servers and every
// other rank is a worker (no pipeline then). Groups builds the sub-communicators a strategy
// talks over.
#pragma once

#include <string>

#include "tessel/comm/communicator.h"
#include "tessel/parallel/strategy.h"

namespace tessel::parallel {

struct Layout {
  int world = 1;
  int dp = 1;       // data-parallel replicas (workers, with a parameter server)
  int pp = 1;       // pipeline stages
  int servers = 0;  // parameter-server ranks

  // The layout of `spec` over `world` ranks: dp = (world - servers) / pp. Throws
  // InvalidArgument naming the keys when the numbers do not fit.
  static Layout resolve(const ParallelSpec& spec, int world);

  int workers() const { return world - servers; }
  bool is_server(int rank) const { return rank >= workers(); }
  int stage(int rank) const { return rank % pp; }     // training ranks only
  int replica(int rank) const { return rank / pp; }   // training ranks only
  int rank_of(int replica, int stage) const { return replica * pp + stage; }
  std::string str() const;  // "single", "dp=4", "dp=2 pp=2", "ps: 1 server x 4 workers"
};

// Sub-communicators of one rank (collective to build: every rank of world builds its Groups).
// A group this rank is not part of is an invalid Communicator.
struct Groups {
  comm::Communicator dp;       // the ranks holding the same stage (the same parameters)
  comm::Communicator pp;       // the stages of this rank's pipeline
  comm::Communicator workers;  // every training rank (for metrics; excludes servers)

  Groups(comm::Communicator& world, const Layout& layout);
};

}  // namespace tessel::parallel
