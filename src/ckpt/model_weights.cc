#include "tessel/ckpt/model_weights.h"

#include <algorithm>
#include <vector>

#include "tessel/core/error.h"

namespace tessel::ckpt {

void check_parameters(const CheckpointSource& source, const nn::Model& model) {
  const Manifest& m = source.manifest();
  for (const nn::Parameter* p : model.parameters()) {
    auto it = std::find_if(m.parameters.begin(), m.parameters.end(),
                           [&](const TensorSpec& t) { return t.name == p->name; });
    if (it == m.parameters.end() || it->shape != p->full_shape())
      throw IoError(str("checkpoint: ", source.dir(), " has ",
                        it == m.parameters.end()
                            ? str("no parameter '", p->name, "'")
                            : str("'", p->name, "' of shape ", shape_str(it->shape)),
                        " but the model needs ", shape_str(p->full_shape()),
                        "; the checkpoint was saved from a different model config"));
  }
}

void read_range(const CheckpointSource& source, const nn::Model& model, const std::string& prefix,
                nn::Range r, float* dst) {
  for (const nn::Run& run : model.runs(r))
    source.read(prefix + model.parameters()[run.param]->name, run.logical, run.count,
                dst + (run.local - r.lo));
}

void load_weights(const CheckpointSource& source, nn::Model& model) {
  check_parameters(source, model);
  const std::vector<nn::Parameter*>& params = model.parameters();
  for (size_t k = 0; k < params.size(); ++k)  // a tensor-parallel cut reads its own elements
    if (params[k]->value.defined())
      read_range(source, model, "", model.param_range(k), params[k]->value.data<float>());
}

}  // namespace tessel::ckpt
