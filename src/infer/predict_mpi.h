// Private to src/infer: predict's MPI driver (one rank per process), beside the threads driver
// in predict.cc; both run the loop of predict_replica.h.
#pragma once

#include <nlohmann/json.hpp>

#include "predict_replica.h"

namespace tessel::infer::detail {

nlohmann::json predict_mpi(const PredictSetup& setup);

}  // namespace tessel::infer::detail
