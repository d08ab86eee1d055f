#!/usr/bin/env python3
"""PyTorch GPT training written to match tessel's gpt model, for bench/gpu/gpu_gpt: tokens/s,
MFU and peak memory of PyTorch on the same card and the same token file as tessel.

The model is tessel's (src/nn/gpt.cc): learned token and position tables, pre-LN blocks (LayerNorm
eps 1e-5; qkv, attention projection, MLP 4C with GELU tanh, all with biases), a final LayerNorm,
the LM head tied to the token table; init N(0, 0.02), the two projections N(0, 0.02 / sqrt(2L)),
biases 0. Training as tessel's: AdamW (fused on CUDA) on every parameter with one weight decay, as
tessel's AdamW; clipping at the global norm; the lr warm-up of tessel's schedule (linear from 0).
bf16 autocast, attention by SDPA, forced to its flash kernel on CUDA. Batches: the token file's
non-overlapping windows of context + 1 tokens (tessel's samples) in a seeded random order, loaded
onto the device before the timed part. Modes: eager and torch.compile (inductor, default mode;
it compiles during the warm-up steps).

MFU = tokens/s x FLOPs per token / peak. FLOPs per token = 6 N + 12 L C T (nanoGPT's and
llm.c's count: N the parameters without the position table, the tied head counted once; the
attention term counts the whole T x T, not the causal half); peak 989 TFLOP/s, the H100/H200
SXM dense bf16 figure (--peak-tflops to change). One JSON line per mode, then a table.

    bench/gpu/torch_gpt2.py --model gpt2 --data gpt2_tokens.bin               # 124M, B 16 x 1024
    bench/gpu/torch_gpt2.py --model char --data char_tokens.bin --modes eager  # 10.8M, B 64 x 256
    bench/gpu/torch_gpt2.py --model gpt2 --device cpu --layers 2 --heads 2 --embed 32 \\
        --context 32 --batch 4 --steps 3 --warmup 1 --data t.bin      # a tiny CPU check
"""
import argparse
import json
import math
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

# Presets: the GPT-2 124M and char GPT (10.8M parameters with a 65-token vocabulary).
MODELS = {
    "gpt2": dict(layers=12, heads=12, embed=768, context=1024, batch=16, vocab=50304),
    "char": dict(layers=6, heads=6, embed=384, context=256, batch=64, vocab=0),
}
MAGIC16, MAGIC32 = 20240520, 20240801


