// The GELU, causal softmax and LayerNorm kernels at the AVX2 level (elementwise_level.h).
#include "activation_loops.h"
#include "kernels.h"
#include "layernorm_loops.h"

namespace tessel::ops::avx2 {
#include "elementwise_level.h"
}  // namespace tessel::ops::avx2
