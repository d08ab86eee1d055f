// One ISA level's GELU, causal softmax and LayerNorm kernels (kernels.h): the loops of
// activation_loops.h and layernorm_loops.h, compiled with that level's flags so that the compiler
// vectorises them for it. Included once inside each level's namespace, by the translation unit
// that carries the level's flags (elementwise.cc for portable, elementwise_<level>.cc); it
// therefore has no include guard and includes nothing.

void gelu_forward(float* y, const float* x, int64_t n) { detail::gelu_forward_loop(y, x, n); }

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  detail::gelu_backward_loop(dx, dy, x, n);
}

void causal_softmax(float* p, int64_t rows, int64_t ld, int64_t first, int64_t keys) {
  detail::causal_softmax_loop(p, rows, ld, first, keys);
}

void causal_softmax_backward(float* d, const float* p, int64_t rows, int64_t ld, int64_t first,
                             int64_t keys, float scale) {
  detail::causal_softmax_backward_loop(d, p, rows, ld, first, keys, scale);
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C) {
  detail::layernorm_forward_loop(y, mean, rstd, x, w, b, N, C);
}

void layernorm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  detail::layernorm_backward_loop(dx, dw, db, dy, x, w, mean, rstd, N, C);
}
