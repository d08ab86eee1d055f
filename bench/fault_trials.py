#!/usr/bin/env python3
"""Fault-tolerance trials: the acceptance figures of docs/fault_tolerance.md, measured.

Each scenario runs TRIALS times on the deterministic spiral run (24-row batches in micro-shards
of 2, so any rank count gives the same bits) and prints one line per trial and a total:
  fail    an injected exception on the last rank under mpirun -np 2 and 4: exit code, one
          printed error, seconds from the error line to the end of mpirun
  stop    SIGSTOP of a random rank (from outside) under mpirun -np 2, 3 and 4 and with 3 ranks
          as threads (debug.fail_mode = hang there): seconds from the stop to the end of the
          job (bound: comm.timeout_s + 5) and whether the message names the stopped rank
  term    SIGTERM to `tessel launch` (and SIGUSR1 to plain mpirun) mid-run: exit code, a
          checkpoint at the stop step, and --resume ending with the uninterrupted params_sha256
  kill    kill -9 of a random rank at a random moment of a 4-rank run under
          `tessel launch --max-restarts 3`: the job finishes on its own with the uninterrupted
          params_sha256
  threads a random failure (throw or hang) at a random step of 4 ranks as threads with
          train.max_restarts: the uninterrupted params_sha256, and the steps lost per failure
          against checkpoint.snapshot_steps

Usage: bench/fault_trials.py TESSEL [--trials N] [--only fail,stop,term,kill,threads]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
BASE = ["train", os.path.join(SRC, "examples/spiral.toml"), "--quiet",
        "--set", "train.deterministic=true", "--set", "train.batch=24",
        "--set", "ddp.micro_shard=2", "--set", "train.drop_last=true",
        "--set", "train.log_every=5"]
TIMEOUT_S = 5


_runs = [0]


def fresh(tmp, name):
    """A run folder of its own per trial, so that no trial sees another one's processes."""
    _runs[0] += 1
    return os.path.join(tmp, f"{name}-{_runs[0]}")


def sha(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)["params_sha256"]


def rank_pids(run_dir):
    """World rank -> pid of the tessel processes training into run_dir (read from /proc)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        rank = env.get(b"OMPI_COMM_WORLD_RANK")
        if rank is not None and b"train" in cmd and run_dir.encode() in cmd:
            out[int(rank)] = int(pid)
    return out


def wait_ranks(run_dir, np_, proc, limit=60):
    """The ranks' pids once training has begun (a train record in metrics.jsonl)."""
    t0 = time.time()
    metrics = os.path.join(run_dir, "metrics.jsonl")
    while time.time() - t0 < limit and proc.poll() is None:
        pids = rank_pids(run_dir)
        if len(pids) == np_ and os.path.exists(metrics) and '"train"' in open(metrics).read():
            return pids
        time.sleep(0.05)
    return {}


