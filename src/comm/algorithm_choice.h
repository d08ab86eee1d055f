// Which algorithm a collective runs: the one asked for (checked against what the operation
// supports and the transport offers), else the communicator's default, else the automatic
// choice by world size and message size (CommOptions::thresholds). Internal to the comm area.
#pragma once

#include <cstddef>

#include "comm_state.h"

namespace tessel::comm::detail {

Algorithm resolve(const CommState& s, OpKind op, size_t bytes, Algorithm requested);

}  // namespace tessel::comm::detail
