#!/usr/bin/env bash
# Runs the whole test suite, setting up first whatever is missing: the GoogleTest suites through
# ctest, then every pytest suite under tests/ (engine, correctness corpus, kernel protocol,
# notebooks, browser). Prints the wall time of the whole run at the end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)
bash scripts/setup.sh

echo "== C++ tests (ctest)"
ctest --test-dir build --output-on-failure -j "$(nproc)"

echo "== Python tests (pytest)"
export JUPYTER_PATH="$root/.venv/share/jupyter"
# Two cores shared by the program thread, the GraphRunner and OpenMP: spinning OpenMP workers
# would steal them from each other.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
status=0
.venv/bin/python -m pytest tests "$@" || status=$?

echo "== whole suite: $(( $(date +%s) - start )) s wall time on $(nproc) cores"
exit $status
