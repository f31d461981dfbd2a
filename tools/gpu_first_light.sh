#!/usr/bin/env bash
# First light: the suite on a real GPU in one script, everything it prints kept.
#   tools/gpu_first_light.sh [OUT]        (OUT: $OUT, else reports/first-light)
#
# Installs this checkout into the machine's own Python (its torch, its NCCL), then runs, each step
# under a time limit and its output saved: the versions; nvidia-smi -q and topo -m beside
# `python -m conformance topology`; NVML's raw answers (tools/gpu_nvml_raw.py); `pytest suites/` whole
# with --junitxml and --metrics-file; the pair and all-reduce tests under -n 2; each case's time split
# (tools/gpu_case_times.py); last the smoke checks (tools/gpu_smoke.sh --skip-suite), the longest step.
# After every step OUT/first-light.tar.gz is made anew, so a run cut short keeps what it did.
# Wheels in .whl/ (setuptools new enough for pyproject's licence field, junitparser) are installed
# first to /tmp/site where the machine has none. Without a GPU it says so and exits 0, running nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$(mkdir -p "${1:-${OUT:-reports/first-light}}" && cd "${1:-${OUT:-reports/first-light}}" && pwd)"
work="$(mktemp -d /tmp/first-light.XXXXXX)"
py="${PYTHON:-python3}"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "first light: SKIPPED: no GPU here ($(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 | head -1 || echo 'nvidia-smi not found'))"
    exit 0
fi

keep() { tar -C "$work" -czf "$out/first-light.tar.gz" . ; }
step() {  # step NAME SECONDS COMMAND...: run it, output to $work/NAME.log, a line in steps.txt
    local name=$1 limit=$2 began=$SECONDS rc
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout -k 10 "$limit" "$@" >"$work/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $((SECONDS - began))s" | tee -a "$work/steps.txt"
    tail -n "${TAIL:-25}" "$work/$name.log"
    keep
    return 0
}

if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
step install 180 "$py" -m pip install --no-deps --no-build-isolation -e .
if ! "$py" -c "import importlib.metadata as m; m.distribution('gpu-conformance')" 2>/dev/null; then
    echo "install failed: the checkout runs from PYTHONPATH, its pytest plugin named by PYTEST_PLUGINS"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTEST_PLUGINS=conformance.plugin
fi

step versions 120 "$py" - <<'EOF'
import importlib.metadata as m, json, subprocess, torch
def run(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
def dist(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
def runtime():
    try:
        from cuda.bindings import runtime as rt
        return rt.cudaRuntimeGetVersion()[1]
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
def nccl():
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
found = {
    "driver": run("nvidia-smi", "--query-gpu=driver_version,name,pci.bus_id", "--format=csv,noheader"),
    "cuda driver (nvidia-smi)": [l for l in run("nvidia-smi").splitlines() if "CUDA Version" in l][:1],
    "cuda runtime (cudaRuntimeGetVersion)": runtime(),
    "nvcc": run("nvcc", "--version").splitlines()[-1:],
    "torch": torch.__version__, "torch cuda": torch.version.cuda,
    "nccl loaded (torch.cuda.nccl.version)": nccl(),
    "nccl pip": {n: dist(n) for n in ("nvidia-nccl-cu13", "nvidia-nccl-cu12")},
    "nvidia-ml-py": dist("nvidia-ml-py"), "pytest": dist("pytest"), "pytest-xdist": dist("pytest-xdist"),
    "python": run("python3", "--version"), "kernel": run("uname", "-r"),
}
print(json.dumps(found, indent=2))
EOF
cp "$work/versions.log" "$work/versions.json"
step nvidia-smi-q 60 nvidia-smi -q
step topology 120 bash -c "$py -m conformance topology; echo; echo 'nvidia-smi topo -m:'; nvidia-smi topo -m"
step nvml-raw 120 "$py" tools/gpu_nvml_raw.py "$work/nvml-raw.json"
step suite 180 "$py" -m pytest suites/ -p no:cacheprovider --junitxml="$work/junit.xml" \
    --metrics-file="$work/metrics.prom" --reports-dir="$work/reports"
step suite-n2 120 "$py" -m pytest suites/ -p no:cacheprovider -k 'pair_exchange or all_reduce' -n 2 \
    --junitxml="$work/junit-n2.xml" --reports-dir="$work/reports-n2"
TAIL=60 step case-times 60 "$py" tools/gpu_case_times.py "$work/reports/latest" "$work/case-times.json"
TAIL=40 step smoke 300 env PYTHON="$py" tools/gpu_smoke.sh --skip-suite --out "$work/smoke"

run_dir="$(readlink -f "$work/reports/latest" || true)"
for f in "$run_dir/run.json" "$run_dir/results.jsonl" "$work/junit.xml" "$work/smoke/smoke.json" \
    "$work/versions.json" "$work/nvml-raw.json" "$work/steps.txt"; do
    [ -f "$f" ] && cp "$f" "$out/"
done
keep
echo "first light: written to $out"
cat "$work/steps.txt"
