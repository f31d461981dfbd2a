"""How long a broken 8-GPU box takes to answer with the default settings, and whether the answer is right.

    python benchmarks/broken_box.py [--scenario scenarios/pcie-sys-p2p-hang.toml] [-- EXTRA PYTEST ARGS]

Runs ``pytest suites/ --scenario SCENARIO`` as a user would (no timeout options: the defaults) in a
temporary reports folder and prints: the wall time, the deadlines paid and the hangs confirmed
sooner, the false hangs (a ``hang`` record that is not a cross-socket pair on a rung without the
fix), and the recommended environment.  Simulated: gloo ranks play the GPUs (see the README).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.record.runs import load_run
from conformance.summarise.recommend import recommend

REPO = Path(__file__).resolve().parent.parent
# Seed d: a cross-socket pair may hang only on a rung that leaves P2P over PCIe on.
FIXED_ON = {"p2p_level_nvl", "p2p_off", "p2p_shm_off", "net_socket"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(REPO / "scenarios" / "pcie-sys-p2p-hang.toml"))
    parser.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "pytest", "suites/", "-q", "-p", "no:cacheprovider",
                   f"--scenario={args.scenario}", f"--reports-dir={reports}", *args.extra]  # fmt: skip
        begun = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
        wall = time.monotonic() - begun
        run = load_run(Path(reports) / "latest")
        hangs = [r for r in run.records if r.verdict == "hang"]
        false = [r.nodeid for r in hangs if r.link != "SYS" or r.env_name in FIXED_ON]
        paid = sum(r.stop_reason == "deadline" for r in run.records)
        confirmed = sum(r.stop_reason == "confirm" for r in run.records)
        print(f"command: {' '.join(command[1:])}  (pytest exit {done.returncode})")
        print(f"cases: {len(run.records)}; wall: {wall:.1f} s ({wall / 60:.2f} min)")
        print(f"hangs: {len(hangs)}; deadlines paid: {paid}; hangs confirmed sooner: {confirmed}")
        print(f"false hangs: {len(false)}" + "".join(f"\n  {n}" for n in false))
        print("recommendation:")
        for line in recommend(run).lines():
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
