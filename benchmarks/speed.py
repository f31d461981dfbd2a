"""How fast the suite answers, measured side by side in one invocation on this machine.

    python benchmarks/speed.py [--old 7814a21] [--growth 2,4,8,16] [--skip-broken] [--suite-only]

Every figure is a real ``pytest suites/`` run with the default settings (no timeout options), in a
temporary reports folder, gloo ranks playing the GPUs of the simulated boxes:

* ``pytest suites/`` exactly as the README's quick start runs it (this machine's defaults), three
  times: the figure the README quotes for the suite;
* healthy 8-GPU boxes (``nvswitch-8gpu.json``, ``pcie-2socket-8gpu.json``): this tree against an
  older commit checked out into a temporary worktree (``--old``: a revision, or the path of a tree),
  run one after the other so both see the same machine load, and the ratio;
* ``-n 2`` against no xdist on the healthy NVSwitch box, for both trees, with the CPU seconds the
  run used and the floor they set on this machine (CPU seconds / cores), the seconds outside any
  case (start-up, collection, the end) and the busiest device's case seconds (cases that share a
  device run in turn, with or without xdist);
* growth: wall time for 2, 4, 8, 16 virtual devices, the exponent of a power-law fit, and the share
  of the wall during which a pair case was running;
* the broken 8-GPU PCIe box (``scenarios/driver-p2p-hang.toml``): wall time, hangs, deadlines paid,
  false hangs (a ``hang`` that is not a cross-socket pair on a rung without the fix) and the
  recommended environment.

Ratios are what to compare on a shared machine; absolute seconds move with its load.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conformance.record.records import CaseRecord
from conformance.record.runs import load_run

REPO = Path(__file__).resolve().parent.parent
TOPOLOGIES = REPO / "scenarios" / "topologies"
HEALTHY = ("nvswitch-8gpu.json", "pcie-2socket-8gpu.json")
BROKEN = REPO / "scenarios" / "driver-p2p-hang.toml"
HUNG_LINKS = {"PIX", "PXB"}  # the classes whose P2P hangs there
FIXED_ON = {"p2p_level_nvl", "p2p_off", "p2p_shm_off", "net_socket"}  # seed d: P2P over PCIe off
PAIR_PROBES = {"pair_exchange", "peer_copy"}


@dataclass
class Timed:
    wall: float
    exit_code: int
    records: list[CaseRecord]
    output: str
    cpu: float  # CPU seconds of pytest and everything it started (ranks included)

    @property
    def cases(self) -> int:
        """Cases run: records less those whose collective ran in another test's case."""
        return len({r.case_dir for r in self.records})

    def _timed_cases(self) -> list[CaseRecord]:
        """One record per case that has a start and an end."""
        by_case = {r.case_dir: r for r in self.records if r.time and r.seconds is not None}
        return list(by_case.values())

    @property
    def outside_cases(self) -> float:
        """Wall seconds before the first case started and after the last one ended (start-up, collection, end)."""
        timed = self._timed_cases()
        if not timed:
            return self.wall
        span = max(r.time for r in timed) - min(r.time - (r.seconds or 0.0) for r in timed)
        return self.wall - span

    @property
    def busiest_device(self) -> float:
        """Case seconds on the busiest device: cases that share a device run in turn, so no overlap beats it."""
        busy: dict[str, float] = {}
        for r in self._timed_cases():
            for device in r.devices:
                busy[device] = busy.get(device, 0.0) + (r.seconds or 0.0)
        return max(busy.values(), default=0.0)


def run_suite(tree: Path, *options: str) -> Timed:
    """``pytest suites/`` of ``tree`` (its own package first on the path), timed."""
    with tempfile.TemporaryDirectory() as reports:
        command = [sys.executable, "-m", "pytest", "suites/", "-q", "-p", "no:cacheprovider",
                   f"--reports-dir={reports}", *options]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cpu_before, begun = children_cpu(), time.monotonic()
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
        wall, cpu = time.monotonic() - begun, children_cpu() - cpu_before
        latest = Path(reports) / "latest"
        records = list(load_run(latest).records) if latest.exists() else []
        if done.returncode not in (0, 1):
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return Timed(wall, done.returncode, records, done.stdout, cpu)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextmanager
def old_tree(old: str) -> Iterator[Path]:
    """The older tree: a path as given, or the revision checked out into a temporary worktree."""
    if Path(old).is_dir():
        yield Path(old)
        return
    with tempfile.TemporaryDirectory() as parent:
        path = Path(parent) / "old"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), old], cwd=REPO, check=True, capture_output=True
        )
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO, check=False)


def pair_share(records: Sequence[CaseRecord], wall: float) -> float:
    """The share of the wall during which at least one pair case was running."""
    spans = sorted(
        (r.time - r.seconds, r.time) for r in records if r.probe in PAIR_PROBES and r.time and r.seconds is not None
    )
    covered, reach = 0.0, -math.inf
    for start, end in spans:
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered / wall if wall else 0.0


