#!/usr/bin/python3
"""PyTorch peer of tessel on a table (bench/tables/run.sh): an MLP of the same shape trained
the same way -- features normalised by the train rows' mean and std, Linear layers with ReLU,
AdamW (no weight decay), constant lr, shuffled batches, the given epochs -- then evaluated on
the test table. Classification prints the test accuracy, regression the test MSE, multilabel
(y [N, K] of 0/1, BCEWithLogitsLoss) the test accuracy averaged over rows and labels, as JSON.

    /usr/bin/python3 bench/tables/torch_table.py --train TRAIN.npz --test TEST.npz
        --hidden 64,64 --epochs 20 --batch 64 --lr 0.003 [--regression | --multilabel] [--seed 1]
"""
import argparse
import json

import numpy as np
import torch
from torch import nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--hidden", default="64,64")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--regression", action="store_true")
    p.add_argument("--multilabel", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    train, test = np.load(a.train), np.load(a.test)
    x, xt = train["x"].astype(np.float64), test["x"].astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std <= 1e-12 * np.maximum(1.0, np.abs(mean))] = 1.0
    x = torch.tensor((x - mean) / std, dtype=torch.float32)
    xt = torch.tensor((xt - mean) / std, dtype=torch.float32)
    if a.regression or a.multilabel:
        y, yt = (torch.tensor(train["y"], dtype=torch.float32),
                 torch.tensor(test["y"], dtype=torch.float32))
        out = y.shape[1] if a.multilabel else 1
    else:
        y, yt = torch.tensor(train["y"]).long(), torch.tensor(test["y"]).long()
        out = int(max(y.max(), yt.max())) + 1
    layers, width = [], x.shape[1]
    for h in [int(v) for v in a.hidden.split(",") if v]:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, out))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    loss_fn = (nn.MSELoss() if a.regression else
               nn.BCEWithLogitsLoss() if a.multilabel else nn.CrossEntropyLoss())
    for _ in range(a.epochs):
        order = torch.randperm(len(x))
        for i in range(0, len(x), a.batch):
            b = order[i:i + a.batch]
            pred = model(x[b])
            loss = loss_fn(pred[:, 0] if a.regression else pred, y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        pred = model(xt)
        if a.regression:
            print(json.dumps({"test_mse": float(((pred[:, 0] - yt) ** 2).mean())}))
        elif a.multilabel:
            print(json.dumps({"test_accuracy": float(((pred > 0).float() == yt).float().mean())}))
        else:
            print(json.dumps({"test_accuracy": float((pred.argmax(1) == yt).float().mean())}))


if __name__ == "__main__":
    main()
