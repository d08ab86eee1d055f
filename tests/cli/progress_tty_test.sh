#!/usr/bin/env bash
# The live progress line on a terminal (a tmux pane): one line per epoch updated in place (the
# pane shows many different states of it but never more progress lines than epochs), and its
# ETA, read once 10% of the steps are done, within 20% of the time the run then really took.
# Prints the figures. Exit 77 (skipped) without tmux.
# Usage: progress_tty_test.sh TESSEL_BINARY SOURCE_DIR [EXTRA TRAIN ARGS...]
set -euo pipefail
tessel=$1
src=$2
shift 2
command -v tmux > /dev/null || { echo "tmux not installed (scripts/setup.sh): skipped"; exit 77; }
tmp=$(mktemp -d)
sock="$tmp/tmux.sock"
trap 'tmux -S "$sock" kill-server 2> /dev/null || true; rm -rf "$tmp"' EXIT
epochs=3
# stderr goes to the pane (a terminal); only the summary on stdout is redirected.
cmd="$tessel train $src/examples/fashion_mlp.toml --set model.hidden=[256] --set train.epochs=$epochs \
--set checkpoint.every_epochs=0 --run-dir $tmp/run $* > $tmp/summary.txt; date +%s.%N > $tmp/done; sleep 60"
tmux -S "$sock" new-session -d -x 220 -y 50 "$cmd"
while [ ! -f "$tmp/done" ]; do
  now=$(date +%s.%N)
  pane=$(tmux -S "$sock" capture-pane -p 2> /dev/null || true)
  lines=$(grep -c ' step ' <<< "$pane" || true)
  last=$(grep ' step ' <<< "$pane" | tail -1 || true)
  echo "$now|$lines|$last" >> "$tmp/samples"
  sleep 0.1
done
python3 - "$tmp/samples" "$(cat "$tmp/done")" "$epochs" <<'PY'
import re, sys
samples, end, epochs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rows = []
for row in open(samples):
    t, count, line = row.rstrip("\n").split("|", 2)
    rows.append((float(t), int(count), line))
states = {line for _, _, line in rows if " step " in line}
most = max(count for _, count, _ in rows)
print("progress line states seen: %d, most progress lines on screen at once: %d (epochs %d)"
      % (len(states), most, epochs))
ok = len(states) >= 5 and most <= epochs
for t, _, line in rows:
    m = re.search(r" step (\d+)/(\d+) .* ETA (?:(\d+)h(\d+)m|(\d+)m(\d+)s|([0-9.]+)s)$", line)
    if not m or int(m.group(1)) < 0.1 * int(m.group(2)):
        continue
    if m.group(3):
        eta = int(m.group(3)) * 3600 + int(m.group(4)) * 60
    elif m.group(5):
        eta = int(m.group(5)) * 60 + int(m.group(6))
    else:
        eta = float(m.group(7))
    real = end - t
    err = abs(eta - real) / real
    print("at step %s/%s: ETA %.1f s, the run then took %.1f s: error %.0f%%"
          % (m.group(1), m.group(2), eta, real, 100 * err))
    ok = ok and err <= 0.2
    break
else:
    print("FAIL: no ETA after 10% of the steps")
    ok = False
sys.exit(0 if ok else 1)
PY
