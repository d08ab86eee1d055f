// A model's parameter values out of a checkpoint: what restoring a run and loading a model for
// inference (tessel eval, predict, serve) share. Each read takes exactly the elements a model's
// bound parameter values hold, so a pipeline stage or a tensor-parallel cut reads its own share.
#pragma once

#include <string>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/nn/model.h"

namespace tessel::ckpt {

// Throws IoError unless every parameter of `model` is in the checkpoint with the model's
// (whole) shape.
void check_parameters(const CheckpointSource& source, const nn::Model& model);

// Arena range r of tensor family `prefix` ("" for values, "exp_avg/" ...) into dst (elements
// that are padding stay as they are).
void read_range(const CheckpointSource& source, const nn::Model& model, const std::string& prefix,
                nn::Range r, float* dst);

// The weights (only) of a checkpoint into the model's bound parameter values: all of a
// materialized model, or the blocks a pipeline stage holds, each its tensor-parallel cut.
void load_weights(const CheckpointSource& source, nn::Model& model);

}  // namespace tessel::ckpt
