#!/usr/bin/env bash
# Every C++ and CUDA file tessel keeps in git is formatted as .clang-format says (Google style,
# 100 columns; third_party/ excepted). On a failure: clang-format -i FILE, or for all of them:
#   git ls-files '*.cc' '*.h' '*.cu' '*.cuh' ':!third_party' | xargs clang-format -i
set -euo pipefail
cd "$1"
if ! command -v clang-format > /dev/null; then
  echo "format_test: clang-format missing; run scripts/setup.sh (it installs it)" >&2
  exit 1
fi
if ! git rev-parse --git-dir > /dev/null 2>&1; then
  echo "format_test: $1 is not a git checkout; skipped" >&2
  exit 77
fi
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" > /dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' ':!third_party')
if (( ${#bad[@]} > 0 )); then
  echo "format_test: ${#bad[@]} file(s) not formatted as .clang-format says: ${bad[*]}" >&2
  echo "format_test: fix with: clang-format -i ${bad[*]}" >&2
  exit 1
fi
echo "format_test: every C++ and CUDA file is formatted"
