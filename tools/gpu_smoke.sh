#!/usr/bin/env bash
# The smoke run on a GPU machine, with the machine's own torch: versions, topology beside
# `nvidia-smi topo -m`, `pytest suites/ --junitxml`, then the checks one GPU can make
# (conformance/smoke.py says which). Ends with one table; exit 0 only when every check holds.
#   tools/gpu_smoke.sh [--out DIR] [--skip-suite]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" -m conformance smoke "$@"
