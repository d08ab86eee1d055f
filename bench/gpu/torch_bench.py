"""PyTorch on the same card, the same shapes and names as gpu_bench (bench/gpu/gpu_bench.cc).

Prints "name<TAB>milliseconds<TAB>TFLOP/s" per line; scripts/gpu_check joins both outputs.
Timing as gpu_bench: CUDA events around `iters` calls after `warmup`, mean per call. PyTorch's
defaults otherwise (cuBLAS/cuBLASLt for matmul, SDPA's flash kernel for causal attention).
"""
import sys

import torch
import torch.nn.functional as F


def time_ms(f, warmup, iters):
    for _ in range(warmup):
        f()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        f()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def report(name, ms, flops):
    print(f"{name}\t{ms:.4f}\t{flops / (ms * 1e-3) / 1e12 if flops else 0.0:.1f}", flush=True)


def rand(*shape, dtype=torch.bfloat16):
    return torch.rand(*shape, device="cuda", dtype=torch.float32).mul_(2).sub_(1).to(dtype)


def bench_gemm(name, M, N, K, dtype=torch.bfloat16):
    a, b = rand(M, K, dtype=dtype), rand(N, K, dtype=dtype)
    ms = time_ms(lambda: F.linear(a, b), 3, 10)  # C = A @ B^T, as gpu_bench
    report(name, ms, 2.0 * M * N * K)


def main():
    quick = "--quick" in sys.argv
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    bench_gemm("gemm_bf16_8192", 8192, 8192, 8192)
    bench_gemm("gemm_f32_4096_notf32", 4096, 4096, 4096, torch.float32)
    N = 4096 if quick else 16384
    bench_gemm("gpt2_qkv_768x2304", N, 2304, 768)
    bench_gemm("gpt2_attproj_768x768", N, 768, 768)
    bench_gemm("gpt2_fc_768x3072", N, 3072, 768)
    bench_gemm("gpt2_fcproj_3072x768", N, 768, 3072)
    bench_gemm("gpt2_lmhead_768x50304", N, 50304, 768)

    C = 768
    x, w, b = rand(N, C), rand(C), rand(C)
    ms = time_ms(lambda: F.layer_norm(x, (C,), w, b, 1e-5), 3, 20)
    report("layernorm_fwd_bf16_16384x768", ms, 0.0)

    B, T, NH, HS = N // 1024, 1024, 12, 64
    q, k, v = (rand(B, NH, T, HS).requires_grad_() for _ in range(3))
    fwd_flops = 2.0 * B * NH * T * T * HS
    with torch.no_grad():
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 2, 5)
    report(f"attention_fwd_bf16_B{B}_T1024_H12", ms, fwd_flops)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = rand(B, NH, T, HS)
    ms = time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), 1, 3)
    report(f"attention_bwd_bf16_B{B}_T1024_H12", ms, 2.5 * fwd_flops)


if __name__ == "__main__":
    main()