def power_fit(points: Sequence[tuple[int, float]]) -> float:
    """The exponent k of wall ~ n^k, by least squares on the logarithms."""
    xs, ys = [math.log(n) for n, _ in points], [math.log(w) for _, w in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def quick_start(runs: int = 3) -> None:
    print(f"## pytest suites/ as the quick start runs it (defaults, {runs} runs one after another)")
    walls = []
    for _ in range(runs):
        timed = run_suite(REPO)
        walls.append(timed.wall)
        summary = timed.output.strip().splitlines()[-1] if timed.output.strip() else "(no output)"
        print(f"  {timed.wall:5.1f} s, exit {timed.exit_code}, load {os.getloadavg()[0]:.1f}: {summary}")
    walls.sort()
    print(f"median {walls[len(walls) // 2]:.1f} s, min {walls[0]:.1f} s, max {walls[-1]:.1f} s")


def healthy(old: Path) -> Timed:
    print("## Healthy 8-GPU boxes, default settings: this tree against the old one (same invocation)")
    print(f"{'topology':28} {'old s':>8} {'new s':>8} {'old/new':>8}   cases old/new   CPU s old/new")
    plain = None
    for name in HEALTHY:
        topology = f"--topology-file={TOPOLOGIES / name}"
        before, after = run_suite(old, topology), run_suite(REPO, topology)
        ratio = before.wall / after.wall
        print(
            f"{name:28} {before.wall:8.1f} {after.wall:8.1f} {ratio:8.2f}x   {before.cases:5d}/{after.cases:<5d}"
            f"     {before.cpu:5.1f}/{after.cpu:.1f}"
        )
        plain = plain or after
    assert plain is not None
    return plain


def xdist(plain: Timed, old: Path) -> None:
    print("\n## -n 2 on the healthy NVSwitch box (same invocation)")
    topology = f"--topology-file={TOPOLOGIES / HEALTHY[0]}"
    parallel = run_suite(REPO, topology, "-n", "2")
    old_plain, old_parallel = run_suite(old, topology), run_suite(old, topology, "-n", "2")
    cores = os.cpu_count() or 1
    print(
        f"{'tree':6} {'no xdist s':>10} {'-n 2 s':>8} {'ratio':>7} {'CPU s (-n 2)':>13} {'CPU floor s':>12}"
        f" {'outside cases s':>16} {'busiest device s':>17}"
    )
    for name, one, two in (("old", old_plain, old_parallel), ("new", plain, parallel)):
        ratio = one.wall / two.wall
        outside = f"{one.outside_cases:.1f}/{two.outside_cases:.1f}"
        busiest = f"{one.busiest_device:.1f}/{two.busiest_device:.1f}"
        print(
            f"{name:6} {one.wall:10.1f} {two.wall:8.1f} {ratio:6.2f}x {two.cpu:13.1f} {two.cpu / cores:12.1f}"
            f" {outside:>16} {busiest:>17}"
        )
    print(f"CPU floor: the run's CPU seconds over this machine's {cores} cores, the least wall any overlap can reach")
    print("outside cases: start-up, collection and the end of the run; busiest device: the case seconds of the")
    print("device most in use (cases sharing a device run in turn); both no xdist / -n 2")


def growth(counts: Sequence[int]) -> None:
    print("\n## Growth with the device count (virtual CPU devices, default settings)")
    print(f"{'devices':>8} {'wall s':>8} {'cases':>6} {'pairs running':>14}")
    points = []
    for n in counts:
        timed = run_suite(REPO, f"--virtual-devices={n}")
        points.append((n, timed.wall))
        print(f"{n:8d} {timed.wall:8.1f} {timed.cases:6d} {pair_share(timed.records, timed.wall):13.0%}")
    print(f"wall ~ n^{power_fit(points):.2f} over {counts[0]}..{counts[-1]} devices")


def broken() -> None:
    print("\n## Broken 8-GPU PCIe box (P2P through its PCIe switches hangs), default settings")
    timed = run_suite(REPO, f"--scenario={BROKEN}")
    hangs = [r for r in timed.records if r.verdict == "hang"]
    false = [r.nodeid for r in hangs if r.link not in HUNG_LINKS or r.env_name in FIXED_ON]
    stops = [r.stop_reason for r in timed.records]
    print(f"wall {timed.wall:.1f} s ({timed.wall / 60:.2f} min); cases {timed.cases}; hangs {len(hangs)}")
    print(
        f"deadlines paid {stops.count('stalled') + stops.count('deadline')}; confirmed sooner {stops.count('confirm')}"
    )
    print(f"false hangs: {len(false)}" + "".join(f"\n  {n}" for n in false))
    lines = timed.output.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if "conformance: the answer" in line), len(lines) - 5)
    end = next((i for i, line in enumerate(lines[start:], start) if line.startswith("=")), len(lines))
    print("\n".join(f"  {line}" for line in lines[start:end]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="7814a21", help="the older tree: a revision or a path (default 7814a21)")
    parser.add_argument("--growth", default="2,4,8,16", help="virtual device counts (default 2,4,8,16)")
    parser.add_argument("--skip-broken", action="store_true", help="leave out the broken-box run")
    parser.add_argument("--suite-only", action="store_true", help="only the quick start's pytest suites/")
    parser.add_argument("--broken-only", action="store_true", help="only the broken-box run")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the start")
    if args.broken_only:
        broken()
        return 0
    quick_start()
    if args.suite_only:
        return 0
    print()
    with old_tree(args.old) as old:
        plain = healthy(old)
        xdist(plain, old)
    growth([int(n) for n in args.growth.split(",")])
    if not args.skip_broken:
        broken()
    print(f"\nload {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
