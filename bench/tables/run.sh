#!/usr/bin/env bash
# tessel vs PyTorch on users' tables (issue 29's acceptance), side by side in one run.
#   bench/tables/run.sh [BUILD_DIR] [EPOCHS] [SEEDS]
# Generates (numpy, seed 1) tables of 32 float features at varied offsets and scales: Gaussian
# classes that overlap (3 and 15 classes), a regression target (a smooth nonlinear function
# of 4 features plus noise of variance 0.09) and 5 labels (multilabel: label j is 1 where a
# noisy nonlinear score of the features is positive), 4000 train and 2000 test rows each. Each
# is written as a 2-D .npy (targets last), a CSV and an .npz; tessel trains an MLP 32-64-64-K
# (K = 1 for regression, 5 for multilabel: BCEWithLogitsLoss's, accuracy over rows and labels)
# on the .npy and on the CSV (data.test_path: the same test rows),
# PyTorch (Debian's python3-torch) the same shape the same way (bench/tables/torch_table.py:
# per-feature normalisation from the train rows, AdamW lr 0.003 without decay, batch 64, EPOCHS
# epochs), once per seed 1..SEEDS (tessel's seed and PyTorch's: initialisation and batch order;
# the data stay fixed). Prints each side's test accuracy (or MSE) as the mean over the seeds with
# its range, and the difference of the means (points, or the MSE ratio). Run under
# flock /tmp/tessel-bench.lock; quote the CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
epochs=${2:-20}
seeds=${3:-3}
tessel="$build/apps/tessel/tessel"
[[ -x "$tessel" ]] || { echo "tables: $tessel missing; build it first" >&2; exit 1; }
/usr/bin/python3 -c "import numpy, torch" 2>/dev/null ||
  { echo "tables: needs python3-numpy and python3-torch (apt-get install)" >&2; exit 1; }
out=$(mktemp -d /tmp/tessel_tables.XXXXXX)
trap 'rm -rf "$out"' EXIT
/usr/bin/python3 - "$out" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
rng = np.random.default_rng(1)
offset, scale = rng.uniform(-500, 500, 32), rng.uniform(0.1, 50, 32)
def regression(n):
    z = rng.normal(0, 1, (n, 32))
    y = 3 * np.sin(z[:, 0]) + z[:, 1] * z[:, 2] + 0.5 * z[:, 3] + rng.normal(0, 0.3, n)
    return z * scale + offset, y
weights = rng.normal(0, 1, (32, 5))
def multilabel(n):
    z = rng.normal(0, 1, (n, 32))
    score = np.tanh(z @ weights / 4) + 0.3 * z[:, :5] * z[:, 5:10] + rng.normal(0, 0.2, (n, 5))
    return z * scale + offset, (score > 0).astype(np.float64)
for k in (3, 15, "reg", "ml"):
    if k not in ("reg", "ml"):
        centres = rng.normal(0, 0.45, (k, 32))
    def draw(n):
        if k == "reg":
            return regression(n)
        if k == "ml":
            return multilabel(n)
        y = rng.integers(0, k, n)
        x = (centres[y] + rng.normal(0, 1, (n, 32))) * scale + offset
        return x, y
    for part, n in (("train", 4000), ("test", 2000)):
        x, y = draw(n)
        np.savez(f"{out}/{part}{k}.npz", x=x, y=y)
        np.save(f"{out}/{part}{k}.npy", np.column_stack([x, y]))
        labels = [f"label{j}" for j in range(5)] if k == "ml" else ["label"]
        header = ",".join([f"f{i}" for i in range(32)] + labels)
        np.savetxt(f"{out}/{part}{k}.csv", np.column_stack([x, y]), delimiter=",",
                   header=header, comments="", fmt="%.9g")
PY
python3 bench/machine.py "$tessel"
# One figure: the mean over the seeds with the range, e.g. "66.70 [65.9, 67.3]".
stats() { /usr/bin/python3 -c "import sys; v = [float(x) for x in sys.argv[2:]]; \
print('%.4g [%.4g, %.4g]' % (sum(v) / len(v), min(v), max(v)) if sys.argv[1] == 'reg' else \
'%.2f%% [%.2f, %.2f]' % (100 * sum(v) / len(v), 100 * min(v), 100 * max(v)))" "$@"; }
mean() { /usr/bin/python3 -c "import sys; v = [float(x) for x in sys.argv[1:]]; print(sum(v) / len(v))" "$@"; }
echo "seeds 1..$seeds, $epochs epochs; test accuracy (regression: test MSE), mean [min, max]"
for k in 3 15 reg ml; do
  task=classification metric=test_accuracy flag= field=test_accuracy
  [[ $k == reg ]] && task=regression metric=test_mse flag=--regression field=test_loss
  [[ $k == ml ]] && task=multilabel flag=--multilabel
  torch=() npy=() csv=()
  for seed in $(seq 1 "$seeds"); do
    torch+=("$(/usr/bin/python3 bench/tables/torch_table.py --train "$out/train$k.npz" \
      --test "$out/test$k.npz" --hidden 64,64 --epochs "$epochs" --batch 64 --lr 0.003 \
      --seed "$seed" $flag | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['$metric'])")")
    for kind in npy csv; do
      target=  # the last column
      [[ $k == ml && $kind == npy ]] && target=32,33,34,35,36
      [[ $k == ml && $kind == csv ]] && target='label*'
      cat > "$out/c.toml" <<TOML
name = "table$k$kind"
seed = $seed
[model]
kind = "mlp"
hidden = [64, 64]
[data]
kind = "$kind"
task = "$task"
target = "$target"
path = "$out/train$k.$kind"
test_path = "$out/test$k.$kind"
[optim]
kind = "adamw"
lr = 0.003
[train]
batch = 64
epochs = $epochs
TOML
      run="$out/run$k$kind$seed"
      "$tessel" train "$out/c.toml" --quiet --run-dir "$run" --set runtime.threads=1 > /dev/null
      value=$(/usr/bin/python3 -c "import json; print(json.load(open('$run/summary.json'))['$field'])")
      [[ $kind == npy ]] && npy+=("$value") || csv+=("$value")
    done
  done
  t=$(mean "${torch[@]}")
  for kind in npy csv; do
    [[ $kind == npy ]] && vals=("${npy[@]}") || vals=("${csv[@]}")
    m=$(mean "${vals[@]}")
    if [[ $k == reg ]]; then
      diff=$(/usr/bin/python3 -c "print('MSE ratio %.3f' % ($m / $t))")
    else
      diff=$(/usr/bin/python3 -c "print('%+.2f points' % (100 * ($m - $t)))")
    fi
    echo "$k $kind: tessel $(stats $k "${vals[@]}"), pytorch $(stats $k "${torch[@]}"): $diff"
  done
done
