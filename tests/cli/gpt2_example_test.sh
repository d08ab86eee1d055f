#!/usr/bin/env bash
# examples/gpt2_124m.toml on a synthetic token file (bench/gpu/make_tokens.py): `tessel config`
# accepts it and plans GPT-2 124M (124,475,904 parameters with the vocabulary padded to 50304;
# f32 master and bf16 copy, f32 gradients, two AdamW moments); shrunk by --set it trains 3
# steps on the CPU. bench/gpu/compare_runs.py (what scripts/gpu_check compares runs with) finds
# the run equal to its copy, a copy with a loss and the digest changed different, and refuses
# a folder that is no run.
#   gpt2_example_test.sh TESSEL SOURCE_DIR
set -euo pipefail
tessel=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

python3 "$src/bench/gpu/make_tokens.py" --out gpt2_tokens.bin --tokens 250000 --vocab 50257
plan=$("$tessel" config "$src/examples/gpt2_124m.toml" 2>&1) || fail "tessel config: $plan"
echo "$plan" | tail -6
grep -q 'model    gpt, 124475904 parameters' <<<"$plan" || fail "not GPT-2 124M's parameter count"
# 124475904 x (4 + 2) bytes of parameters, x 4 of gradients, x 8 of AdamW moments.
grep -q 'gradients 474.84 MiB, optimizer_state 949.68 MiB, parameters 712.26 MiB' <<<"$plan" ||
  fail "memory plan of parameters, gradients and optimizer state"

small=(--quiet --set model.layers=1 --set model.heads=2 --set model.embed=32 --set data.context=32
       --set train.accumulate=1 --set train.max_steps=3 --set train.log_every=1)
"$tessel" train "$src/examples/gpt2_124m.toml" "${small[@]}" --run-dir a >/dev/null
grep -q '^classes = 50304$' a/config.toml || fail "the run's config lost data.classes"
grep -q '"num_parameters": 1623520' a/summary.json || fail "vocabulary not 50304 in the model"

# b: a copy of a, then with step 2's loss moved by 1e-3 relative and other parameters.
compare() { python3 "$src/bench/gpu/compare_runs.py" "$@"; }
cp -r a b
out=$(compare b a --rtol 0 --same-params) || fail "a run and its copy: $out"
echo "$out"
[[ $out == "ok max relative loss difference 0 at step 1 over 3 steps"* ]] || fail "$out"
python3 - <<'PY'
import json
recs = [json.loads(l) for l in open("b/metrics.jsonl")]
for r in recs:
    if r.get("type") == "train" and r["step"] == 2:
        r["loss"] *= 1.001
open("b/metrics.jsonl", "w").write("".join(json.dumps(r) + "\n" for r in recs))
s = json.load(open("b/summary.json"))
s["params_sha256"] = "0" * 64
json.dump(s, open("b/summary.json", "w"))
PY
out=$(compare b a --rtol 2e-3) || fail "within 2e-3: $out"
echo "$out"
set +e
out=$(compare b a --rtol 5e-4 --same-params)
rc=$?
set -e
echo "$out"
((rc == 1)) && [[ $out == "FAIL max relative loss difference 0.001 at step 2 over 3 steps"* &&
  $out == *"params_sha256 DIFFER"* ]] || fail "a changed run: $out"
set +e
out=$(compare a "$tmp/nothing")
rc=$?
set -e
((rc == 2)) && [[ $out == *"nothing/metrics.jsonl is missing"* ]] || fail "no run: $out"
echo "gpt2_example_test: ok"
