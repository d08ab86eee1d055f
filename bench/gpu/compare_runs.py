#!/usr/bin/env python3
"""Compares two tessel run folders step by step: the training loss of every step both logged
(metrics.jsonl "train" records; run with train.log_every=1 to have each step's loss) and,
with --same-params, the final parameters' digest (summary.json params_sha256).

Prints one line, "ok" or "FAIL" first, and exits 0 (within bounds), 1 (outside them) or 2 (a
folder that is not a finished run). scripts/gpu_check uses it for the GPU-vs-CPU equivalence
runs (fp32: --rtol 1e-4; bf16: --rtol 0.01) and the determinism check (--same-params).

    bench/gpu/compare_runs.py RUN_A RUN_B [--rtol 1e-4] [--same-params]
"""
import argparse
import json
import os
import sys


def fail_input(msg):
    print(f"FAIL compare_runs: {msg}")
    sys.exit(2)


def step_losses(run):
    """{step: loss} of a run's train records, and its summary."""
    metrics, summary = os.path.join(run, "metrics.jsonl"), os.path.join(run, "summary.json")
    for f in (metrics, summary):
        if not os.path.isfile(f):
            fail_input(f"{f} is missing: {run} is not a finished tessel run folder")
    losses = {}
    with open(metrics) as f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                fail_input(f"{metrics}:{n} is not JSON ({e})")
            if rec.get("type") == "train":
                losses[rec["step"]] = rec["loss"]
    with open(summary) as f:
        return losses, json.load(f)


def compare(run_a, run_b, rtol, same_params):
    """(ok, message) for two run folders."""
    (la, sa), (lb, sb) = step_losses(run_a), step_losses(run_b)
    steps = sorted(set(la) & set(lb))
    if not steps:
        fail_input(f"no step logged by both {run_a} ({len(la)} train records) and {run_b} "
                   f"({len(lb)})")
    worst, at = 0.0, steps[0]
    for s in steps:
        rel = abs(la[s] - lb[s]) / max(abs(lb[s]), 1e-30)
        if rel > worst or rel != rel:  # NaN counts as the worst
            worst, at = rel, s
    ok = worst <= rtol
    msg = (f"max relative loss difference {worst:.3g} at step {at} over {len(steps)} steps "
           f"(bound {rtol:g}; losses {la[at]:.6g} vs {lb[at]:.6g})")
    if same_params:
        same = sa.get("params_sha256") == sb.get("params_sha256") and sa.get("params_sha256")
        ok = ok and bool(same)
        msg += (f"; params_sha256 {'equal' if same else 'DIFFER'} "
                f"({str(sa.get('params_sha256'))[:12]} vs {str(sb.get('params_sha256'))[:12]})")
    return ok, msg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b", help="the reference: relative differences are to its losses")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--same-params", action="store_true",
                    help="also require the same params_sha256 (deterministic runs)")
    a = ap.parse_args()
    ok, msg = compare(a.run_a, a.run_b, a.rtol, a.same_params)
    print(("ok " if ok else "FAIL ") + msg)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
