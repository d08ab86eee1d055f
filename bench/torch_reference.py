#!/usr/bin/python3
"""PyTorch reference for bench/train_throughput: the same models, batch, optimizer and
real batches (Fashion-MNIST; for char_gpt windows of the fortunes text, tokens as tessel numbers
them), timed the same way (batches loaded before the timed part). char_gpt is tessel's
examples/char_gpt.toml: 2 pre-LN blocks, 4 heads, width 64, context 64, tanh GELU, LM head tied
to the token table, AdamW with clipping at 1.0, batch 32.

    /usr/bin/python3 bench/torch_reference.py [--threads 1] [--steps 100] [--repeats 5]
        [--models fashion_mlp,fashion_cnn,char_gpt] [--compile]

Runs under Debian's python3-torch (1.13, apt-get install python3-torch) or the PyTorch 2.x of
bench/torch2_venv.sh; --compile (2.x only) times torch.compile'd models (the default inductor
backend; compiled during the warm-up steps, before the timed part). PyTorch is a comparison only,
never a dependency of tessel. For more than one thread set OMP_WAIT_POLICY=PASSIVE (measured on the
2-core reference machine: spinning OpenMP threads make PyTorch 3x slower).
"""
import argparse
import gzip
import json
import statistics
import time

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"
TEXT = "/usr/share/games/fortunes/songs-poems"
GPT = dict(layers=2, heads=4, embed=64, context=64, batch=32)
MEAN, STD = 0.2860, 0.3530


def load_batches(n_batches, batch, flat):
    with gzip.open(f"{DATA}/train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28 * 28)
    with gzip.open(f"{DATA}/train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    out = []
    for b in range(n_batches):
        x = (images[b * batch:(b + 1) * batch].astype(np.float32) / 255.0 - MEAN) / STD
        x = torch.from_numpy(x if flat else x.reshape(-1, 1, 28, 28))
        y = torch.from_numpy(labels[b * batch:(b + 1) * batch].astype(np.int64))
        out.append((x, y))
    return out


def load_text_batches(n_batches, batch, context):
    raw = np.frombuffer(open(TEXT, "rb").read(), np.uint8)
    ids = np.searchsorted(np.unique(raw), raw).astype(np.int64)  # rank of the byte, as tessel
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n_batches):
        starts = rng.integers(0, len(ids) - context - 1, batch)
        w = np.stack([ids[s:s + context + 1] for s in starts])
        out.append((torch.from_numpy(w[:, :-1]), torch.from_numpy(w[:, 1:])))
    return out, int(ids.max()) + 1


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
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (C // self.heads) ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, layers, heads, embed, context):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, embed), nn.Embedding(context, embed)
        self.blocks = nn.Sequential(*[Block(embed, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(embed)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[:ids.shape[1]]
        return self.ln(self.blocks(x)) @ self.wte.weight.t()  # the head is the token table


def measure_gpt(steps, repeats, compile_model):
    batches, vocab = load_text_batches(16, GPT["batch"], GPT["context"])
    model = Gpt(vocab, GPT["layers"], GPT["heads"], GPT["embed"], GPT["context"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
    if compile_model:
        model = torch.compile(model)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return timed(step, steps, repeats, GPT["batch"])


def timed(step, steps, repeats, batch):
    for i in range(10):
        step(i)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        rates.append(steps * batch / (time.perf_counter() - t0))
    return statistics.median(rates)


def make_model(name):
    if name == "fashion_mlp":
        return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                             nn.Linear(256, 10)), True
    if name == "fashion_cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                             nn.Linear(128, 10)), False
    raise SystemExit(f"torch_reference: unknown model {name}")


def measure(name, steps, repeats, compile_model):
    model, flat = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if compile_model:
        model = torch.compile(model)
    loss_fn = nn.CrossEntropyLoss()
    batches = load_batches(16, 128, flat)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return timed(step, steps, repeats, 128)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default="fashion_mlp,fashion_cnn,char_gpt")
    ap.add_argument("--compile", action="store_true", help="time torch.compile'd models")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name in args.models.split(","):
        if name == "char_gpt":
            sps, batch = measure_gpt(args.steps, args.repeats, args.compile), GPT["batch"]
        else:
            sps, batch = measure(name, args.steps, args.repeats, args.compile), 128
        print(json.dumps({"impl": "pytorch", "version": torch.__version__, "model": name,
                          "mode": "compile" if args.compile else "eager",
                          "threads": args.threads, "batch": batch, "samples_per_second": sps}),
              flush=True)


if __name__ == "__main__":
    main()
