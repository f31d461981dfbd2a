#!/usr/bin/env bash
# First and next light: the suite on a real GPU in one script, everything it prints kept.
#   tools/gpu_first_light.sh [OUT]        (OUT: $OUT, else reports/first-light)
#
# Installs this checkout into the machine's own Python (its torch, its NCCL), then runs, each step
# under a time limit and its output saved: the versions; nvidia-smi -q and topo -m beside
# `python -m conformance topology`; NVML's raw answers (tools/gpu_nvml_raw.py); `pytest suites/` whole
# with --junitxml and --metrics-file, and each case's time split (tools/gpu_case_times.py). Then the
# next light (docs/gpu-runs/2026-11-28-h200): the whole suite under -n 2 with --expect-gpus and a
# user's NCCL_DEBUG_SUBSYS; a ladder climb from NCCL_NET=Bogus in the environment and from a
# configuration file; two ranks on the one GPU as two nodes of a multi-node run (NCCL_HOSTID tells
# them apart, each node leases from its own folder): one run that passes, one where node 1's rank hangs
# in the pair case; a leftover process of this user holding all but ~600 MiB of the GPU; the teardown
# benchmark (tools/gpu_teardown.py). The smoke checks of the first light (tools/gpu_smoke.sh,
# 280 s) run only with SMOKE=1. STEPS="two-nodes-hang leftover" runs those steps alone (a rerun's).
# After every step OUT/first-light.tar.gz is made anew, so a run cut short keeps what it did.
# Wheels in .whl/ (setuptools new enough for pyproject's licence field, junitparser, zxcvbn) are
# installed first to /tmp/site where the machine has none. Without a GPU it says so and exits 0.
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
want() {  # want NAME: true unless STEPS names the steps to run (a rerun's) and not this one
    [ -z "${STEPS:-}" ] || [ "$1" = install ] || [[ " $STEPS " == *" $1 "* ]]
}
step() {  # step NAME SECONDS COMMAND...: run it, output to $work/NAME.log, a line in steps.txt
    local name=$1 limit=$2 began=$SECONDS rc
    shift 2
    if ! want "$name"; then
        echo "$name: not run (STEPS=$STEPS)" >>"$work/steps.txt"
        return 0
    fi
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
[ -f "$work/versions.log" ] && cp "$work/versions.log" "$work/versions.json"
step nvidia-smi-q 60 nvidia-smi -q
step topology 120 bash -c "$py -m conformance topology; echo; echo 'nvidia-smi topo -m:'; nvidia-smi topo -m"
step nvml-raw 120 "$py" tools/gpu_nvml_raw.py "$work/nvml-raw.json"
step suite 180 "$py" -m pytest suites/ -p no:cacheprovider --junitxml="$work/junit.xml" \
    --metrics-file="$work/metrics.prom" --reports-dir="$work/reports"
TAIL=60 step case-times 60 "$py" tools/gpu_case_times.py "$work/reports/latest" "$work/case-times.json"

# 1. the whole suite under xdist, the GPU count expected, a user's own NCCL_DEBUG_SUBSYS
step suite-n2 180 env NCCL_DEBUG_SUBSYS=COLL "$py" -m pytest suites/ -p no:cacheprovider -n 2 --expect-gpus 1 \
    --junitxml="$work/junit-n2.xml" --reports-dir="$work/reports-n2"

# 2. a real ladder climb: NCCL_NET names no network, from the environment, then from a configuration file
step ladder-env 150 env NCCL_NET=Bogus "$py" -m pytest suites/ -p no:cacheprovider --reports-dir="$work/reports-ladder-env"
printf 'NCCL_NET=Bogus\n' >"$work/bogus.conf"
step ladder-conf 150 env NCCL_CONF_FILE="$work/bogus.conf" "$py" -m pytest suites/ -p no:cacheprovider \
    --reports-dir="$work/reports-ladder-conf"

# 3. two nodes on the one GPU: NCCL_HOSTID gives each its own host hash (NCCL's init.cc refuses two ranks
#    on one GPU only when host hash and bus id both match), each node leases from its own folder
token="$(mktemp -d)/run.token"  # not in $work: the evidence never holds a run's secret
"$py" -m conformance token --file "$token" >/dev/null
cat >"$work/node1-hangs.toml" <<'TOML'
[scenario]
name = "node 1's rank hangs in the node pair's exchange"
[[rule]]
effect = "hang"
phase = "probe"
probes = ["pair_exchange"]
sets = ["node_pair"]
ranks = [1]
TOML
two_nodes() {  # two_nodes NAME PORT PYTEST-ARGS...: node 1 in the background, node 0 here; both exit codes
    local name=$1 port=$2 rank pids=()
    shift 2
    for rank in 1 0; do
        NCCL_HOSTID="next-light-node$rank" "$py" -m pytest suites/test_multinode.py -p no:cacheprovider \
            --nnodes 2 --node-rank "$rank" --master-addr 127.0.0.1 --master-port "$port" \
            --run-token-file "$token" --lease-dir "$work/leases-$name-$rank" \
            --reports-dir "$work/reports-$name-$rank" --junitxml "$work/junit-$name-$rank.xml" "$@" \
            >"$work/$name-node$rank.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[0]}"; echo "node 1 exit $?"
    wait "${pids[1]}"; echo "node 0 exit $?"
    tail -n 30 "$work/$name-node0.log"
}
export -f two_nodes
export py work token
step two-nodes 150 bash -c 'two_nodes two-nodes 29611'
step two-nodes-hang 180 bash -c "two_nodes two-nodes-hang 29612 --scenario '$work/node1-hangs.toml' --matrix inherited \
    --step-timeout 12 --op-timeout 10 --init-timeout 10"

# 4. a leftover process of this user (another session, as a job left behind) holding all but ~600 MiB
if want leftover; then
setsid "$py" -c '
import sys, time, torch
free, total = torch.cuda.mem_get_info()
held = torch.empty(free - (600 << 20), dtype=torch.uint8, device="cuda")
open(sys.argv[1], "w").write(str(held.numel() >> 20))
time.sleep(300)
' "$work/held" >"$work/leftover.log" 2>&1 &
leftover=$!
for _ in $(seq 120); do [ -s "$work/held" ] && break; sleep 0.5; done
echo "leftover pid $leftover holds $(cat "$work/held" 2>/dev/null || echo '?') MiB" | tee -a "$work/steps.txt"
step leftover 150 "$py" -m pytest suites/ -p no:cacheprovider --matrix inherited --reports-dir="$work/reports-leftover"
kill "$leftover" 2>/dev/null; wait "$leftover" 2>/dev/null
fi

# 5. the GPU case's fixed cost: where a rank's end goes
TAIL=10 step teardown 150 "$py" tools/gpu_teardown.py 5 "$work/teardown.json"

if [ "${SMOKE:-0}" = 1 ]; then
    TAIL=40 step smoke 300 env PYTHON="$py" tools/gpu_smoke.sh --skip-suite --out "$work/smoke"
fi

run_dir="$(readlink -f "$work/reports/latest" || true)"
for f in "$run_dir/run.json" "$work/case-times.json" "$work/teardown.json" "$work/versions.json" \
    "$work/nvml-raw.json" "$work/steps.txt"; do
    [ -f "$f" ] && cp "$f" "$out/"
done
keep
echo "first light: written to $out"
cat "$work/steps.txt"