def read_token_file(path):
    """The tokens of an llm.c token file (the header checked as tessel checks it)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 1024:
        sys.exit(f"torch_gpt2: {path} is shorter than a token file's 1024-byte header")
    magic, version, count = struct.unpack("<3i", raw[:12])
    width = {(MAGIC16, 1): 2, (MAGIC32, 7): 4}.get((magic, version))
    if width is None or len(raw) != 1024 + count * width:
        sys.exit(f"torch_gpt2: {path} is not a token file (magic {magic}, version {version}, "
                 f"{count} tokens, {len(raw)} bytes); write one with bench/gpu/make_tokens.py")
    dtype = torch.int16 if width == 2 else torch.int32
    ids = torch.frombuffer(bytearray(raw[1024:]), dtype=dtype).to(torch.int64)
    return ids & 0xFFFF if width == 2 else ids


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, layers, heads, embed, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embed), nn.Embedding(context, embed)
        self.blocks = nn.Sequential(*[Block(embed, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(embed)
        proj_std = 0.02 / math.sqrt(2 * layers)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = proj_std if name.endswith(("proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[:ids.shape[1]]
        return F.linear(self.ln(self.blocks(x)), self.wte.weight)  # the head is the token table


def flops_per_token(model, layers, embed, context):
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n + 12 * layers * embed * context


def run_mode(mode, cfg, ids, args, device):
    torch.manual_seed(args.seed)
    L, H, C, T, B, V = (cfg[k] for k in ("layers", "heads", "embed", "context", "batch", "vocab"))
    model = Gpt(V, L, H, C, T).to(device)
    params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(model, L, C, T)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=device.type == "cuda")
    step_fn = torch.compile(model) if mode == "compile" else model
    windows = (len(ids) - 1) // T
    total = args.warmup + args.steps
    if windows < B:
        sys.exit(f"torch_gpt2: the token file holds {windows} windows of {T} + 1 tokens, fewer "
                 f"than one batch of {B}; write a longer one")
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.cat([torch.randperm(windows, generator=gen)
                       for _ in range(math.ceil(total * B / windows))])[:total * B]
    starts = (order * T).view(total, B, 1) + torch.arange(T + 1)
    batches = ids[starts].to(device)  # [steps, B, T + 1]: every batch on the device up front
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses = []

    def step(i):
        for g in opt.param_groups:  # tessel's warm-up: lr x step / warmup_steps
            g["lr"] = args.lr * min(1.0, i / args.lr_warmup) if args.lr_warmup else args.lr
        x, y = batches[i, :, :-1], batches[i, :, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16):  # cross-entropy runs in f32
            loss = F.cross_entropy(step_fn(x).view(-1, V), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t_compile = time.perf_counter()
    for i in range(args.warmup):
        step(i)
    sync()
    t0 = time.perf_counter()
    for i in range(args.warmup, total):
        step(i)
    sync()
    seconds = time.perf_counter() - t0
    tokens_per_s = args.steps * B * T / seconds
    peak = args.peak_tflops * 1e12
    return {
        "impl": "pytorch", "version": torch.__version__, "model": args.model, "mode": mode,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "layers": L, "heads": H, "embed": C, "context": T, "batch": B, "vocab": V,
        "parameters": params, "flops_per_token": fpt, "steps": args.steps,
        "warmup_steps": args.warmup, "warmup_seconds": t0 - t_compile, "seconds": seconds,
        "tokens_per_second": tokens_per_s,
        "mfu": tokens_per_s * fpt / peak if device.type == "cuda" else None,
        "peak_tflops": args.peak_tflops,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device)
        if device.type == "cuda" else None,
        "losses": [round(float(l), 5) for l in losses],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    ap.add_argument("--data", required=True, help="token file (llm.c format)")
    ap.add_argument("--modes", default="eager,compile", help="eager, compile or both")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compiling)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--lr-warmup", type=int, default=700, help="tessel's schedule.warmup_steps")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--seed", type=int, default=1)
    for k in ("layers", "heads", "embed", "context", "batch", "vocab"):
        ap.add_argument(f"--{k}", type=int, help=f"override the preset's {k}")
    args = ap.parse_args()
    modes = args.modes.split(",")
    if not modes or any(m not in ("eager", "compile") for m in modes):
        ap.error(f"--modes takes eager, compile or eager,compile, got {args.modes}")
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup must be >= 1 (the first step of a mode is never timed)")
    cfg = dict(MODELS[args.model])
    cfg.update({k: getattr(args, k) for k in cfg if getattr(args, k) is not None})
    ids = read_token_file(args.data)
    largest = int(ids.max()) + 1
    cfg["vocab"] = cfg["vocab"] or largest  # tessel: data.classes, else the largest id + 1
    if cfg["vocab"] < largest:
        sys.exit(f"torch_gpt2: vocab {cfg['vocab']} is below the file's largest id + 1 = {largest}")
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("torch_gpt2: no CUDA device; use --device cpu for a (slow) check")
        torch.backends.cuda.enable_flash_sdp(True)  # flash attention only: an error otherwise
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    results = []
    for mode in modes:
        r = run_mode(mode, cfg, ids, args, device)
        results.append(r)
        print(json.dumps(r), flush=True)
        torch._dynamo.reset()  # the next mode starts from nothing compiled or cached
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\n{'model':6} {'mode':8} {'params':>12} {'tokens/s':>12} {'MFU':>7} {'peak MiB':>9}")
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        mem = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] else "-"
        print(f"{r['model']:6} {r['mode']:8} {r['parameters']:12d} "
              f"{r['tokens_per_second']:12.0f} {mfu:>7} {mem:>9}")


if __name__ == "__main__":
    main()
