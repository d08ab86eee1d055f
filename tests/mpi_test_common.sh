# What the MPI shell tests share; each sources it with its own arguments:
#   source "$(dirname "$0")/../mpi_test_common.sh" "$@"   (TESSEL_BINARY SOURCE_DIR)
# Sets tessel, src, a scratch folder tmp removed on exit, the mpirun command as root may run it
# (add -np N), and sha RUN_DIR: the params_sha256 of a run's summary.json.
set -euo pipefail
tessel=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpirun="mpirun --allow-run-as-root --oversubscribe"
sha() { grep -o '"params_sha256": *"[0-9a-f]*"' "$1/summary.json" | grep -o '[0-9a-f]\{64\}'; }
