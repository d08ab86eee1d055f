// Causal attention through cuDNN's fused flash attention (cuDNN 9's SDPA, reached through
// cudnn-frontend's graphs). Q, K and V are read in place from qkv[B,T,3C] as [B,NH,T,HS] views
// (strides, no copies) and out[B,T,C] is written the same way. The forward keeps cuDNN's softmax
// statistics, the log-sum-exp of each query row's scaled scores: the lse[B,NH,T] the flash and
// GEMM paths keep. The backward runs cuDNN's deterministic algorithm (one summation order, so
// two runs give the same bits, as kernels.h promises of every kernel).
// Each direction of a shape is built at its first use on a thread (heuristics, then the plan;
// its time is not measured yet) and kept for the thread, as blas.cc keeps its plans; a direction
// that this cuDNN cannot run keeps cuDNN's reason instead (attention_cudnn_refusal), and the
// kernel table then takes another path for it (the cache and contract are the same).
#include <cudnn_frontend.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>

#include "cudnn_handle.h"
#include "tessel/ops/cuda/check.h"
#include "tessel/ops/cuda/kernels.h"

namespace tessel::ops::cuda {
namespace {

namespace fe = cudnn_frontend;
using fe::graph::Graph;
using Attr = fe::graph::Tensor_attributes;
using TensorPtr = std::shared_ptr<Attr>;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Shape {
  int64_t B, T, C, NH;
  int64_t hs() const { return C / NH; }
};

// The [B, NH, T, HS] view of a row-major [B, T, width] activation whose head h sits at columns
// h HS (plus the q/k/v part's offset, given as the pointer).
TensorPtr view(Graph& g, Uid uid, const Shape& s, int64_t width) {
  return g.tensor(Attr()
                      .set_name("t" + std::to_string(uid))
                      .set_uid(uid)
                      .set_dim({s.B, s.NH, s.T, s.hs()})
                      .set_stride({s.T * width, s.hs(), width, 1}));
}

void set_view(const TensorPtr& t, Uid uid, const Shape& s, int64_t width) {
  t->set_output(true)
      .set_uid(uid)
      .set_dim({s.B, s.NH, s.T, s.hs()})
      .set_stride({s.T * width, s.hs(), width, 1});
}

// lse[B, NH, T] (f32) as cuDNN's [B, NH, T, 1] statistics.
void set_stats(const TensorPtr& t, const Shape& s) {
  t->set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim({s.B, s.NH, s.T, 1})
      .set_stride({s.NH * s.T, s.T, 1, 1});
}

std::shared_ptr<Graph> new_graph() {
  auto g = std::make_shared<Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float scale(const Shape& s) { return 1.0f / std::sqrt(static_cast<float>(s.hs())); }

std::shared_ptr<Graph> forward_graph(const Shape& s) {
  auto g = new_graph();
  const TensorPtr q = view(*g, kQ, s, 3 * s.C), k = view(*g, kK, s, 3 * s.C),
                  v = view(*g, kV, s, 3 * s.C);
  auto [o, stats] = g->sdpa(q, k, v,
                            fe::graph::SDPA_attributes()
                                .set_name("attention")
                                .set_generate_stats(true)
                                .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                                .set_diagonal_band_right_bound(0)
                                .set_attn_scale(scale(s)));
  set_view(o, kO, s, s.C);
  stats->set_output(true);
  set_stats(stats, s);
  return g;
}

std::shared_ptr<Graph> backward_graph(const Shape& s) {
  auto g = new_graph();
  const int64_t C3 = 3 * s.C;
  const TensorPtr q = view(*g, kQ, s, C3), k = view(*g, kK, s, C3), v = view(*g, kV, s, C3),
                  o = view(*g, kO, s, s.C), dout = view(*g, kDO, s, s.C);
  TensorPtr stats = g->tensor(Attr().set_name("stats"));
  set_stats(stats, s);
  auto [dq, dk, dv] =
      g->sdpa_backward(q, k, v, o, dout, stats,
                       fe::graph::SDPA_backward_attributes()
                           .set_name("attention_backward")
                           .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                           .set_diagonal_band_right_bound(0)
                           .set_attn_scale(scale(s))
                           .set_deterministic_algorithm(true));
  set_view(dq, kDQ, s, C3);
  set_view(dk, kDK, s, C3);
  set_view(dv, kDV, s, C3);
  return g;
}

// Builds g's plan; "" when it is ready, else cuDNN's reason for the first step that failed.
std::string build(Graph& g, cudnnHandle_t h) {
  fe::error_t e = g.validate();
  if (e.is_good()) e = g.build_operation_graph(h);
  if (e.is_good()) e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (e.is_good()) e = g.check_support(h);
  if (e.is_good()) e = g.build_plans();
  return e.is_good() ? "" : e.get_message();
}

// One direction of one shape on this thread: its graph and workspace, or (graph null) the
// reason cuDNN refused it.
struct Built {
  std::shared_ptr<Graph> graph;
  std::string refusal;
  size_t workspace = 0;
};

Built make(const Shape& s, bool backward, cudnnHandle_t h) {
  Built b;
  std::string why;
  try {  // the frontend throws for a few malformed graphs
    std::shared_ptr<Graph> g = backward ? backward_graph(s) : forward_graph(s);
    why = build(*g, h);
    int64_t bytes = 0;
    if (why.empty() && !g->get_workspace_size(bytes).is_good()) why = "no workspace size";
    if (why.empty()) {
      b.graph = std::move(g);
      b.workspace = static_cast<size_t>(bytes);
      return b;
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  b.refusal = str("cuDNN ", cudnnGetVersion(), " refuses the ", backward ? "backward" : "forward",
                  ": ", why);
  return b;
}

// Built at the first ask and kept. The handle is made first, so that (destroyed in reverse
// order) it outlives the graphs.
const Built& built(const Shape& s, bool backward) {
  thread_local const cudnnHandle_t h = cudnn_handle(nullptr);  // once a thread, not every call
  thread_local std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>, Built> cache;
  const auto key = std::tuple(s.B, s.T, s.C, s.NH, backward);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  return cache.emplace(key, make(s, backward, h)).first->second;
}

const Built& ready(const Shape& s, bool backward, const char* what) {
  const Built& b = built(s, backward);
  if (!b.graph)
    throw InvalidArgument(str(what, ": B=", s.B, " T=", s.T, " C=", s.C, " NH=", s.NH, ": ",
                              b.refusal, "; ask attention_cudnn_refusal first"));
  return b;
}

void execute(const Graph& g, std::unordered_map<int64_t, void*>& pack, void* workspace,
             cudaStream_t stream, const char* what) {
  fe::error_t e = g.execute(cudnn_handle(stream), pack, workspace);
  if (!e.is_good())
    throw CudaError(str("cudnn: ", what, " failed: ", e.get_message(),
                        "; check the shapes against include/tessel/ops/cuda/kernels.h"));
}

// qkv's q, k and v parts (bf16: 2 bytes a value).
void* part(const void* qkv, int i, int64_t C) {
  return static_cast<char*>(const_cast<void*>(qkv)) + 2 * i * C;
}

}  // namespace

std::string attention_cudnn_refusal(DType t, int64_t B, int64_t T, int64_t C, int64_t NH,
                                    bool backward) {
  if (t != DType::kBF16) return "cuDNN's fused attention takes 16-bit inputs (f32 stays exact)";
  if (B <= 0 || T <= 0 || NH <= 0 || C % NH != 0) return "not a shape of attention";
  try {
    return built({B, T, C, NH}, backward).refusal;
  } catch (const CudaError& e) {  // no cuDNN handle on this thread: the other paths serve
    return e.what();
  }
}

size_t attention_cudnn_workspace_bytes(int64_t B, int64_t T, int64_t C, int64_t NH, bool backward) {
  return ready({B, T, C, NH}, backward, "attention_cudnn_workspace_bytes").workspace;
}

void attention_cudnn_forward(void* workspace, void* out, float* lse, const void* qkv, int64_t B,
                             int64_t T, int64_t C, int64_t NH, cudaStream_t stream) {
  const Built& b = ready({B, T, C, NH}, false, "attention_cudnn_forward");
  std::unordered_map<int64_t, void*> pack{{kQ, part(qkv, 0, C)},
                                          {kK, part(qkv, 1, C)},
                                          {kV, part(qkv, 2, C)},
                                          {kO, out},
                                          {kStats, lse}};
  execute(*b.graph, pack, workspace, stream, "attention forward");
}

void attention_cudnn_backward(void* workspace, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, int64_t B, int64_t T, int64_t C,
                              int64_t NH, cudaStream_t stream) {
  const Built& b = ready({B, T, C, NH}, true, "attention_cudnn_backward");
  std::unordered_map<int64_t, void*> pack{
      {kQ, part(qkv, 0, C)},          {kK, part(qkv, 1, C)},
      {kV, part(qkv, 2, C)},          {kO, const_cast<void*>(out)},
      {kDO, const_cast<void*>(dout)}, {kStats, const_cast<float*>(lse)},
      {kDQ, part(dqkv, 0, C)},        {kDK, part(dqkv, 1, C)},
      {kDV, part(dqkv, 2, C)}};
  execute(*b.graph, pack, workspace, stream, "attention backward");
}

}  // namespace tessel::ops::cuda
