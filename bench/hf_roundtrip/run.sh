#!/usr/bin/env bash
# tessel <-> Hugging Face transformers (issue 29 item 4's acceptance), in one run:
#  (a) a char-level and a BPE GPT trained by tessel (2 blocks, 4 heads, width 64, context 64, on
#      Debian's songs-poems fortunes, 150 steps each) are exported with `tessel ckpt export
#      --format hf`; transformers' GPT2LMHeadModel.from_pretrained and GPT2Tokenizer load the
#      folder, tokenize the test text and compute logits, compared with `tessel eval --logits` on
#      the same windows (acceptance: max |difference| <= 1e-5);
#  (b) a randomly initialised GPT2LMHeadModel (small config) saved with save_pretrained, with a
#      char vocabulary as vocab.json + merges.txt, is imported with `tessel ckpt import`;
#      `tessel predict` generates greedily from prompts and transformers' generate(do_sample=False)
#      from the same prompts (acceptance: the same tokens).
# PyTorch and transformers come from the venv bench/torch2_venv.sh keeps (transformers pinned
# below, installed into it once). Run it alone and quote the CPU:
#   flock /tmp/tessel-bench.lock bench/hf_roundtrip/run.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
tessel="$build/apps/tessel/tessel"
[[ -x "$tessel" ]] || { echo "hf_roundtrip: $tessel missing; build it first" >&2; exit 1; }
transformers_version=5.24.0  # the newest on PyPI when this bench was written (2026-11)
python=$("$root/bench/torch2_venv.sh")
if ! "$python" -c "import transformers; assert transformers.__version__ == '$transformers_version'" \
    2>/dev/null; then
  echo "hf_roundtrip: installing transformers==$transformers_version into $(dirname "$python")/.." >&2
  "$(dirname "$python")/pip" install -q "transformers==$transformers_version" >&2
fi
python3 "$root/bench/machine.py" "$tessel"
export TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1 TQDM_DISABLE=1
work=$(mktemp -d /tmp/tessel_hf.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$python" "$root/bench/hf_roundtrip/hf_roundtrip.py" "$tessel" "$work"
