#!/usr/bin/env python3
"""Does the planner's calibration repeat? Calibrates each config twice, back to back, into two
fresh cache folders (`tessel plan --cache-dir`; ~/.cache/tessel/plan is not touched) and prints
every time figure of the two side by side: paces and the per-row compute by their relative
difference, the additive costs (seconds per step or per message) by their difference over the
one-rank step of the config's batch, which is what they move a prediction by.

  flock /tmp/tessel-bench.lock python3 bench/plan_validate/calibrate_twice.py \\
      --tessel build/apps/tessel/tessel --config examples/char_gpt.toml
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import machine_line  # noqa: E402  (bench/machine.py)

# figures a relative difference describes, and additive seconds (over the one-rank step)
RELATIVE = ("contention", "contention_crowded", "link_bytes_per_s")
ADDITIVE = ("dp_step_s", "handoff_s", "dp_step_crowded_s", "handoff_crowded_s")


def calibrate(tessel, config, cache):
    """The calibration `tessel plan` writes into the empty folder `cache`, and its wall time."""
    start = time.time()
    subprocess.run([tessel, "plan", config, "--workers", "2", "--json", "--cache-dir", cache],
                   check=True, capture_output=True, text=True)
    (name,) = os.listdir(cache)
    return json.load(open(os.path.join(cache, name))), time.time() - start


def figures(cal):
    """(name, value, kind) of every time figure: kind 'rel' or 'add'."""
    out = []
    for v in cal["variants"]:
        # the fit's two terms trade off against each other; a step of the batch (and of a
        # quarter of it, a rank's share on 4) is what a prediction takes from them
        tag = f"{v['precision']} {v['recompute']}"
        for rows in (v["rows"], max(1, v["rows"] // 4)):
            out.append((f"{tag} step at {rows} rows", v["step_s_fixed"] +
                        v["step_s_per_row"] * rows, "rel"))
        out.append((f"{tag} step_s_per_row", v["step_s_per_row"], "rel"))
        out.append((f"{tag} step_s_fixed", v["step_s_fixed"], "add"))
    out += [(k, cal[k], "rel") for k in RELATIVE]
    out.append(("tp_time_whole", cal["tp_time_whole"], "abs"))
    out += [(k, cal[k], "add") for k in ADDITIVE]
    return out


def one_rank_step(cal):
    v = next(v for v in cal["variants"] if (v["precision"], v["recompute"]) == ("fp32", "none"))
    return v["step_s_fixed"] + v["step_s_per_row"] * v["rows"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessel", default="build/apps/tessel/tessel")
    ap.add_argument("--config", action="append", required=True)
    a = ap.parse_args()
    print(machine_line(a.tessel) + "\n")
    print("| config | figure | first | second | difference |")
    print("|---|---|---|---|---|")
    worst = []
    for config in a.config:
        with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as two:
            (c1, s1), (c2, s2) = calibrate(a.tessel, config, one), calibrate(a.tessel, config, two)
        step = (one_rank_step(c1) + one_rank_step(c2)) / 2
        name = os.path.basename(config)
        print(f"| {name} | calibration seconds | {s1:.1f} | {s2:.1f} | |")
        for (key, x, kind), (_, y, _) in zip(figures(c1), figures(c2)):
            if kind == "rel":
                d = abs(x - y) / max(1e-12, (x + y) / 2)
            elif kind == "add":
                d = abs(x - y) / step
            else:  # a share already
                d = abs(x - y)
            worst.append((d, f"{name} {key}"))
            print(f"| {name} | {key} | {x:.4g} | {y:.4g} | {100 * d:.1f}% |")
    worst.sort(reverse=True)
    print("\nlargest differences: " + ", ".join(f"{k} {100 * d:.1f}%" for d, k in worst[:5]))
    print(f"load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
