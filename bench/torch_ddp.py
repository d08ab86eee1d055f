#!/usr/bin/python3
"""PyTorch 1.13 DistributedDataParallel reference for bench/ddp_scaling: the models and real
Fashion-MNIST batches of torch_reference.py, trained by N processes x 1 thread over gloo on the
loopback, global batch 128 (each process 128/N rows), SGD lr 0.05 momentum 0.9.

    /usr/bin/python3 bench/torch_ddp.py --model fashion_mlp --workers 2 [--steps 300]
        [--warmup 20]

Prints one JSON line (from rank 0) with the global samples per second over the timed steps.
Batches are loaded before timing, as tessel's samples_per_second excludes data waits.
"""
import os

# Debian's torch runs its matmuls in OpenBLAS, whose thread count torch.set_num_threads does not
# bind: pin it before torch loads OpenBLAS, here and (inherited) in every spawned process.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# gloo otherwise resolves the hostname to pick an interface; only the loopback is wanted.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

# Import torch_reference's models and batches from beside this file, leaving no bytecode there.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from torch_reference import load_batches, make_model  # noqa: E402

GLOBAL_BATCH = 128
N_BATCHES = 16


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, model_name, steps, warmup):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, flat = make_model(model_name)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    local = GLOBAL_BATCH // world
    # This rank's rows of each global batch, as a sampler would split it.
    batches = [(x[rank * local:(rank + 1) * local].contiguous(),
                y[rank * local:(rank + 1) * local].contiguous())
               for x, y in load_batches(N_BATCHES, GLOBAL_BATCH, flat)]

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()

    for i in range(warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    dist.barrier()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(json.dumps({"impl": "pytorch-ddp", "version": torch.__version__,
                          "backend": "gloo", "model": model_name, "workers": world,
                          "threads_per_worker": 1, "batch": GLOBAL_BATCH, "steps": steps,
                          "seconds": elapsed.item(),
                          "samples_per_second": steps * GLOBAL_BATCH / elapsed.item()}),
              flush=True)
    # Tearing gloo down (destroy_process_group, or freeing the DDP reducer and process group on
    # return) now and then leaves a process spinning forever after its peer has exited: leave
    # without running destructors. No collective is pending after the all_reduce above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="fashion_mlp", choices=["fashion_mlp", "fashion_cnn"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    if args.workers < 1 or GLOBAL_BATCH % args.workers:
        raise SystemExit(f"torch_ddp: --workers must divide the global batch {GLOBAL_BATCH}, "
                         f"got {args.workers}; use 1, 2, 4 or 8")
    mp.spawn(worker, nprocs=args.workers, join=True,
             args=(args.workers, free_port(), args.model, args.steps, args.warmup))


if __name__ == "__main__":
    main()