def timed_lines(proc, limit=120):
    """(seconds, line) of the process's merged output until it ends; after `limit` seconds its
    process group is killed (a hang: the trial fails)."""
    timer = threading.Timer(limit, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    lines = []
    for raw in proc.stdout:
        lines.append((time.time(), raw.decode(errors="replace")))
    proc.wait()
    timer.cancel()
    return lines


def start(args):
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def trial_fail(tessel, tmp, np_, epochs):
    run = fresh(tmp, f"fail{np_}")
    args = MPIRUN + ["-np", str(np_), tessel] + BASE + [
        "--set", f"train.epochs={epochs}", "--set", f"debug.fail_rank={np_ - 1}",
        "--set", "debug.fail_step=60", "--set", f"comm.timeout_s={TIMEOUT_S}", "--run-dir", run]
    proc = start(args)
    lines = timed_lines(proc)
    end = time.time()
    errors = [(t, l) for t, l in lines if l.startswith("tessel: error:")]
    took = end - errors[0][0] if errors else float("nan")
    ok = proc.returncode == 1 and len(errors) == 1 and "injected failure" in errors[0][1] \
        and took < 2
    return ok, f"np={np_} exit {proc.returncode}, {len(errors)} error line(s), " \
               f"all ranks gone {took:.2f} s after it"


def error_said(out, ok):
    """The run's error line where a trial failed (what named the wrong rank, or nobody)."""
    if ok:
        return ""
    errors = [l.strip() for l in out.splitlines() if "error" in l.lower()]
    return f"; it said: {errors[-1][:400]}" if errors else "; it printed no error"


def trial_stop_mpi(tessel, tmp, np_, epochs):
    run = fresh(tmp, f"stop{np_}")
    args = MPIRUN + ["-np", str(np_), tessel] + BASE + [
        "--set", f"train.epochs={epochs}", "--set", f"comm.timeout_s={TIMEOUT_S}",
        "--run-dir", run]
    proc = start(args)
    pids = wait_ranks(run, np_, proc)
    victim = random.randrange(np_)
    time.sleep(random.uniform(0.5, 1.5))
    t0 = time.time()
    os.kill(pids[victim], signal.SIGSTOP)
    out = "".join(l for _, l in timed_lines(proc))
    took = time.time() - t0
    named = f"rank {victim} stopped making progress" in out or \
        f"rank ({victim}) was itself stopped" in out
    ok = proc.returncode != 0 and named and took <= TIMEOUT_S + 5
    return ok, f"np={np_} SIGSTOP rank {victim}: exit {proc.returncode} after {took:.1f} s " \
               f"(bound {TIMEOUT_S + 5}), named: {named}{error_said(out, ok)}"


def trial_stop_threads(tessel, tmp, epochs):
    victim = random.randrange(3)
    run = fresh(tmp, "stopt")
    args = [tessel] + BASE + ["--workers", "3", "--set", f"train.epochs={epochs}",
                              "--set", f"comm.timeout_s={TIMEOUT_S}", "--set", "debug.fail_mode=hang",
                              "--set", f"debug.fail_rank={victim}", "--set", "debug.fail_step=100",
                              "--run-dir", run]
    proc = start(args)
    lines = timed_lines(proc)
    hung = [t for t, l in lines if "injected failure" in l]
    took = time.time() - hung[0] if hung else float("nan")
    out = "".join(l for _, l in lines)
    named = f"rank {victim} stopped making progress" in out
    ok = proc.returncode == 1 and named and took <= TIMEOUT_S + 5
    return ok, f"threads=3 rank {victim} hangs: exit {proc.returncode} after {took:.1f} s, " \
               f"named: {named}{error_said(out, ok)}"


def trial_term(tessel, tmp, reference, epochs, launch):
    run = fresh(tmp, "term")
    train = BASE + ["--set", f"train.epochs={epochs}", "--run-dir", run]
    if launch:
        args = [tessel, "launch", "-np", "4", "--mpirun", " ".join(MPIRUN), "--"] + train
    else:
        args = MPIRUN + ["-np", "4", tessel] + train
    proc = start(args)
    wait_ranks(run, 4, proc)
    time.sleep(random.uniform(0.5, 2.0))
    proc.send_signal(signal.SIGTERM if launch else signal.SIGUSR1)
    timed_lines(proc)
    ckpts = os.path.join(run, "checkpoints")
    latest = open(os.path.join(ckpts, "latest")).read().strip() if os.path.exists(ckpts) else ""
    with open(os.path.join(run, "summary.json")) as f:
        stop_step = json.load(f)["steps"]
    at_stop = latest == f"step-{stop_step:06d}"
    res = subprocess.run(MPIRUN + ["-np", "4", tessel] + BASE + [
        "--set", f"train.epochs={epochs}", "--resume", run], capture_output=True)
    same = res.returncode == 0 and sha(run) == reference
    ok = proc.returncode in (130, 143) and at_stop and same
    how = "SIGTERM to tessel launch" if launch else "SIGUSR1 to mpirun"
    return ok, f"{how}: exit {proc.returncode}, checkpoint at the stop step {stop_step}: " \
               f"{at_stop}, resumed params_sha256 = uninterrupted: {same}"


def trial_kill(tessel, tmp, reference, epochs):
    run = fresh(tmp, "kill")
    args = [tessel, "launch", "-np", "4", "--max-restarts", "3", "--mpirun", " ".join(MPIRUN),
            "--"] + BASE + ["--set", f"train.epochs={epochs}", "--set", "checkpoint.every_steps=40",
                            "--set", f"comm.timeout_s={TIMEOUT_S}", "--run-dir", run]
    proc = start(args)
    pids = wait_ranks(run, 4, proc)
    victim = random.randrange(4)
    time.sleep(random.uniform(0.2, 1.5))  # the run takes 3-6 s here (2026-11-25)
    killed = proc.poll() is None and os.path.exists(f"/proc/{pids[victim]}")
    if killed:
        os.kill(pids[victim], signal.SIGKILL)
    out = "".join(l for _, l in timed_lines(proc))
    starts = len(re.findall(r"tessel launch: start \d+", out))
    same = proc.returncode == 0 and sha(run) == reference
    return same and killed, f"kill -9 rank {victim}: exit {proc.returncode}, {starts} start(s), " \
                            f"params_sha256 = uninterrupted: {same}"


def trial_threads(tessel, tmp, reference, epochs, every):
    run = fresh(tmp, "threads")
    victim, step = random.randrange(4), random.randrange(1, epochs * 12)
    mode = random.choice(["throw", "hang"])
    args = [tessel] + BASE + ["--workers", "4", "--set", f"train.epochs={epochs}",
                              "--set", "train.max_restarts=1", "--set", f"checkpoint.snapshot_steps={every}",
                              "--set", f"comm.timeout_s={TIMEOUT_S}", "--set", f"debug.fail_rank={victim}",
                              "--set", f"debug.fail_step={step}", "--set", f"debug.fail_mode={mode}",
                              "--run-dir", run]
    res = subprocess.run(args, capture_output=True, text=True)
    m = re.search(r"in-memory snapshot of step (\d+)", res.stderr + res.stdout)
    from_step = int(m.group(1)) if m else 0
    lost = step - from_step
    same = res.returncode == 0 and sha(run) == reference
    ok = same and lost <= every
    return ok, f"rank {victim} {mode} after step {step}: restarted from step {from_step} " \
               f"(lost {lost} <= {every}), params_sha256 = uninterrupted: {same}"


def run_scenario(name, trials, f):
    passed = 0
    for i in range(trials):
        ok, what = f()
        passed += ok
        print(f"  {name} {i + 1}: {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    print(f"{name}: {passed}/{trials}", flush=True)
    return passed == trials


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tessel")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--only", default="fail,stop,term,kill,threads")
    a = ap.parse_args()
    tessel, only = os.path.abspath(a.tessel), a.only.split(",")
    tmp = tempfile.mkdtemp(prefix="tessel_faults_")
    epochs = 160  # 1,920 steps of 24 rows: a few seconds on 4 ranks, so a signal lands mid-run
    try:
        ref = os.path.join(tmp, "reference")
        subprocess.run([tessel] + BASE + ["--set", f"train.epochs={epochs}", "--run-dir", ref],
                       check=True, capture_output=True)
        reference = sha(ref)
        ok = True
        if "fail" in only:
            for np_ in (2, 4):
                ok &= run_scenario(f"fail np={np_}", a.trials,
                                   lambda: trial_fail(tessel, tmp, np_, epochs))
        if "stop" in only:
            for np_ in (2, 3, 4):  # long enough to be running when the stop lands (0.5-1.5 s in;
                # 400 epochs took 1.4 s on 4 ranks on 2026-11-25)
                ok &= run_scenario(f"stop np={np_}", a.trials,
                                   lambda: trial_stop_mpi(tessel, tmp, np_, 2000))
            ok &= run_scenario("stop threads", a.trials,
                               lambda: trial_stop_threads(tessel, tmp, epochs))
        if "term" in only:  # long enough not to end before the signal
            ref_long = os.path.join(tmp, "reference_long")
            subprocess.run([tessel] + BASE + ["--set", "train.epochs=600", "--run-dir", ref_long],
                           check=True, capture_output=True)
            for launch in (True, False):
                ok &= run_scenario("term launch" if launch else "usr1 mpirun", a.trials,
                                   lambda: trial_term(tessel, tmp, sha(ref_long), 600, launch))
        if "kill" in only:
            ok &= run_scenario("kill", 2 * a.trials,
                               lambda: trial_kill(tessel, tmp, reference, epochs))
        if "threads" in only:
            ok &= run_scenario("threads", 2 * a.trials,
                               lambda: trial_threads(tessel, tmp, reference, epochs, 10))
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
