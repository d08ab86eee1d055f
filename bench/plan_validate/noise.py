#!/usr/bin/env python3
"""Where the run-to-run spread of a measured step time comes from: each --case trains --steps
steps --repeats times (the cases in turn, so that load which comes and goes falls on all of
them), and from the same runs the median step time (batch over samples/s, records of 5 steps)
is taken over windows of 30, 100, 300 ... steps, starting at step 0 or after a warm-up. For
each case and window it prints the median over the repeats and their spread (max - min over
the median); and the first records against the rest (the warm-up's cost).

  flock /tmp/tessel-bench.lock python3 bench/plan_validate/noise.py \\
      --case 'examples/char_gpt.toml:4:zero.stage=1' --case 'examples/fashion_cnn.toml:2:' \\
      --repeats 5 --steps 400
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine_line  # noqa: E402  (bench/machine.py)
from run import repeats_summary, train_command, train_records  # noqa: E402


def parse_case(text):
    """CONFIG:WORKERS:k=v,k=v -> (config, workers, sets)."""
    config, workers, sets = text.split(":", 2)
    return config, int(workers), [s for s in sets.split(",") if s]


def batch_of(config):
    for line in open(config):
        if line.strip().startswith("batch ="):
            return int(line.split("=")[1].split("#")[0])
    raise SystemExit(f"noise.py: no train.batch in {config}; give it as --batch")


def window_median(recs, batch, first, last):
    """Median step time of the records ending in (first, last]."""
    times = [batch / r["samples_per_second"] for r in recs if first < r["step"] <= last]
    return statistics.median(times) if times else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessel", default="build/apps/tessel/tessel")
    ap.add_argument("--case", action="append", required=True, help="CONFIG:WORKERS:k=v,k=v")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--windows", default="30,100,300")
    a = ap.parse_args()
    print(machine_line(a.tessel) + "\n")
    cases = [parse_case(c) for c in a.case]
    runs = [[] for _ in cases]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.repeats):
            for i, (config, workers, sets) in enumerate(cases):
                folder = os.path.join(tmp, "run")
                recs, err = train_records(
                    train_command(a.tessel, config, workers, sets, a.steps, folder), folder)
                if recs is None:
                    raise SystemExit(f"noise.py: {a.case[i]} failed: {err}")
                runs[i].append(recs)
    windows = [int(w) for w in a.windows.split(",")]
    print("| case | from step | window steps | window s | median ms | spread |")
    print("|---|---|---|---|---|---|")
    for text, (config, _, _), recs_of in zip(a.case, cases, runs):
        batch = batch_of(config)
        for first in (0, a.warmup_steps):
            for w in windows:
                if first + w > a.steps:
                    continue
                m, s = repeats_summary([window_median(r, batch, first, first + w) for r in recs_of])
                print(f"| {text} | {first} | {w} | {w * m:.2f} | {1e3 * m:.2f} | "
                      f"{100 * s:.1f}% |")
        warm = [window_median(r, batch, 0, a.warmup_steps) for r in recs_of]
        rest = [window_median(r, batch, a.warmup_steps, a.steps) for r in recs_of]
        print(f"| {text} | warm-up: steps 1-{a.warmup_steps} | | | "
              f"{1e3 * statistics.median(warm):.2f} against "
              f"{1e3 * statistics.median(rest):.2f} after | |")
    print(f"\nload average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
