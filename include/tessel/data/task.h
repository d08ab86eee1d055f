// What a dataset's targets are (data.task), and so the model's output and loss: one class per
// row (logits, cross-entropy), real values (outputs, mean squared error) or several 0/1 labels
// per row (logits, sigmoid + binary cross-entropy). A header of its own so that the data, the
// models, checkpoints and inference share the one enum.
#pragma once

#include "tessel/core/names.h"

namespace tessel::data {

enum class Task { kClassification, kRegression, kMultilabel };

}  // namespace tessel::data

namespace tessel {
TESSEL_NAMES(data::Task, "classification", "regression", "multilabel");
}  // namespace tessel
