"""``conformance diagnose`` on the rank logs of the suite's own seed simulations names what the suite names.

Each seed runs one failing case through the real suite (gloo ranks, faults injected), then diagnose
reads only that case's folder: the rank logs, results and phases the ranks wrote.  Its class must be
the seed's, and its root-cause rank the one the suite's own verdict named (none where the suite names
none).  Seeds whose fault shows only in host checks (gpu-lost, nvlink-down, ...) leave no failed rank
log and are not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.cli.main import main
from conftest import REPO, read_records

pytestmark = [pytest.mark.usefixtures("isolated_env"), pytest.mark.slow]

QUICK = ("--matrix=inherited", "--step-timeout=3", "--op-timeout=2", "--init-timeout=2", "--grace=1")
RUN_SECONDS = 240  # one case of a seed, its hang included (step timeout 3 s), on a busy machine

# seed -> (the case to run, the class diagnose must name)
SEEDS = {
    "oom-at-checkpoint": ("test_all_reduce", "oom"),
    "container-dev-shm": ("pair_exchange and PHB", "nccl_error"),
    "cumem-host-shm": ("test_all_reduce", "nccl_error"),
    "nvls-broken": ("test_all_reduce", "nccl_error"),
    "fabric-manager-down": ("test_all_reduce", "machine_fault"),
    "noncontiguous-barrier": ("barrier_no_device_ids and reversed", "barrier_device"),
    "driver-p2p-hang": ("pair_exchange and gpu0-gpu1", "hang"),
    "peer-copy-hang": ("peer_copy and gpu0-gpu1", "hang"),
    "wrong-data-p2p": ("pair_exchange and gpu0-gpu1", "wrong_data"),
    "hang-ignores-sigterm": ("test_all_reduce", "hang"),
}


def run_seed(seed: str, selection: str, reports: Path) -> dict[str, object]:
    command = [sys.executable, "-m", "pytest", str(REPO / "suites"), "-p", "no:cacheprovider", "-q"]
    command += [f"--scenario={seed}", "-k", selection, f"--reports-dir={reports}", *QUICK]
    done = subprocess.run(command, cwd=reports.parent, capture_output=True, text=True, timeout=RUN_SECONDS)
    failed = [r for r in read_records(reports) if r["verdict"] not in ("PASS", "SKIP")]
    assert done.returncode == 1 and len(failed) == 1, done.stdout[-3000:] + done.stderr[-2000:]
    return failed[0]


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_diagnose_names_each_seeds_cause_and_root_rank(
    seed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    selection, expected_class = SEEDS[seed]
    record = run_seed(seed, selection, tmp_path / "reports")
    case = tmp_path / "reports" / "latest" / "cases" / record["case_dir"] if "case_dir" in record else None
    cases = [p for p in (tmp_path / "reports" / "latest" / "cases").iterdir() if p.is_dir()]
    case = case or cases[0]

    status = main(["diagnose", "--json", str(case)])

    answer = json.loads(capsys.readouterr().out)
    assert status == 1, answer
    assert answer["class"] == expected_class, answer
    root = record["root_cause"]
    suite_root = root.get("rank") if isinstance(root, dict) else None
    assert answer["root_ranks"] == ([suite_root] if suite_root is not None else []), (answer, root)
    assert answer["evidence"], "a named cause quotes its lines"
    assert all(os.path.isfile(e["file"]) and e["line"] >= 1 for e in answer["evidence"])
    assert answer["fix"] and answer["check"].startswith("pytest suites/")
