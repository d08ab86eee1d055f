#!/usr/bin/env python3
"""Runs the gpu-labelled tests ctest listed in the bundle build (scripts/gpu_bundle writes its
`ctest -L gpu --show-only=json-v1` as .gpu/gpu_tests.json) on the GPU machine, where there is no
ctest build tree: each GoogleTest binary once, its listed cases joined into one --gtest_filter
(one CUDA start per binary instead of one per case), other commands one by one, all with
TESSEL_GPU_REQUIRED=1 (a missing device fails instead of skipping) and the test's own
environment, inside a deadline. Prints each run and a last line "P passed, F failed, S skipped"
(or that none were run); exit status 1 on any failure or timeout.

    bench/gpu/run_gpu_tests.py .gpu/gpu_tests.json [--exclude cuda_ops_test] [--budget 60]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def properties(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def plan(tests, exclude):
    """[(command, cwd, env, cases)]: gtest binaries grouped (cases > 0), other commands alone."""
    groups, runs = {}, []
    for t in tests:
        cmd, props = t["command"], properties(t)
        if os.path.basename(cmd[0]) in exclude:
            continue
        env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []))
        cwd = props.get("WORKING_DIRECTORY")
        filters = [a.split("=", 1)[1] for a in cmd[1:] if a.startswith("--gtest_filter=")]
        if filters and len(cmd) <= 3:  # [binary, --gtest_filter=X, --gtest_also_run_disabled_tests]
            key = (cmd[0], cwd, tuple(sorted(env.items())))
            groups.setdefault(key, []).extend(filters)
        else:
            runs.append((cmd, cwd, env, 0))
    for (binary, cwd, env), cases in groups.items():
        runs.append(([binary, "--gtest_filter=" + ":".join(cases), "--gtest_color=no"], cwd,
                     dict(env), len(cases)))
    return runs


def counts(output, cases, rc):
    """(passed, failed, skipped) of one run: gtest's summary lines, else the exit code."""
    if cases:
        get = lambda tag: sum(int(n) for n in re.findall(rf"^\[\s+{tag}\s+\] (\d+) test", output, re.M))
        passed, failed, skipped = get("PASSED"), get("FAILED"), get("SKIPPED")
        if rc != 0 and failed == 0:
            failed = cases - passed - skipped or 1  # a crash or timeout before the summary
        return passed, failed, skipped
    return (1, 0, 0) if rc == 0 else (0, 1, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests_json")
    ap.add_argument("--exclude", default="", help="binaries (basenames, comma-separated) to skip")
    ap.add_argument("--budget", type=float, default=60, help="seconds for all runs together")
    a = ap.parse_args()
    tests = json.load(open(a.tests_json))["tests"]
    runs = plan(tests, set(filter(None, a.exclude.split(","))))
    if not runs:
        print(f"no gpu tests besides {a.exclude or 'none'}: 0 passed, 0 failed, 0 skipped")
        return 0
    deadline = time.monotonic() + a.budget
    total = [0, 0, 0]
    for cmd, cwd, env, cases in runs:
        left = deadline - time.monotonic()
        name = os.path.basename(cmd[0]) + (f" ({cases} cases)" if cases else "")
        if left < 5:
            print(f"--- {name}: not run, no time left in the {a.budget:.0f}s budget")
            total[1] += max(cases, 1)
            continue
        print(f"--- {name}: {' '.join(cmd)}", flush=True)
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=cwd if cwd and os.path.isdir(cwd) else None,
                               env={**os.environ, **env, "TESSEL_GPU_REQUIRED": "1"},
                               capture_output=True, text=True, timeout=left)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout or ""
            out, rc = (out if isinstance(out, str) else out.decode(errors="replace")) + "\n(TIMEOUT)", 124
        except OSError as e:
            out, rc = f"cannot run: {e}", 127
        print(out[-6000:])
        got = counts(out, cases, rc)
        total = [x + y for x, y in zip(total, got)]
        print(f"--- {name}: rc {rc}, {got[0]} passed, {got[1]} failed, {got[2]} skipped, "
              f"{time.monotonic() - t0:.0f}s", flush=True)
    print(f"{total[0]} passed, {total[1]} failed, {total[2]} skipped")
    return 1 if total[1] else 0


if __name__ == "__main__":
    sys.exit(main())
