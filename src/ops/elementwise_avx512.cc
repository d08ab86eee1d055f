// The GELU, causal softmax and LayerNorm kernels at the AVX-512 level (elementwise_level.h).
#include "activation_loops.h"
#include "kernels.h"
#include "layernorm_loops.h"

namespace tessel::ops::avx512 {
#include "elementwise_level.h"
}  // namespace tessel::ops::avx512
