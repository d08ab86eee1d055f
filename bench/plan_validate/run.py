#!/usr/bin/env python3
"""Checks `tessel plan` against measured runs: for each config and worker count, every layout
the plan offers (or the first --limit of them) trains on this machine, and its predicted peak
memory of the fullest rank and step time are set beside the measured ones (the ledger peak in
metrics.jsonl; the median step time, batch over samples/s, of its records of 5 steps past the
first --warmup-steps). Each layout trains the warm-up and then --min-seconds of steps at its
predicted step time (at least --steps in all); --repeats R trains every layout R times, in turn
over the layouts of a case, and reports the median of the R and their spread (largest less
smallest over the median). Prints a Markdown table (docs/planning.md holds one) and the share
within 10% / 15%. With --baseline the step time is also predicted without the group costs of
the calibration (dp_step_s, handoff_s and their _crowded ones set to 0 in a copy of it): the
model before they were added, on the same measurements. With --memory-only the time columns
are left out and each run stops at its first record (memory is deterministic: a few steps,
e.g. --steps 5, measure it; that record's peak includes the set-up).

  flock /tmp/tessel-bench.lock python3 bench/plan_validate/run.py --tessel build/apps/tessel/tessel \
      --config examples/char_gpt.toml --workers 2,4 [--limit 12] [--match 'pp='] \
      [--min-seconds 1] [--repeats 3] [--cache-dir DIR] [--memory-only --steps 5]
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machine import machine_line  # noqa: E402  (bench/machine.py)


def without_pair_costs(cache, into):
    """A copy of the calibrations in `cache` without the costs a 2-rank run adds."""
    os.makedirs(into, exist_ok=True)
    for name in os.listdir(cache):
        cal = json.load(open(os.path.join(cache, name)))
        for key in ("dp_step_s", "handoff_s", "dp_step_crowded_s", "handoff_crowded_s"):
            cal[key] = 0
        json.dump(cal, open(os.path.join(into, name), "w"))


def calibration_lines(cache):
    """The time figures of each calibration in `cache` (of this planner's format), and the
    seconds it took."""
    keys = ("contention", "contention_crowded", "dp_step_s", "handoff_s", "dp_step_crowded_s",
            "handoff_crowded_s", "tp_time_whole", "seconds")
    out = []
    for name in sorted(os.listdir(cache)):
        cal = json.load(open(os.path.join(cache, name)))
        if all(k in cal for k in keys):
            out.append(f"- {name} ({cal['arena_numel']:.0f} parameters): " +
                       ", ".join(f"{k} {cal[k]:.3g}" for k in keys))
    return out


def plan(tessel, config, workers, cache):
    out = subprocess.run([tessel, "plan", config, "--workers", str(workers), "--json",
                          "--cache-dir", cache], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["layouts"]


def train_command(tessel, config, workers, sets, steps, folder, log_every=5):
    cmd = [tessel, "train", config, "--workers", str(workers), "--quiet", "--overwrite",
           "--run-dir", folder, "--set", f"train.max_steps={steps}",
           "--set", f"train.log_every={min(log_every, steps)}",
           "--set", "checkpoint.every_epochs=0"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def train_records(cmd, folder, first_record_only=False):
    """The train records of metrics.jsonl after running `cmd` (stopped at the first one with
    first_record_only), or (None, the error's last line). Parameter servers are not in the
    train records: their ledger peaks are in summary.json at the end of the run (ledger_peak),
    so such a run (a command without ps.servers=0) is never stopped early."""
    first_record_only = first_record_only and "ps.servers=0" in " ".join(cmd)
    metrics = os.path.join(folder, "metrics.jsonl")

    def recorded():  # a whole train record is in metrics.jsonl
        return os.path.exists(metrics) and any(
            l.endswith("\n") and '"type":"train"' in l for l in open(metrics))

    if first_record_only:  # stopped once the peak is recorded: the test-set pass adds nothing
        if os.path.exists(metrics):
            os.remove(metrics)
        run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while run.poll() is None and not recorded():
            time.sleep(0.1)
        run.kill()
        stderr = run.communicate()[1]
        if not recorded():
            return None, stderr.strip().splitlines()[-1] if stderr.strip() else "failed"
    else:
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            return None, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
    recs = [json.loads(l) for l in open(metrics) if l.endswith("\n")]
    return [r for r in recs if r.get("type") == "train"], ""


def ledger_peak(recs, folder):
    """The largest ledger peak of any rank: the training ranks' in the train records, the
    parameter servers' in the summary (ranks.ps_servers)."""
    peak = max(r.get("memory_peak_bytes_max", 0) for r in recs)
    summary = os.path.join(folder, "summary.json")
    if os.path.exists(summary):
        for s in json.load(open(summary)).get("ranks", {}).get("ps_servers", []):
            peak = max(peak, s["memory"]["peak_total_bytes"])
    return peak


def step_seconds(recs, batch, warmup_steps):
    """The median step time of the records past the first `warmup_steps` steps (all but the
    first record when none is past them): batch over each record's samples/s."""
    late = [r for r in recs if r["step"] > warmup_steps] or recs[1:] or recs
    return statistics.median(batch / r["samples_per_second"] for r in late)


def measure(tessel, config, workers, sets, steps, folder, first_record_only=False):
    """One run of `steps` steps (auto.py's measurement): ((the ledger peak, the median samples/s
    of the records after the first), "") or (None, the error's last line)."""
    recs, err = train_records(train_command(tessel, config, workers, sets, steps, folder), folder,
                              first_record_only)
    if recs is None:
        return None, err
    peak = ledger_peak(recs, folder)
    return (peak, statistics.median(r["samples_per_second"] for r in recs[1:] or recs)), ""


def repeats_summary(values):
    """The median of repeated measurements and their spread: largest less smallest over it."""
    m = statistics.median(values)
    return m, (max(values) - min(values)) / m


def timed_steps(a, predicted_s):
    """Steps for a layout predicted at `predicted_s` a step: the warm-up, then --min-seconds of
    steps (at least --steps in all; at most 4000 for a prediction far too small)."""
    if a.memory_only:
        return a.steps
    return max(a.steps, a.warmup_steps + min(4000, math.ceil(a.min_seconds / predicted_s)))


def measure_case(a, config, workers, layouts, tmp):
    """Each layout's (peak, step seconds of each repeat) or (None, error), the repeats run in
    turn over all the layouts (interleaved: load that comes and goes spreads over them all)."""
    got = [[] for _ in layouts]
    for _ in range(1 if a.memory_only else a.repeats):
        for i, l in enumerate(layouts):
            if got[i] and got[i][0] is None:
                continue  # refused the first time: the same the next
            batch = l["samples_per_second"] * l["step_seconds"]["total"]
            folder = os.path.join(tmp, "run")
            cmd = train_command(a.tessel, config, workers, l["set"],
                                timed_steps(a, l["step_seconds"]["total"]), folder)
            recs, err = train_records(cmd, folder, a.memory_only)
            if recs is None:
                got[i] = [None, err]
                continue
            peak = ledger_peak(recs, folder)
            got[i].append((peak, step_seconds(recs, batch, a.warmup_steps)))
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tessel", default="build/apps/tessel/tessel")
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--limit", type=int, default=0, help="layouts per case (0: all)")
    ap.add_argument("--match", default="", help="only layouts whose 'layout options' match")
    ap.add_argument("--steps", type=int, default=30, help="the fewest steps a run trains")
    ap.add_argument("--min-seconds", type=float, default=1.0,
                    help="seconds of steps past the warm-up (from the predicted step time)")
    ap.add_argument("--warmup-steps", type=int, default=10,
                    help="steps whose records the median leaves out")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each layout, in turn over the layouts: the median and spread")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/tessel/plan"))
    ap.add_argument("--baseline", action="store_true",
                    help="also the step time predicted without the 2-rank calibration costs")
    ap.add_argument("--memory-only", action="store_true", help="no time columns")
    a = ap.parse_args()
    print(machine_line(a.tessel) + "\n")
    extra = " before ms | err |" if a.baseline else ""
    timed = "" if a.memory_only else " step pred ms | step meas ms | spread | err |"
    print("| config | ranks | layout | options | mem pred MiB | mem meas MiB | err |" + timed +
          extra)
    print("|---|---|---|---|---|---|---|" + ("" if a.memory_only else "---|---|---|---|") +
          ("---|---|" if a.baseline else ""))
    mem_ok = time_ok = before_ok = n = 0
    spreads = []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for config in a.config:
            for workers in [int(w) for w in a.workers.split(",")]:
                layouts = plan(a.tessel, config, workers, a.cache_dir)
                before = {}
                if a.baseline:
                    without_pair_costs(a.cache_dir, os.path.join(tmp, "before"))
                    before = {(l["layout"], l["options"]): l["step_seconds"]["total"]
                              for l in plan(a.tessel, config, workers,
                                            os.path.join(tmp, "before"))}
                layouts = [l for l in layouts
                           if re.search(a.match, l["layout"] + " " + l["options"])]
                if a.limit:
                    layouts = layouts[:a.limit]
                name = os.path.basename(config)
                for l, got in zip(layouts, measure_case(a, config, workers, layouts, tmp)):
                    if got[0] is None:
                        print(f"| {name} | {workers} | {l['layout']} | {l['options']} | "
                              f"refused: {got[1]} |||" + ("" if a.memory_only else "||||"))
                        continue
                    peak = max(g[0] for g in got)
                    meas_s, spread = repeats_summary([g[1] for g in got])
                    spreads.append(spread)
                    batch_s = l["step_seconds"]["total"]
                    pred_mem = l["memory_bytes"]["total"]
                    em = (pred_mem - peak) / peak
                    et = (batch_s - meas_s) / meas_s
                    n += 1
                    mem_ok += abs(em) <= 0.10
                    time_ok += abs(et) <= 0.15
                    row = (f"| {name} | {workers} | {l['layout']} | {l['options']} | "
                           f"{pred_mem / 2**20:.2f} | {peak / 2**20:.2f} | {100 * em:+.0f}% |")
                    if not a.memory_only:
                        row += (f" {1e3 * batch_s:.1f} | {1e3 * meas_s:.1f} | "
                                f"{100 * spread:.0f}% | {100 * et:+.0f}% |")
                    if a.baseline:
                        b = before[(l["layout"], l["options"])]
                        eb = (b - meas_s) / meas_s
                        before_ok += abs(eb) <= 0.15
                        row += f" {1e3 * b:.1f} | {100 * eb:+.0f}% |"
                    print(row, flush=True)
    timing = "" if a.memory_only else f", step time within 15% for {time_ok}"
    print(f"\n{n} layouts: memory within 10% for {mem_ok}{timing}" +
          (f" (without the group costs: {before_ok})" if a.baseline else ""))
    if not a.memory_only:
        if a.repeats > 1 and spreads:
            print(f"{a.repeats} repeats a layout: spread (max - min over the median) "
                  f"median {100 * statistics.median(spreads):.1f}%, "
                  f"largest {100 * max(spreads):.1f}%")
        print(f"{time.time() - start:.0f} s; load average now {os.getloadavg()[0]:.1f}")
        print("\ncalibrations (seconds; paces as factors):\n" +
              "\n".join(calibration_lines(a.cache_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
