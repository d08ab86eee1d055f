#!/usr/bin/python3
"""PyTorch 1.13 reference for bench/train_throughput: the same models, batch, optimizer and
real Fashion-MNIST batches, timed the same way (batches loaded before the timed part).

    /usr/bin/python3 bench/torch_reference.py [--threads 1] [--steps 100] [--repeats 5]
        [--models fashion_mlp,fashion_cnn]

Needs Debian's python3-torch (apt-get install python3-torch); PyTorch is a comparison only,
never a dependency of tessel. For more than one thread set OMP_WAIT_POLICY=PASSIVE (see
../shared/MACHINE_NOTES.md: spinning OpenMP threads on 2 cores make PyTorch 3x slower).
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


def measure(name, steps, repeats):
    model, flat = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = load_batches(16, 128, flat)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for i in range(10):
        step(i)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        rates.append(steps * 128 / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default="fashion_mlp,fashion_cnn")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    for name in args.models.split(","):
        sps = measure(name, args.steps, args.repeats)
        print(json.dumps({"impl": "pytorch", "version": torch.__version__, "model": name,
                          "threads": args.threads, "batch": 128, "samples_per_second": sps}))


if __name__ == "__main__":
    main()
