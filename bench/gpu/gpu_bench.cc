// gpu_bench: times tessel's CUDA kernels on the shapes that matter (bf16 GEMM 8192^3, GPT-2
// 124M's linear layers at 16 x 1024 tokens, LayerNorm and causal attention at GPT-2's width:
// cuDNN's fused attention training takes, then the tensor-core GEMM path and the flash kernels)
// and prints one line per measurement, "name<TAB>milliseconds<TAB>TFLOP/s", which
// scripts/gpu_check sets beside bench/gpu/torch_bench.py's lines for the same names.
// `--versions` prints the device and the CUDA runtime, driver and cuBLASLt versions instead;
// `--quick` uses 4 x 1024 tokens. Timing: CUDA events around `iters` launches after `warmup` ones,
// mean per launch.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "tessel/ops/cuda/blas.h"
#include "tessel/ops/cuda/check.h"
#include "tessel/ops/cuda/conv.h"
#include "tessel/ops/cuda/device.h"
#include "tessel/ops/cuda/kernels.h"

namespace {

using namespace tessel;
using namespace tessel::ops::cuda;

double time_ms(cudaStream_t s, int warmup, int iters, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  check_cuda(cudaEventRecord(start, s), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) f();
  check_cuda(cudaEventRecord(stop, s), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iters;
}

void report(const std::string& name, double ms, double flops) {
  std::printf("%s\t%.4f\t%.1f\n", name.c_str(), ms, flops > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0);
  std::fflush(stdout);
}

// Uniform values in [-1, 1) from a host LCG, converted on the device to t: a GEMM on zeros or
// a constant runs at a higher clock than on real data, which would flatter the figures.
void fill_random(void* p, int64_t n, DType t, cudaStream_t s) {
  std::vector<float> h(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(n);
  for (float& v : h) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  DeviceBuffer f32(h.size() * sizeof(float));
  f32.upload(h.data(), h.size() * sizeof(float));
  convert(p, t, f32.get(), DType::kF32, n, s);
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

void bench_gemm(Blas& blas, cudaStream_t s, const std::string& name, int64_t M, int64_t N,
                int64_t K, DType t) {
  const size_t e = dtype_size(t);
  DeviceBuffer a(M * K * e), b(N * K * e), c(M * N * e);
  fill_random(a.get(), M * K, t, s);
  fill_random(b.get(), N * K, t, s);
  // Row-major C[M,N] = A[M,K] @ B[N,K]^T: the layout of a linear layer's forward.
  const double ms = time_ms(s, 3, 10, [&] {
    gemm(blas, s, false, true, M, N, K, 1.0f, {a.get(), t, K}, {b.get(), t, K}, 0.0f,
         {c.get(), t, N});
  });
  report(name, ms, 2.0 * M * N * K);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string why = device_unavailable_reason();
  if (!why.empty()) {
    std::fprintf(stderr, "gpu_bench: %s\n", why.c_str());
    return 2;
  }
  const std::string arg = argc > 1 ? argv[1] : "";
  const bool quick = arg == "--quick";
  try {
    if (arg == "--versions") {  // what this process loaded, for scripts/gpu_check's header
      int runtime = 0, driver = 0;
      check_cuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
      check_cuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
      cudaDeviceProp p{};
      check_cuda(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
      std::printf("device\t%s, sm_%d%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor,
                  p.multiProcessorCount, p.totalGlobalMem / 1073741824.0);
      std::printf("cuda_runtime\t%d (static, linked into the binary)\n", runtime);
      std::printf("cuda_driver\t%d\n", driver);
      std::printf("cublaslt\t%zu (shared library found on LD_LIBRARY_PATH)\n", cublaslt_version());
      std::printf("cudnn\t%zu (shared library found on LD_LIBRARY_PATH)\n", cudnn_version());
      return 0;
    }
    cudaStream_t s;
    check_cuda(cudaStreamCreate(&s), "cudaStreamCreate");
    Blas blas;
    const DType bf = DType::kBF16;
    bench_gemm(blas, s, "gemm_bf16_8192", 8192, 8192, 8192, bf);
    bench_gemm(blas, s, "gemm_f32_4096_notf32", 4096, 4096, 4096, DType::kF32);
    // GPT-2 124M, 16 x 1024 tokens: y[N, OC] = x[N, C] @ w[OC, C]^T.
    const int64_t N = quick ? 4096 : 16384;
    bench_gemm(blas, s, "gpt2_qkv_768x2304", N, 2304, 768, bf);
    bench_gemm(blas, s, "gpt2_attproj_768x768", N, 768, 768, bf);
    bench_gemm(blas, s, "gpt2_fc_768x3072", N, 3072, 768, bf);
    bench_gemm(blas, s, "gpt2_fcproj_3072x768", N, 768, 3072, bf);
    bench_gemm(blas, s, "gpt2_lmhead_768x50304", N, 50304, 768, bf);

    {  // LayerNorm, [16384, 768] bf16: bytes moved are what count.
      const int64_t C = 768;
      DeviceBuffer x(N * C * 2), y(N * C * 2), w(C * 2), b(C * 2), mean(N * 4), rstd(N * 4);
      fill_random(x.get(), N * C, bf, s);
      fill_random(w.get(), C, bf, s);
      fill_random(b.get(), C, bf, s);
      const double ms = time_ms(s, 3, 20, [&] {
        layernorm_forward(y.get(), mean.as<float>(), rstd.as<float>(), x.get(), w.get(), b.get(), N,
                          C, bf, s);
      });
      report("layernorm_fwd_bf16_16384x768", ms, 0.0);
    }
    {  // Causal attention, B=16 (4 quick), T=1024, 12 heads of 64, bf16.
      const int64_t B = N / 1024, T = 1024, C = 768, NH = 12;
      DeviceBuffer qkv(B * T * 3 * C * 2), out(B * T * C * 2), lse(B * NH * T * 4),
          dout(B * T * C * 2), dqkv(B * T * 3 * C * 2);
      fill_random(qkv.get(), B * T * 3 * C, bf, s);
      fill_random(dout.get(), B * T * C, bf, s);
      // Causal: half of the 4 B NH T^2 HS multiply-adds of a full attention (QK^T and PV).
      const double fwd_flops = 2.0 * B * NH * T * T * (C / NH);
      const std::string shape = "_bf16_B" + std::to_string(B) + "_T1024_H12";
      // What training runs at this shape (the kernel table's choice): cuDNN's fused attention,
      // under the names torch_bench.py gives SDPA; then the tensor-core GEMM path (the table's
      // choice where cuDNN refuses) and the flash kernels on CUDA cores.
      // The first ask builds both directions' graphs (host time, once per shape and thread).
      const auto build_start = std::chrono::steady_clock::now();
      const std::string refusal = attention_cudnn_refusal(bf, B, T, C, NH, false) +
                                  attention_cudnn_refusal(bf, B, T, C, NH, true);
      std::printf(
          "attention_cudnn_build\t%.1f ms (host, both graphs)\n",
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - build_start)
              .count());
      if (refusal.empty()) {
        DeviceBuffer ws(std::max(attention_cudnn_workspace_bytes(B, T, C, NH, false),
                                 attention_cudnn_workspace_bytes(B, T, C, NH, true)) +
                        1);
        report("attention_fwd" + shape,
               time_ms(s, 2, 5,
                       [&] {
                         attention_cudnn_forward(ws.get(), out.get(), lse.as<float>(), qkv.get(), B,
                                                 T, C, NH, s);
                       }),
               fwd_flops);
        report("attention_bwd" + shape,
               time_ms(s, 1, 3,
                       [&] {
                         attention_cudnn_backward(ws.get(), dqkv.get(), dout.get(), qkv.get(),
                                                  out.get(), lse.as<float>(), B, T, C, NH, s);
                       }),
               2.5 * fwd_flops);
      } else {
        std::printf("attention_cudnn\trefused: %s\n", refusal.c_str());
      }
      const size_t scratch_bytes = attention_gemm_scratch_bytes(B, T, NH);
      DeviceBuffer scratch(scratch_bytes);
      const double fwd = time_ms(s, 2, 5, [&] {
        attention_gemm_forward(blas, scratch.get(), scratch_bytes, out.get(), lse.as<float>(),
                               qkv.get(), B, T, C, NH, bf, s);
      });
      report("attention_gemm_fwd" + shape, fwd, fwd_flops);
      const double bwd = time_ms(s, 1, 3, [&] {
        attention_gemm_backward(blas, scratch.get(), scratch_bytes, dqkv.get(), dout.get(),
                                qkv.get(), out.get(), lse.as<float>(), B, T, C, NH, bf, s);
      });
      report("attention_gemm_bwd" + shape, bwd, 2.5 * fwd_flops);
      const double flash_fwd = time_ms(s, 2, 5, [&] {
        attention_forward(out.get(), lse.as<float>(), qkv.get(), B, T, C, NH, bf, s);
      });
      report("attention_flash_fwd" + shape, flash_fwd, fwd_flops);
      const double flash_bwd = time_ms(s, 1, 3, [&] {
        attention_backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.as<float>(), B, T, C,
                           NH, bf, s);
      });
      report("attention_flash_bwd" + shape, flash_bwd, 2.5 * fwd_flops);
    }
    check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    cudaStreamDestroy(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
